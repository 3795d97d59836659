"""The local volume provisioner: dynamic PersistentVolumes backed by sparse files on this node.

It plays the part of an external provisioner plus resizer for the StorageClasses below. The
kube-controller-manager's PV binder does the binding; this process only answers claims whose
``volume.kubernetes.io/storage-provisioner`` annotation names it:

* Filesystem claims get a sparse image formatted ext4, attached to a loop device and mounted
  under the state directory; the PV's ``local.path`` is that mount point.
* Block claims get a loop device over a sparse image; ``local.path`` is the device.
* ``dataSource`` naming a bound PVC of ours clones it with a sparse copy. A claim whose data
  source is any other kind (a volume populator's, e.g. CDI's ``VolumeImportSource``) is left
  alone, as the CSI external-provisioner leaves it: its populator fills another claim and
  hands that claim's PV over. On the CSI classes a ``VolumeSnapshot`` data source is ours:
  the claim gets a copy of the snapshot (``testkit.snapshotter``), once it is ready.
* Every volume is local to one node (a PV with required node affinity to it). One process
  serves every node of the cluster (``ProvisionerConfig.nodes``: the process node, or each
  real node): WaitForFirstConsumer claims are made on the node the scheduler selected,
  clones on their source's node, other Immediate claims on the node their class's
  ``allowedTopologies`` admits that holds the fewest volumes (``testkit.volumeplacement``).
* Growing ``spec.resources.requests.storage`` grows file, device and filesystem online.
* A Released PV with reclaim policy Delete loses its backing files, then its object.

The same volumes are also served under a second provisioner name, ``loop.testkit.local``, for
which a ``CSIDriver`` object is registered (classes ``testkit-csi-fs``, ``testkit-csi-fs-wffc``,
``testkit-csi-block``): to CDI those classes are CSI storage, where DataVolumes are filled
through volume populators by default, while the first three are not. Their PVs are CSI
volumes (``spec.csi``: driver ``loop.testkit.local``, the PV name as ``volumeHandle``, the host
path in ``volumeAttributes``, as a driver keeps its volume context there), because the
snapshot-controller snapshots only CSI volumes; the node mounts them as it mounts local PVs
(:func:`volume_path`). For that driver this process is also the CSI snapshotter
(``testkit.snapshotter``, run in the same loop).

The loop is level-triggered and polls (a few list calls a second is nothing for a test API
server); every step re-reads state, so a crash or restart never leaves it confused.
Provisioning runs on a small thread pool (``ProvisionerConfig.parallel``), as the CSI
external-provisioner runs several workers: a burst of claims (issue 11's 200 DataVolumes)
would otherwise bind one mkfs at a time. A volume being made, or made but not yet in a
listing, is never started twice; attaching loop devices stays serial (``losetup --find``
picks the free device and attaches it in two steps).
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.utils import parse_quantity

from testkit import storage
from testkit.kubeclient import JSON, ApiError, Kube, ns_path
from testkit.snapshotter import GROUP as SNAPSHOT_GROUP
from testkit.snapshotter import Snapshotter
from testkit.volumeplacement import PlacementRefused, choose_node, node_affinity, pv_node

log = logging.getLogger("testkit.provisioner")

PROVISIONER = "testkit.local/loop"
CSI_PROVISIONER = "loop.testkit.local"  # a CSIDriver name must be a DNS subdomain
PROVISIONERS = (PROVISIONER, CSI_PROVISIONER)
ANN_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_PROVISIONER_BETA = "volume.beta.kubernetes.io/storage-provisioner"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_IMAGE = "testkit.local/image"
ATTR_PATH = "testkit.local/path"  # in a CSI PV's volumeAttributes: mount point or device

FS_IMMEDIATE = "testkit-fs"
FS_WFFC = "testkit-fs-wffc"
BLOCK = "testkit-block"
CSI_FS = "testkit-csi-fs"
CSI_FS_WFFC = "testkit-csi-fs-wffc"
CSI_BLOCK = "testkit-csi-block"


def storage_classes() -> list[JSON]:
    """The classes this provisioner serves; ``testkit-fs`` is the cluster default."""

    def sc(name: str, mode: str, default: bool = False, provisioner: str = PROVISIONER) -> JSON:
        ann = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
        return {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name, "annotations": ann},
            "provisioner": provisioner,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": mode,
            "allowVolumeExpansion": True,
        }

    return [
        sc(FS_IMMEDIATE, "Immediate", default=True),
        sc(FS_WFFC, "WaitForFirstConsumer"),
        sc(BLOCK, "Immediate"),
        sc(CSI_FS, "Immediate", provisioner=CSI_PROVISIONER),
        sc(CSI_FS_WFFC, "WaitForFirstConsumer", provisioner=CSI_PROVISIONER),
        sc(CSI_BLOCK, "Immediate", provisioner=CSI_PROVISIONER),
    ]


def volume_path(pv: JSON) -> str | None:
    """Where a PV's data is on this node: a local PV's path, a hostPath, or for one of our CSI
    volumes the mount point (filesystem) or loop device (block) in its volume attributes."""
    spec = pv["spec"]
    if "local" in spec or "hostPath" in spec:
        return str((spec.get("local") or spec.get("hostPath"))["path"])
    csi = spec.get("csi") or {}
    if csi.get("driver") == CSI_PROVISIONER:
        path = (csi.get("volumeAttributes") or {}).get(ATTR_PATH)
        return str(path) if path else None
    return None


def csi_driver() -> JSON:
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSIDriver",
        "metadata": {"name": CSI_PROVISIONER},
        "spec": {"attachRequired": False, "podInfoOnMount": False},
    }


@dataclass(frozen=True)
class ProvisionerConfig:
    state_dir: Path
    nodes: tuple[str, ...]  # the nodes whose volumes this process makes, in placement order
    poll_interval: float = 0.3
    parallel: int = 4  # volumes provisioned at once


class Provisioner:
    def __init__(self, kube: Kube, config: ProvisionerConfig) -> None:
        self.kube = kube
        self.config = config
        self.volumes = config.state_dir / "volumes"
        self.volumes.mkdir(parents=True, exist_ok=True)
        self.snapshotter = Snapshotter(
            kube, self.volumes, config.state_dir / "snapshots", CSI_PROVISIONER
        )
        self._pool = ThreadPoolExecutor(config.parallel, thread_name_prefix="provision")
        self._lock = threading.Lock()
        self._loop_lock = threading.Lock()
        # PV names being provisioned, or provisioned and not yet seen in a PV listing (a
        # listing taken before the PV was created must not start the volume again), with the
        # node each goes to (placement counts them).
        self._started: dict[str, str] = {}

    # -- set-up ---------------------------------------------------------------------------
    def ensure_storage_classes(self) -> None:
        objects = [("storageclasses", sc) for sc in storage_classes()]
        for plural, obj in [*objects, ("csidrivers", csi_driver())]:
            try:
                self.kube.create(f"/apis/storage.k8s.io/v1/{plural}", obj)
            except ApiError as e:
                if not e.conflict:
                    raise
        self.snapshotter.ensure_class()

    # -- loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.ensure_storage_classes()
        try:
            while not stop.is_set():
                for sync in (self.sync_once, self.snapshotter.sync_once):
                    try:
                        sync()
                    except Exception:
                        log.exception("sync failed; retrying")
                stop.wait(self.config.poll_interval)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def sync_once(self) -> None:
        classes = {
            sc["metadata"]["name"]: sc
            for sc in self.kube.get("/apis/storage.k8s.io/v1/storageclasses")["items"]
            if sc.get("provisioner") in PROVISIONERS
        }
        pvs = {
            pv["metadata"]["name"]: pv for pv in self.kube.get("/api/v1/persistentvolumes")["items"]
        }
        with self._lock:
            for listed in self._started.keys() & pvs.keys():  # listed now: the PV guards it
                del self._started[listed]
        labels: dict[str, dict[str, str]] | None = None  # the nodes' labels, read when needed
        for pvc in self.kube.get("/api/v1/persistentvolumeclaims")["items"]:
            cls = classes.get(pvc["spec"].get("storageClassName") or "")
            if cls is None:
                continue
            try:
                if self._wants_volume(pvc, cls) and _pv_name(pvc) not in pvs:
                    with self._lock:
                        started = _pv_name(pvc) in self._started
                    if started:
                        continue
                    if labels is None:
                        labels = self._node_labels()
                    self._start(pvc, cls, self._place(pvc, cls, pvs, labels))
                elif pvc.get("status", {}).get("phase") == "Bound":
                    self._maybe_expand(pvc, pvs.get(pvc["spec"].get("volumeName", "")))
            except (ApiError, storage.StorageError, PlacementRefused) as e:
                log.warning(
                    "claim %s/%s: %s", pvc["metadata"]["namespace"], pvc["metadata"]["name"], e
                )
        for pv in pvs.values():
            if _ours(pv) and _released_for_delete(pv):
                try:
                    self.delete_volume(pv)
                except (ApiError, storage.StorageError) as e:
                    log.warning("volume %s: %s", pv["metadata"]["name"], e)

    def _wants_volume(self, pvc: JSON, cls: JSON) -> bool:
        ann = pvc["metadata"].get("annotations") or {}
        if cls.get("provisioner") not in (ann.get(ANN_PROVISIONER), ann.get(ANN_PROVISIONER_BETA)):
            return False
        if pvc["spec"].get("volumeName") or pvc.get("status", {}).get("phase") != "Pending":
            return False
        if not _own_data_source(pvc, cls):
            return False
        if cls.get("volumeBindingMode") == "WaitForFirstConsumer":
            return ann.get(ANN_SELECTED_NODE) in self.config.nodes
        return True

    # -- placement ------------------------------------------------------------------------
    def _node_labels(self) -> dict[str, dict[str, str]]:
        """The labels of the registered nodes among ours (allowedTopologies match them)."""
        return {
            n["metadata"]["name"]: dict(n["metadata"].get("labels") or {})
            for n in self.kube.get("/api/v1/nodes")["items"]
            if n["metadata"]["name"] in self.config.nodes
        }

    def _place(
        self, pvc: JSON, cls: JSON, pvs: dict[str, JSON], labels: dict[str, dict[str, str]]
    ) -> str:
        """The node for this claim's volume (``testkit.volumeplacement``)."""
        src = pvc["spec"].get("dataSourceRef") or pvc["spec"].get("dataSource") or {}
        source_node = None
        if src.get("kind") == "PersistentVolumeClaim":
            source_node = pv_node(self._clone_source(pvc, src))
        with self._lock:
            in_flight = list(self._started.values())
        return choose_node(
            wffc=cls.get("volumeBindingMode") == "WaitForFirstConsumer",
            selected=(pvc["metadata"].get("annotations") or {}).get(ANN_SELECTED_NODE),
            source_node=source_node,
            cls=cls,
            nodes=self.config.nodes,
            labels=labels,
            volumes_on=[*(pv_node(pv) for pv in pvs.values() if _ours(pv)), *in_flight],
        )

    # -- provisioning ---------------------------------------------------------------------
    def _start(self, pvc: JSON, cls: JSON, node: str) -> None:
        """Provision on ``node``, on the pool, unless this volume is already started."""
        name = _pv_name(pvc)
        with self._lock:
            if name in self._started:
                return
            self._started[name] = node
        self._pool.submit(self._provision_logged, pvc, cls, node)

    def _provision_logged(self, pvc: JSON, cls: JSON, node: str) -> None:
        try:
            self.provision(pvc, cls, node)
        except Exception as e:  # retried by a later poll
            with self._lock:
                self._started.pop(_pv_name(pvc), None)
            ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
            log.warning("claim %s/%s: %s", ns, name, e)

    def provision(self, pvc: JSON, cls: JSON, node: str) -> None:
        name = _pv_name(pvc)
        size = int(parse_quantity(pvc["spec"]["resources"]["requests"]["storage"]))
        block = pvc["spec"].get("volumeMode") == "Block"
        image = self.volumes / f"{name}.img"
        self._discard(name)
        if self._fill_from_source(pvc, image):
            if image.stat().st_size < size:
                storage.grow(image, size, None)
            if not block:
                storage.resize_ext4_offline(str(image))
        else:
            storage.create_sparse(image, size)
            if not block:
                storage.make_ext4(image)
        with self._loop_lock:
            device = storage.attach_loop(image)
        if block:
            path = device
        else:
            mnt = self.volumes / name
            storage.mount(device, mnt)
            path = str(mnt)
        pv = self._pv_object(pvc, cls, name, path, image, node)
        try:
            self.kube.create("/api/v1/persistentvolumes", pv)
        except ApiError:
            self._discard(name)
            raise
        log.info(
            "provisioned %s for %s/%s at %s on %s",
            name,
            pvc["metadata"]["namespace"],
            pvc["metadata"]["name"],
            path,
            node,
        )

    def _fill_from_source(self, pvc: JSON, image: Path) -> bool:
        """Copy the claim's data source (a PVC or a VolumeSnapshot) to ``image``; False when it
        has none."""
        src = pvc["spec"].get("dataSourceRef") or pvc["spec"].get("dataSource")
        if not src:
            return False
        if src.get("kind") == "VolumeSnapshot":
            self.snapshotter.restore(pvc, src["name"], image)
            return True
        source = self._clone_source(pvc, src)
        mounted = source["spec"].get("volumeMode") != "Block"
        path = Path(volume_path(source) or "")
        src_image = Path(source["metadata"]["annotations"][ANN_IMAGE])
        storage.copy_consistent(src_image, image, path if mounted else None)
        return True

    def _clone_source(self, pvc: JSON, src: JSON) -> JSON:
        ns = pvc["metadata"]["namespace"]
        source_pvc = self.kube.get(ns_path(ns, "persistentvolumeclaims", src["name"]))
        pv_name = source_pvc["spec"].get("volumeName")
        if not pv_name:
            raise storage.StorageError(f"clone source {ns}/{src['name']} is not bound yet")
        pv = self.kube.get(f"/api/v1/persistentvolumes/{pv_name}")
        if not _ours(pv):
            raise storage.StorageError(f"clone source {pv_name} is not a testkit volume")
        return pv

    def _pv_object(
        self, pvc: JSON, cls: JSON, name: str, path: str, image: Path, node: str
    ) -> JSON:
        meta = pvc["metadata"]
        return {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": name,
                "annotations": {ANN_PROVISIONED_BY: cls["provisioner"], ANN_IMAGE: str(image)},
            },
            "spec": {
                "capacity": {"storage": pvc["spec"]["resources"]["requests"]["storage"]},
                "accessModes": pvc["spec"].get("accessModes") or ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": cls.get("reclaimPolicy", "Delete"),
                "storageClassName": cls["metadata"]["name"],
                "volumeMode": pvc["spec"].get("volumeMode") or "Filesystem",
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": meta["namespace"],
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
                **_volume_source(cls, name, path, pvc["spec"].get("volumeMode") == "Block"),
                "nodeAffinity": node_affinity(node),
            },
        }

    # -- expansion ------------------------------------------------------------------------
    def _maybe_expand(self, pvc: JSON, pv: JSON | None) -> None:
        if pv is None or not _ours(pv):
            return
        want = int(parse_quantity(pvc["spec"]["resources"]["requests"]["storage"]))
        have = int(parse_quantity(pv["spec"]["capacity"]["storage"]))
        if want <= have:
            return
        image = Path(pv["metadata"]["annotations"][ANN_IMAGE])
        devices = storage.loop_devices_of(image)
        device = devices[0] if devices else None
        if pv["spec"].get("volumeMode") == "Block" or device is None:
            storage.grow(image, want, device)
        elif not self._grow_filesystem(pvc, image, device, want):
            return  # in use and no online resize here: retried once the pods are gone
        new = pvc["spec"]["resources"]["requests"]["storage"]
        self.kube.patch(
            f"/api/v1/persistentvolumes/{pv['metadata']['name']}",
            {"spec": {"capacity": {"storage": new}}},
        )
        ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
        self.kube.patch(
            ns_path(ns, "persistentvolumeclaims", name, "status"),
            {
                "status": {
                    "capacity": {"storage": new},
                    "conditions": None,
                    "allocatedResourceStatuses": None,
                }
            },
        )
        log.info("expanded %s to %s", pv["metadata"]["name"], new)

    def _grow_filesystem(self, pvc: JSON, image: Path, device: str, size: int) -> bool:
        storage.grow(image, size, device)
        if storage.resize_ext4_online(device):
            return True
        if self._claim_in_use(pvc):
            return False
        mnt = self.volumes / image.stem
        storage.unmount(mnt)
        try:
            storage.resize_ext4_offline(device)
        finally:
            storage.mount(device, mnt)
        return True

    def _claim_in_use(self, pvc: JSON) -> bool:
        ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
        for pod in self.kube.get(ns_path(ns, "pods"))["items"]:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            for vol in pod["spec"].get("volumes") or []:
                if (vol.get("persistentVolumeClaim") or {}).get("claimName") == name:
                    return True
        return False

    # -- deletion -------------------------------------------------------------------------
    def delete_volume(self, pv: JSON) -> None:
        name = pv["metadata"]["name"]
        self._discard(name)
        self.kube.delete_ignore_missing(f"/api/v1/persistentvolumes/{name}")
        log.info("deleted %s and its backing files", name)

    def _discard(self, name: str) -> None:
        """Remove every trace of volume ``name``: mount, loop devices, image file."""
        mnt = self.volumes / name
        image = self.volumes / f"{name}.img"
        for point in storage.mountpoints_under(mnt):
            storage.unmount(Path(point))
        if image.exists():
            for dev in storage.loop_devices_of(image):
                storage.detach_loop(dev)
            image.unlink()
        if mnt.exists():
            mnt.rmdir()


def _own_data_source(pvc: JSON, cls: JSON) -> bool:
    """No data source, or one this provisioner fills itself: a PVC of the core group, or on
    the CSI classes a VolumeSnapshot."""
    src = pvc["spec"].get("dataSourceRef") or pvc["spec"].get("dataSource")
    if not src:
        return True
    if src.get("kind") == "VolumeSnapshot" and src.get("apiGroup") == SNAPSHOT_GROUP:
        return bool(cls.get("provisioner") == CSI_PROVISIONER)
    return not src.get("apiGroup") and src.get("kind") == "PersistentVolumeClaim"


def _volume_source(cls: JSON, name: str, path: str, block: bool) -> JSON:
    """``local`` for the plain classes; ``csi`` (volume handle = PV name) for the CSI ones."""
    if cls.get("provisioner") != CSI_PROVISIONER:
        return {"local": {"path": path}}
    csi: JSON = {"driver": CSI_PROVISIONER, "volumeHandle": name}
    csi["volumeAttributes"] = {ATTR_PATH: path}
    if not block:
        csi["fsType"] = "ext4"
    return {"csi": csi}


def _pv_name(pvc: JSON) -> str:
    return f"pvc-{pvc['metadata']['uid']}"


def _ours(pv: JSON) -> bool:
    return (pv["metadata"].get("annotations") or {}).get(ANN_PROVISIONED_BY) in PROVISIONERS


def _released_for_delete(pv: JSON) -> bool:
    phase = pv.get("status", {}).get("phase")
    return phase in ("Released", "Failed") and (
        pv["spec"].get("persistentVolumeReclaimPolicy") == "Delete"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument(
        "--node-name",
        action="append",
        required=True,
        help="a node whose volumes this process makes (repeat for each node, in order)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    prov = Provisioner(
        Kube.from_kubeconfig(args.kubeconfig),
        ProvisionerConfig(args.state_dir, tuple(args.node_name)),
    )
    prov.run(stop)


if __name__ == "__main__":
    main()
