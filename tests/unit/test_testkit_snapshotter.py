"""The test cluster's CSI snapshotter rules that need no cluster: when a content is deleted
(the csi-snapshotter sidecar's ``shouldDelete``), which handles are file names, the
external-provisioner's restore checks, and where a CSI PV's data is on the node."""

from __future__ import annotations

import pytest

from testkit.kubeclient import JSON
from testkit.provisioner import CSI_PROVISIONER, volume_path
from testkit.snapshotter import (
    ANN_ALLOW_MODE_CHANGE,
    ANN_BEING_CREATED,
    ANN_BEING_DELETED,
    check_size_and_mode,
    should_delete,
    valid_handle,
)
from testkit.storage import StorageError


def content(annotations: dict[str, str], deleting: bool = True, **source: str) -> JSON:
    meta: JSON = {"name": "c", "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    spec = {"source": source or {"volumeHandle": "pvc-1"}, "volumeSnapshotRef": {"uid": "u"}}
    return {"metadata": meta, "spec": spec}


def test_a_content_marked_by_the_snapshot_controller_is_deleted() -> None:
    assert should_delete(content({ANN_BEING_DELETED: "yes"}))


def test_a_content_not_being_deleted_or_not_marked_is_kept() -> None:
    assert not should_delete(content({ANN_BEING_DELETED: "yes"}, deleting=False))
    assert not should_delete(content({}))


def test_a_snapshot_being_cut_is_not_deleted_under_it() -> None:
    assert not should_delete(content({ANN_BEING_DELETED: "yes", ANN_BEING_CREATED: "yes"}))


def test_an_unbound_pre_provisioned_content_is_deleted_without_a_mark() -> None:
    c = content({}, snapshotHandle="snap-1")
    c["spec"]["volumeSnapshotRef"] = {"name": "s", "namespace": "n"}
    assert should_delete(c)


@pytest.mark.parametrize("handle", ["snapshot-1f2e", "pvc-abc.def_1"])
def test_plain_names_are_handles(handle: str) -> None:
    assert valid_handle(handle)


@pytest.mark.parametrize("handle", ["", "../etc/passwd", "a/b", ".hidden", "x" * 300, "a\nb"])
def test_paths_and_odd_names_are_not_handles(handle: str) -> None:
    assert not valid_handle(handle)


def claim(size: str, mode: str = "Filesystem") -> JSON:
    spec = {"resources": {"requests": {"storage": size}}, "volumeMode": mode}
    return {"metadata": {"name": "restored"}, "spec": spec}


def bound_content(source_mode: str, allow: str | None = None) -> JSON:
    ann = {ANN_ALLOW_MODE_CHANGE: allow} if allow is not None else {}
    return {
        "metadata": {"name": "c", "annotations": ann},
        "spec": {"sourceVolumeMode": source_mode},
    }


def test_a_claim_at_least_the_snapshot_size_and_of_its_mode_restores() -> None:
    check_size_and_mode(claim("32Mi"), {"restoreSize": "16Mi"}, bound_content("Filesystem"))


def test_a_claim_smaller_than_the_snapshot_is_refused() -> None:
    with pytest.raises(StorageError, match="less than the size"):
        check_size_and_mode(claim("8Mi"), {"restoreSize": "16Mi"}, bound_content("Filesystem"))


def test_a_mode_change_needs_the_content_annotation() -> None:
    with pytest.raises(StorageError, match="modifies the mode"):
        check_size_and_mode(claim("16Mi", "Block"), {}, bound_content("Filesystem"))
    with pytest.raises(StorageError, match="modifies the mode"):
        check_size_and_mode(claim("16Mi", "Block"), {}, bound_content("Filesystem", "false"))
    check_size_and_mode(claim("16Mi", "Block"), {}, bound_content("Filesystem", "true"))


def test_volume_path_of_local_and_csi_pvs() -> None:
    local = {"spec": {"local": {"path": "/mnt/v"}}}
    attrs = {"testkit.local/path": "/dev/loop7"}
    csi = {
        "spec": {"csi": {"driver": CSI_PROVISIONER, "volumeHandle": "h", "volumeAttributes": attrs}}
    }
    other = {
        "spec": {"csi": {"driver": "other.csi", "volumeHandle": "h", "volumeAttributes": attrs}}
    }
    assert volume_path(local) == "/mnt/v"
    assert volume_path(csi) == "/dev/loop7"
    assert volume_path(other) is None
