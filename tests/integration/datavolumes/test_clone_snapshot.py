"""Snapshot clones on the real control plane with the product installed and the cluster's CSI
snapshot support (snapshot CRDs, the upstream snapshot-controller, the local provisioner as
snapshotter of ``loop.testkit.local`` volumes, VolumeSnapshotClass ``testkit-csi-snapclass``).

The classes ``snap-fs`` / ``snap-block`` are the CSI provisioner's, with StorageProfiles set
to ``cloneStrategy: snapshot``: a clone into them snapshots its source and restores the
snapshot (CDI's smart clone), in the source's namespace and across namespaces, filesystem and
block, into a bigger target that is then expanded; the content is the imported image, the
target as sparse as its source, the temporary snapshot and claim gone. DataVolumes restore a
VolumeSnapshot named in ``source.snapshot`` or by a DataSource, and one whose snapshot cannot
be restored into the target's class is copied from a temporary restore (CDI's fallback). A
``snapshot`` profile on a class no VolumeSnapshotClass serves falls back to host-assisted copy
with ``NoVolumeSnapshotClass``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdi.api.quantity import Quantity
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    ImageServer,
    datavolume,
    dv_path,
    event_reasons,
    events_for,
    pv_of,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.test_clone_csi import allocated, data_of, succeeded

pytestmark = pytest.mark.integration

SNAP_CLASS = {"Filesystem": "snap-fs", "Block": "snap-block"}
NO_SNAPSHOTTER = "nosnap-fs"  # the non-CSI provisioner's: no VolumeSnapshotClass for it
PROFILES = "/apis/cdi.kubevirt.io/v1beta1/storageprofiles"
SNAPSHOTS = "/apis/snapshot.storage.k8s.io/v1"
VSC = "testkit-csi-snapclass"


def ensure_class(kube: Kube, name: str, provisioner: str, strategy: str) -> None:
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
          "metadata": {"name": name}, "provisioner": provisioner, "reclaimPolicy": "Delete",
          "volumeBindingMode": "Immediate", "allowVolumeExpansion": True}  # fmt: skip
    try:
        kube.create("/apis/storage.k8s.io/v1/storageclasses", sc)
    except ApiError as e:
        if not e.conflict:
            raise
    wait_until(lambda: kube.get_or_none(f"{PROFILES}/{name}"), f"profile {name}", 60)
    kube.patch(f"{PROFILES}/{name}", {"spec": {"cloneStrategy": strategy}})
    wait_until(
        lambda: (
            (kube.get(f"{PROFILES}/{name}").get("status") or {}).get("cloneStrategy") == strategy
        ),
        f"profile {name} says {strategy}",
        60,
    )


@pytest.fixture
def snapshot_classes(kube: Kube, controller: Any) -> Iterator[None]:
    wait_until(lambda: kube.get_or_none(f"{SNAPSHOTS}/volumesnapshotclasses/{VSC}"), VSC, 60)
    for name in SNAP_CLASS.values():
        ensure_class(kube, name, "loop.testkit.local", "snapshot")
    ensure_class(kube, NO_SNAPSHOTTER, "testkit.local/loop", "snapshot")
    yield


def import_golden(kube: Kube, server: ImageServer, ns: str, mode: str) -> None:
    source = {"http": {"url": server.url("ok", "disk.qcow2")}}
    kube.create(dv_path(ns), datavolume("golden", source, "64Mi", SNAP_CLASS[mode], mode))
    succeeded(kube, ns, "golden")


def clone_dv(name: str, source: dict, cls: str, mode: str, size: str | None = None) -> dict:
    storage: dict[str, Any] = {"storageClassName": cls, "volumeMode": mode}
    if size:
        storage["resources"] = {"requests": {"storage": size}}
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name}, "spec": {"source": source, "storage": storage}}  # fmt: skip


def reasons(kube: Kube, ns: str, name: str) -> set[str]:
    return {e["reason"] for e in events_for(kube, ns, name)}


def assert_restored(kube: Kube, images: Images, src: tuple[str, str], dst: tuple[str, str]) -> None:
    same_prefix_then_zeros(data_of(kube, *dst), images.reference)
    assert allocated(kube, *dst) <= 1.01 * allocated(kube, *src), (src, dst)
    ann = kube.get(ns_path(dst[0], "persistentvolumeclaims", dst[1]))["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/cloneType"] == "snapshot"
    assert "cdi.kubevirt.io/cloneFallbackReason" not in ann


def capacity(kube: Kube, ns: str, claim: str) -> int:
    pvc = kube.get(ns_path(ns, "persistentvolumeclaims", claim))
    return Quantity.parse(pvc["status"]["capacity"]["storage"]).value()


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_smart_clone_in_the_same_namespace_and_across_namespaces(
    kube: Kube, namespace: str, other_namespace: str, snapshot_classes: None,
    image_server: ImageServer, images: Images, mode: str,
) -> None:  # fmt: skip
    import_golden(kube, image_server, namespace, mode)
    pvc = {"pvc": {"namespace": namespace, "name": "golden"}}
    kube.create(dv_path(namespace), clone_dv("near", pvc, SNAP_CLASS[mode], mode, "96Mi"))
    far = kube.create(dv_path(other_namespace), clone_dv("far", pvc, SNAP_CLASS[mode], mode))
    near = succeeded(kube, namespace, "near")
    succeeded(kube, other_namespace, "far")
    assert_restored(kube, images, (namespace, "golden"), (namespace, "near"))
    assert_restored(kube, images, (namespace, "golden"), (other_namespace, "far"))
    assert capacity(kube, namespace, "near") >= 96 * 2**20  # restored at 64Mi, then expanded
    for ns, name in ((namespace, "near"), (other_namespace, "far")):
        seen = reasons(kube, ns, name)
        for reason in ("SnapshotForSmartCloneInProgress", "CloneFromSnapshotSourceInProgress",
                       "CloneSucceeded"):  # fmt: skip
            assert reason in seen, (name, seen)
    event_reasons(kube, namespace, "near", {"VolumeSnapshotClassSelected"})
    for uid in (near["metadata"]["uid"], far["metadata"]["uid"]):
        snap = f"{SNAPSHOTS}/namespaces/{namespace}/volumesnapshots/tmp-snapshot-{uid}"
        wait_until(lambda s=snap: kube.get_or_none(s) is None, "temporary snapshot gone", 30)
        assert (
            kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", f"tmp-pvc-{uid}")) is None
        )
    moved = pv_of(kube, other_namespace, "far")
    assert moved["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    same_prefix_then_zeros(data_of(kube, namespace, "golden"), images.reference)  # intact


def take_snapshot(kube: Kube, ns: str, name: str, claim: str) -> None:
    spec = {"source": {"persistentVolumeClaimName": claim}, "volumeSnapshotClassName": VSC}
    body = {"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip
    kube.create(f"{SNAPSHOTS}/namespaces/{ns}/volumesnapshots", body)
    wait_until(
        lambda: (kube.get(f"{SNAPSHOTS}/namespaces/{ns}/volumesnapshots/{name}").get("status")
                 or {}).get("readyToUse"),
        f"snapshot {name} ready", 60,
    )  # fmt: skip


def test_datavolumes_restore_a_snapshot_directly_and_through_a_datasource(
    kube: Kube, namespace: str, other_namespace: str, snapshot_classes: None,
    image_server: ImageServer, images: Images,
) -> None:  # fmt: skip
    import_golden(kube, image_server, namespace, "Filesystem")
    take_snapshot(kube, namespace, "golden-snap", "golden")
    kube.create(f"{DV_API}/namespaces/{namespace}/datasources", {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "golden-ds"},
        "spec": {"source": {"snapshot": {"namespace": namespace, "name": "golden-snap"}}},
    })  # fmt: skip
    snap_source = {"snapshot": {"namespace": namespace, "name": "golden-snap"}}
    kube.create(dv_path(namespace), clone_dv("direct", snap_source, "snap-fs", "Filesystem"))
    via = clone_dv("via-ds", {}, "snap-fs", "Filesystem")
    del via["spec"]["source"]
    via["spec"]["sourceRef"] = {"kind": "DataSource", "namespace": namespace, "name": "golden-ds"}
    kube.create(dv_path(other_namespace), via)
    succeeded(kube, namespace, "direct")
    succeeded(kube, other_namespace, "via-ds")
    assert_restored(kube, images, (namespace, "golden"), (namespace, "direct"))
    assert_restored(kube, images, (namespace, "golden"), (other_namespace, "via-ds"))
    event_reasons(kube, namespace, "direct", {"CloneFromSnapshotSourceInProgress"})
    assert kube.get_or_none(f"{SNAPSHOTS}/namespaces/{namespace}/volumesnapshots/golden-snap")

    # into a class of another provisioner: CDI's fallback, a copy from a temporary restore
    kube.create(dv_path(namespace), clone_dv("copied", snap_source, "testkit-fs", "Filesystem"))
    copied = succeeded(kube, namespace, "copied", timeout=180)
    same_prefix_then_zeros(data_of(kube, namespace, "copied"), images.reference)
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "copied"))
    ann = pvc["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/cloneType"] == "copy"
    assert ann["cdi.kubevirt.io/cloneFallbackReason"] == (
        "The storageclass provisioner does not match the volumesnapshotcontent driver"
    )
    event_reasons(kube, namespace, "copied", {"NoProvisionerMatch"})
    tmp = ns_path(
        namespace, "persistentvolumeclaims", f"tmp-source-pvc-{copied['metadata']['uid']}"
    )
    wait_until(lambda: kube.get_or_none(tmp) is None, "the temporary restore deleted", 60)


def test_a_snapshot_profile_without_a_snapshot_class_falls_back_to_copy(
    kube: Kube, namespace: str, snapshot_classes: None, image_server: ImageServer,
    images: Images,
) -> None:  # fmt: skip
    source = {"http": {"url": image_server.url("ok", "disk.qcow2")}}
    kube.create(dv_path(namespace), datavolume("golden", source, "64Mi", "testkit-fs"))
    succeeded(kube, namespace, "golden")
    pvc = {"pvc": {"namespace": namespace, "name": "golden"}}
    kube.create(dv_path(namespace), clone_dv("plain", pvc, NO_SNAPSHOTTER, "Filesystem"))
    succeeded(kube, namespace, "plain", timeout=180)
    same_prefix_then_zeros(data_of(kube, namespace, "plain"), images.reference)
    ann = kube.get(ns_path(namespace, "persistentvolumeclaims", "plain"))["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/cloneType"] == "copy"
    assert ann["cdi.kubevirt.io/cloneFallbackReason"] == "No compatible volumesnapshotclass found"
    event_reasons(kube, namespace, "plain", {"NoVolumeSnapshotClass"})
    assert "SnapshotForSmartCloneInProgress" not in reasons(kube, namespace, "plain")
