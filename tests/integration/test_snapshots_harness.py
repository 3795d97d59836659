"""Real CSI snapshots on the test cluster: the upstream snapshot-controller (built from
kubernetes-csi/external-snapshotter) binds VolumeSnapshots to contents, and the local
provisioner, as the snapshotter of its ``loop.testkit.local`` volumes, cuts them as sparse
point-in-time copies, restores claims from them and deletes them. Volumes are written and read
straight through the node's mount point or loop device."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from kubernetes.utils import parse_quantity

from testkit.cluster import Cluster
from testkit.kubeclient import JSON, Kube, ns_path
from testkit.provisioner import ANN_IMAGE, CSI_PROVISIONER, volume_path
from testkit.snapshotter import CONTENTS, SNAPSHOT_CLASS, snapshot_path
from testkit.waiting import wait_until
from tests.integration.helpers import bound_pv, pvc_manifest, wait_gone

pytestmark = pytest.mark.integration

MiB = 1024 * 1024
CLASS = {"Filesystem": "testkit-csi-fs", "Block": "testkit-csi-block"}
OFFSET = 3 * MiB  # where a block volume's pattern goes: past the start, inside the volume


def snapshot_manifest(name: str, claim: str) -> JSON:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"source": {"persistentVolumeClaimName": claim}},  # the default class
    }


def from_snapshot(name: str, size: str, mode: str, snapshot: str) -> JSON:
    pvc = pvc_manifest(name, size, CLASS[mode], mode=mode)
    ref = {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": snapshot}
    pvc["spec"]["dataSource"] = ref
    return pvc


def ready_snapshot(kube: Kube, ns: str, name: str, timeout: float = 60) -> JSON:
    def ready() -> JSON | None:
        snap = kube.get(snapshot_path(ns, name))
        return snap if (snap.get("status") or {}).get("readyToUse") else None

    return wait_until(ready, f"VolumeSnapshot {ns}/{name} readyToUse", timeout)


def write_pattern(pv: JSON, data: bytes) -> None:
    path = Path(volume_path(pv) or "")
    if pv["spec"]["volumeMode"] == "Block":
        with open(path, "r+b") as f:
            f.seek(OFFSET)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    else:
        (path / "pattern.bin").write_bytes(data)


def read_pattern(pv: JSON, n: int) -> bytes:
    path = Path(volume_path(pv) or "")
    if pv["spec"]["volumeMode"] == "Block":
        with open(path, "rb") as f:
            f.seek(OFFSET)
            return f.read(n)
    return (path / "pattern.bin").read_bytes()


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def device_size(pv: JSON) -> int:
    path = Path(volume_path(pv) or "")
    if pv["spec"]["volumeMode"] == "Block":
        with open(path, "rb") as f:
            return f.seek(0, os.SEEK_END)
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_snapshot_is_a_sparse_point_in_time_copy_that_restores_and_deletes(
    cluster: Cluster, kube: Kube, namespace: str, mode: str
) -> None:
    claims = ns_path(namespace, "persistentvolumeclaims")
    kube.create(claims, pvc_manifest("src", "16Mi", CLASS[mode], mode=mode))
    src_pv = bound_pv(kube, namespace, "src")
    csi = src_pv["spec"]["csi"]
    assert (csi["driver"], csi["volumeHandle"]) == (CSI_PROVISIONER, src_pv["metadata"]["name"])
    assert "local" not in src_pv["spec"]
    before, after = os.urandom(MiB), os.urandom(MiB)
    write_pattern(src_pv, before)

    kube.create(snapshot_path(namespace), snapshot_manifest("snap", "src"))
    # The restore is asked for at once: the provisioner waits until the snapshot is ready.
    kube.create(claims, from_snapshot("restored", "24Mi", mode, "snap"))
    snap = ready_snapshot(kube, namespace, "snap")
    write_pattern(src_pv, after)  # after the snapshot: the restore must not see it

    assert snap["spec"]["volumeSnapshotClassName"] == SNAPSHOT_CLASS
    assert int(parse_quantity(snap["status"]["restoreSize"])) == 16 * MiB
    content_name = snap["status"]["boundVolumeSnapshotContentName"]
    content = kube.get(f"{CONTENTS}/{content_name}")
    assert content["spec"]["source"]["volumeHandle"] == csi["volumeHandle"]
    assert content["status"]["restoreSize"] == 16 * MiB
    assert content["status"]["creationTime"] > 0
    image = cluster.snapshot_image(content["status"]["snapshotHandle"])
    assert image.stat().st_size == 16 * MiB
    assert allocated(image) < 16 * MiB  # sparse: only what the volume used

    restored = bound_pv(kube, namespace, "restored")
    assert restored["spec"]["csi"]["driver"] == CSI_PROVISIONER
    assert read_pattern(restored, MiB) == before
    assert read_pattern(src_pv, MiB) == after
    restored_image = Path(restored["metadata"]["annotations"][ANN_IMAGE])
    assert restored_image.stat().st_size == 24 * MiB  # grown to the claim
    assert device_size(restored) > 16 * MiB
    assert allocated(restored_image) <= allocated(image) + MiB  # sparse too

    kube.delete(snapshot_path(namespace, "snap"))
    wait_gone(kube, snapshot_path(namespace, "snap"))
    wait_gone(kube, f"{CONTENTS}/{content_name}")
    assert not image.exists()
    assert read_pattern(restored, MiB) == before  # the restored volume is its own


def test_snapshot_of_a_local_volume_is_left_to_the_controller_to_refuse(
    kube: Kube, namespace: str
) -> None:
    kube.create(
        ns_path(namespace, "persistentvolumeclaims"), pvc_manifest("plain", "16Mi", "testkit-fs")
    )
    bound_pv(kube, namespace, "plain")
    kube.create(snapshot_path(namespace), snapshot_manifest("snap", "plain"))

    def failed() -> JSON | None:
        status = kube.get(snapshot_path(namespace, "snap")).get("status") or {}
        return status if (status.get("error") or {}).get("message") else None

    status = wait_until(failed, "the snapshot-controller's error on the VolumeSnapshot", 60)
    assert not status.get("readyToUse")
    assert not status.get("boundVolumeSnapshotContentName")


def pre_provisioned(name: str, ns: str, handle: str, snapshot: str) -> JSON:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshotContent",
        "metadata": {"name": name},
        "spec": {
            "driver": CSI_PROVISIONER,
            "deletionPolicy": "Retain",
            "source": {"snapshotHandle": handle},
            "sourceVolumeMode": "Filesystem",
            "volumeSnapshotRef": {"name": snapshot, "namespace": ns},
        },
    }


def imported_snapshot(name: str, content: str) -> JSON:
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": name},
        "spec": {"source": {"volumeSnapshotContentName": content}},
    }


def test_pre_provisioned_snapshots_bind_by_handle_and_bad_handles_are_refused(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    claims = ns_path(namespace, "persistentvolumeclaims")
    kube.create(claims, pvc_manifest("src", "16Mi", CLASS["Filesystem"]))
    data = os.urandom(MiB)
    write_pattern(bound_pv(kube, namespace, "src"), data)
    kube.create(snapshot_path(namespace), snapshot_manifest("snap", "src"))
    snap = ready_snapshot(kube, namespace, "snap")
    dynamic = kube.get(f"{CONTENTS}/{snap['status']['boundVolumeSnapshotContentName']}")
    handle = dynamic["status"]["snapshotHandle"]

    suffix = namespace[-6:]  # contents are cluster-scoped: one name per test run
    names = {k: f"{k}-{suffix}" for k in ("imported", "missing", "escape")}
    handles = {"imported": handle, "missing": "snapshot-nothing-here", "escape": "../volumes/x"}
    for key, content in names.items():
        kube.create(CONTENTS, pre_provisioned(content, namespace, handles[key], key))
        kube.create(snapshot_path(namespace), imported_snapshot(key, content))
    imported = ready_snapshot(kube, namespace, "imported")
    assert int(parse_quantity(imported["status"]["restoreSize"])) == 16 * MiB
    kube.create(claims, from_snapshot("restored", "16Mi", "Filesystem", "imported"))
    assert read_pattern(bound_pv(kube, namespace, "restored"), MiB) == data

    def error_of(content: str) -> str | None:
        status = kube.get(f"{CONTENTS}/{content}").get("status") or {}
        return (status.get("error") or {}).get("message")

    assert "not found" in wait_until(lambda: error_of(names["missing"]), "an error", 30)
    assert "invalid snapshot handle" in wait_until(
        lambda: error_of(names["escape"]), "an error", 30
    )
    # A claim of another volume mode than the snapshot's source is refused (stays Pending),
    # and while it waits the snapshot-controller keeps the snapshot from being deleted.
    kube.create(claims, from_snapshot("as-block", "16Mi", "Block", "imported"))
    kube.delete(snapshot_path(namespace, "imported"))
    time.sleep(3)
    pvc = kube.get(f"{claims}/as-block")
    assert pvc["status"]["phase"] == "Pending" and not pvc["spec"].get("volumeName")
    assert kube.get_or_none(snapshot_path(namespace, "imported")) is not None

    kube.delete(f"{claims}/as-block")
    wait_gone(kube, snapshot_path(namespace, "imported"))
    assert cluster.snapshot_image(handle).exists()  # Retain: the snapshot stays on storage
    for content in names.values():
        kube.delete_ignore_missing(f"{CONTENTS}/{content}")
