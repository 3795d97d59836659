"""What is known about well-known provisioners: access/volume modes, clone strategy, minimum size.

A StorageProfile's ``status.claimPropertySets`` is what ``spec.storage`` claims are completed
from, so for a class nobody configured the controller needs a default. CDI keeps a table keyed by
provisioner (``pkg/storagecapabilities``); this is the same idea and the same facts, written as
data: ``KNOWN`` maps a *provisioner key* to its claim property sets, preferred first.

A key is usually the provisioner name. Some drivers serve very different storage depending on
class parameters (NFS or block, AWS volume type), so a small table of key functions refines the
key from the StorageClass first, as CDI does; a key that cannot be worked out is ``UNKNOWN``.

The local provisioner this project ships for its own cluster (``testkit.local/loop``) is here
too: every class it serves gives ReadWriteOnce Filesystem or Block volumes, one node only; the
mode a class prefers is in its name (``*-block`` prefers Block), as the provisioner has no
parameters to say it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import AccessMode, VolumeMode

UNKNOWN = "UNKNOWN"
LOCAL_PROVISIONER = "testkit.local/loop"
LOCAL_CSI_PROVISIONER = "loop.testkit.local"  # the same volumes, registered as a CSIDriver


@dataclass(frozen=True)
class Capability:
    access_mode: AccessMode
    volume_mode: VolumeMode

    def to_dict(self) -> dict[str, Any]:
        return {"accessModes": [str(self.access_mode)], "volumeMode": str(self.volume_mode)}


RWO, ROX, RWX = AccessMode.READ_WRITE_ONCE, AccessMode.READ_ONLY_MANY, AccessMode.READ_WRITE_MANY
BLOCK, FILE = VolumeMode.BLOCK, VolumeMode.FILESYSTEM


def caps(*pairs: tuple[AccessMode, VolumeMode]) -> tuple[Capability, ...]:
    return tuple(Capability(a, v) for a, v in pairs)


RWO_FILE = caps((RWO, FILE))
RWX_FILE = caps((RWX, FILE))
RWO_BLOCK = caps((RWO, BLOCK))
SHARED_FILE = caps((RWX, FILE), (RWO, FILE))
SAN = caps((RWX, BLOCK), (RWO, BLOCK), (RWO, FILE))
ALL = caps((RWX, BLOCK), (RWX, FILE), (RWO, BLOCK), (RWO, FILE))
ALL_BUT_RWX_FILE = caps((RWX, BLOCK), (RWO, BLOCK), (RWO, FILE))
RBD = caps((RWX, BLOCK), (RWO, BLOCK), (RWO, FILE))
RWO_BLOCK_AND_FILE = caps((RWO, BLOCK), (RWO, FILE))
ALL_FS = caps((RWX, FILE), (RWO, FILE))

KNOWN: Mapping[str, tuple[Capability, ...]] = {
    LOCAL_PROVISIONER: caps((RWO, FILE), (RWO, BLOCK)),
    f"{LOCAL_PROVISIONER}/block": caps((RWO, BLOCK), (RWO, FILE)),
    # hostpath-provisioner, minikube, nfs
    "kubevirt.io.hostpath-provisioner": RWO_FILE,
    "kubevirt.io.hostpath-provisioner/overlay": RWX_FILE,
    "kubevirt.io/hostpath-provisioner": RWO_FILE,
    "k8s.io/minikube-hostpath": RWO_FILE,
    "rancher.io/local-path": RWO_FILE,
    "nfs.csi.k8s.io": RWX_FILE,
    "k8s-sigs.io/nfs-subdir-external-provisioner": RWX_FILE,
    # Ceph
    "kubernetes.io/rbd": RBD,
    "rbd.csi.ceph.com": RBD,
    "rook-ceph.rbd.csi.ceph.com": RBD,
    "openshift-storage.rbd.csi.ceph.com": RBD,
    "cephfs.csi.ceph.com": ALL_FS,
    "rook-ceph.cephfs.csi.ceph.com": ALL_FS,
    "openshift-storage.cephfs.csi.ceph.com": ALL_FS,
    # vendors
    "linstor.csi.linbit.com": ALL_BUT_RWX_FILE,
    "csi-unity.dellemc.com": ALL_BUT_RWX_FILE,
    "csi-unity.dellemc.com/nfs": ALL_FS,
    "csi-isilon.dellemc.com": ALL_FS,
    "csi-powerstore.dellemc.com/nfs": ALL_FS,
    "csi-powermax.dellemc.com/nfs": ALL_FS,
    "csi-vxflexos.dellemc.com/nfs": ALL_FS,
    "kubernetes.io/storageos": RWO_FILE,
    "storageos": RWO_FILE,
    "hspc.csi.hitachi.com": SAN,
    "csi.hpe.com": SAN,
    "spectrumscale.csi.ibm.com": ALL_FS,
    "block.csi.ibm.com": SAN,
    "vpc.block.csi.ibm.io": RWO_BLOCK_AND_FILE,
    "kubernetes.io/portworx-volume": ALL,
    "pxd.portworx.com": ALL,
    "pxd.portworx.com/nfs": ALL_FS,
    "csi.trident.netapp.io/ontap-nas": ALL_FS,
    "csi.trident.netapp.io/ontap-san": caps((RWX, BLOCK)),
    "topolvm.cybozu.com": caps((RWO, BLOCK), (RWO, FILE)),
    "topolvm.io": caps((RWO, BLOCK), (RWO, FILE)),
    "cinder.csi.openstack.org": RWO_BLOCK_AND_FILE,
    "manila.csi.openstack.org": RWX_FILE,
    "csi.ovirt.org": RWO_BLOCK_AND_FILE,
    "csi.vsphere.vmware.com": RWO_BLOCK_AND_FILE,
    "csi.vsphere.vmware.com/nfs": caps((RWX, FILE), (RWO, BLOCK), (RWO, FILE)),
    "csi.huawei.com": ALL_BUT_RWX_FILE,
    "csi.huawei.com/nfs": ALL_FS,
    "kubesan.gitlab.io": caps((RWX, BLOCK), (ROX, BLOCK), (RWO, BLOCK), (RWO, FILE)),
    "driver.longhorn.io": RWO_BLOCK,
    "driver.longhorn.io/migratable": caps((RWX, BLOCK), (RWO, BLOCK)),
    "driver.longhorn.io/nfs": ALL_FS,
    "driver.longhorn.io/fs": RWO_FILE,
    "blockvolume.csi.oraclecloud.com": SAN,
    "directpv-min-io": RWO_FILE,
    # public clouds
    "kubernetes.io/aws-ebs": RWO_BLOCK,
    "ebs.csi.aws.com": RWO_BLOCK,
    "ebs.csi.aws.com/io1": RWO_BLOCK,
    "ebs.csi.aws.com/io2": SAN,
    "ebs.csi.aws.com/gp": RWO_BLOCK,
    "efs.csi.aws.com": ALL_FS,
    "kubernetes.io/azure-disk": RWO_BLOCK,
    "disk.csi.azure.com": RWO_BLOCK,
    "kubernetes.io/azure-file": RWX_FILE,
    "file.csi.azure.com": RWX_FILE,
    "kubernetes.io/gce-pd": RWO_BLOCK_AND_FILE,
    "pd.csi.storage.gke.io": RWO_BLOCK_AND_FILE,
    "pd.csi.storage.gke.io/hyperdisk": SAN,
}

CSI_CLONE, SNAPSHOT, COPY = "csi-clone", "snapshot", "copy"
CLONE_STRATEGY: Mapping[str, str] = {
    "rbd.csi.ceph.com": CSI_CLONE,
    "rook-ceph.rbd.csi.ceph.com": CSI_CLONE,
    "openshift-storage.rbd.csi.ceph.com": CSI_CLONE,
    "cephfs.csi.ceph.com": CSI_CLONE,
    "rook-ceph.cephfs.csi.ceph.com": CSI_CLONE,
    "openshift-storage.cephfs.csi.ceph.com": CSI_CLONE,
    "csi-isilon.dellemc.com": CSI_CLONE,
    "hspc.csi.hitachi.com": CSI_CLONE,
    "csi.hpe.com": CSI_CLONE,
    "spectrumscale.csi.ibm.com": CSI_CLONE,
    "block.csi.ibm.com": CSI_CLONE,
    "pxd.portworx.com": CSI_CLONE,
    "kubesan.gitlab.io": CSI_CLONE,
    "blockvolume.csi.oraclecloud.com": CSI_CLONE,
    "vpc.block.csi.ibm.io": COPY,
    "topolvm.cybozu.com": COPY,
    "topolvm.io": COPY,
    "csi.trident.netapp.io/ontap-nas": SNAPSHOT,
    "csi.trident.netapp.io/ontap-san": SNAPSHOT,
    "pd.csi.storage.gke.io": SNAPSHOT,
    "pd.csi.storage.gke.io/hyperdisk": SNAPSHOT,
}

MINIMUM_PVC_SIZE: Mapping[str, str] = {
    "pd.csi.storage.gke.io/hyperdisk": "4Gi",
    "ebs.csi.aws.com/io1": "4Gi",
    "ebs.csi.aws.com/io2": "4Gi",
    "ebs.csi.aws.com/gp": "1Gi",
    "hspc.csi.hitachi.com": "1Gi",
}

SC = Mapping[str, Any]


def _params(sc: SC) -> Mapping[str, str]:
    return sc.get("parameters") or {}


def _nfs_by(param: str) -> Callable[[SC], str]:
    def key(sc: SC) -> str:
        base = str(sc.get("provisioner"))
        return f"{base}/nfs" if "nfs" in _params(sc).get(param, "").lower() else base

    return key


def _local(sc: SC) -> str:
    name = str((sc.get("metadata") or {}).get("name", ""))
    return f"{LOCAL_PROVISIONER}/block" if name.endswith("-block") else LOCAL_PROVISIONER


def _trident(sc: SC) -> str:
    backend = _params(sc).get("backendType", "")
    for kind in ("ontap-nas", "ontap-san"):
        if backend.startswith(kind):
            return f"csi.trident.netapp.io/{kind}"
    return UNKNOWN


def _ebs(sc: SC) -> str:
    kind = _params(sc).get("type", "")
    suffix = {"io1": "/io1", "io2": "/io2", "gp2": "/gp", "gp3": "/gp"}.get(kind, "")
    return "ebs.csi.aws.com" + suffix


def _gke(sc: SC) -> str:
    hyper = _params(sc).get("type", "").startswith("hyperdisk-balanced")
    return "pd.csi.storage.gke.io" + ("/hyperdisk" if hyper else "")


def _longhorn(sc: SC) -> str:
    p = _params(sc)
    if p.get("migratable") == "true":
        return "driver.longhorn.io/migratable"
    if p.get("nfsOptions"):
        return "driver.longhorn.io/nfs"
    return "driver.longhorn.io/fs" if p.get("fsType") else "driver.longhorn.io"


def _hostpath(sc: SC) -> str:
    overlay = "overlayCSI" in _params(sc)
    return "kubevirt.io.hostpath-provisioner" + ("/overlay" if overlay else "")


KEY_FUNCTIONS: Mapping[str, Callable[[SC], str]] = {
    LOCAL_PROVISIONER: _local,
    LOCAL_CSI_PROVISIONER: _local,
    "kubevirt.io.hostpath-provisioner": _hostpath,
    "csi.trident.netapp.io": _trident,
    "ebs.csi.aws.com": _ebs,
    "pd.csi.storage.gke.io": _gke,
    "driver.longhorn.io": _longhorn,
    "csi-unity.dellemc.com": _nfs_by("protocol"),
    "csi.huawei.com": _nfs_by("protocol"),
    "csi-powerstore.dellemc.com": _nfs_by("csi.storage.k8s.io/fstype"),
    "csi-powermax.dellemc.com": _nfs_by("csi.storage.k8s.io/fstype"),
    "csi-vxflexos.dellemc.com": _nfs_by("csi.storage.k8s.io/fstype"),
    "csi.vsphere.vmware.com": _nfs_by("csi.storage.k8s.io/fstype"),
    "pxd.portworx.com": _nfs_by("sharedv4_mount_options"),
}


def provisioner_key(sc: SC) -> str:
    provisioner = str(sc.get("provisioner") or "")
    refine = KEY_FUNCTIONS.get(provisioner)
    return refine(sc) if refine else provisioner


def capabilities(sc: SC) -> tuple[Capability, ...] | None:
    """The claim property sets known for this class, or None when nothing is known."""
    return KNOWN.get(provisioner_key(sc))


def clone_strategy(sc: SC) -> str | None:
    return CLONE_STRATEGY.get(provisioner_key(sc))


def minimum_pvc_size(sc: SC) -> str | None:
    return MINIMUM_PVC_SIZE.get(provisioner_key(sc))
