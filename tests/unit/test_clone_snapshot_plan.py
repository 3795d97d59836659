"""The snapshot clone's pure rules: which VolumeSnapshotClass, when a smart clone is used or
falls back to copy (CDI's reasons), the temporary snapshot, the restored claims and their size,
the strategy for a snapshot source, and which DataVolumes a snapshot event concerns."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.controller.snapshotwatch import datavolume_keys
from cdi.render import clone as plan
from cdi.render import clone_snapshot as snap

DRIVER = "loop.testkit.local"
CLASSES: dict[str, dict[str, Any]] = {
    "csi": {"provisioner": DRIVER, "allowVolumeExpansion": True},
    "csi-fixed": {"provisioner": DRIVER},
    "other": {"provisioner": "ebs.csi.aws.com", "allowVolumeExpansion": True},
}


def vsc(name: str, driver: str = DRIVER, default: bool = False) -> dict[str, Any]:
    ann = {snap.ANN_DEFAULT_SNAPSHOT_CLASS: "true"} if default else {}
    return {"metadata": {"name": name, "annotations": ann}, "driver": driver}


def claim(size: str | None = "64Mi", cls: str = "csi", mode: str = "Filesystem") -> dict:
    spec: dict[str, Any] = {"storageClassName": cls, "volumeMode": mode,
                            "accessModes": ["ReadWriteOnce"]}  # fmt: skip
    if size:
        spec["resources"] = {"requests": {"storage": size}}
    return {"metadata": {"name": "t", "annotations": {}}, "spec": spec}


def snapshot(ns: str = "golden", size: str | None = "64Mi", ready: bool = True) -> dict:
    status: dict[str, Any] = {"readyToUse": ready}
    if size is not None:
        status["restoreSize"] = size
    return {"metadata": {"name": "snap", "namespace": ns},
            "spec": {"volumeSnapshotClassName": "vsc"}, "status": status}  # fmt: skip


def test_the_profiles_class_is_used_only_for_its_driver() -> None:
    classes = [vsc("a"), vsc("b", default=True), vsc("mine")]
    chosen = snap.choose_snapshot_class(DRIVER, classes, "mine")
    assert chosen == snap.SnapshotClassChoice("mine", f"{snap.BY_PROFILE} mine")
    assert snap.choose_snapshot_class(DRIVER, [vsc("mine", "other.driver")], "mine") is None
    assert snap.choose_snapshot_class(DRIVER, classes, "absent") is None


def test_the_default_class_then_the_first_by_name() -> None:
    classes = [vsc("z"), vsc("b"), vsc("d", default=True), vsc("x", "other.driver", True)]
    assert snap.choose_snapshot_class(DRIVER, classes) == snap.SnapshotClassChoice(
        "d", "Default VolumeSnapshotClass selected d"
    )
    chosen = snap.choose_snapshot_class(DRIVER, classes[:2])
    assert chosen == snap.SnapshotClassChoice("b", "First VolumeSnapshotClass selected b")
    assert snap.choose_snapshot_class(DRIVER, [vsc("x", "other.driver")]) is None
    assert snap.choose_snapshot_class("", classes) is None


@pytest.mark.parametrize(
    ("target", "snapshot_class", "reason"),
    [
        (claim(), "vsc", None),
        (claim("128Mi"), "vsc", None),  # bigger: the class expands
        (claim(), None, "NoVolumeSnapshotClass"),
        (claim(cls="other"), "vsc", "IncompatibleProvisioners"),
        (claim(mode="Block"), "vsc", "IncompatibleVolumeModes"),
        (claim("128Mi", cls="csi-fixed"), "vsc", "NoVolumeExpansion"),
    ],
    ids=["same", "bigger", "no class", "provisioners", "modes", "no expansion"],
)
def test_a_smart_clone_needs_a_class_and_compatible_storage(
    target: dict, snapshot_class: str | None, reason: str | None
) -> None:
    source = claim(cls="csi-fixed") if reason == "NoVolumeExpansion" else claim()
    chosen = plan.plan_strategy("snapshot", source, target, CLASSES, snapshot_class)
    if reason is None:
        assert chosen == plan.StrategyPlan("snapshot")
    else:
        assert chosen.strategy == "copy"
        assert chosen.fallback is not None and chosen.fallback.reason == reason


def test_the_temporary_snapshot_is_labelled_for_its_datavolume_and_unowned() -> None:
    body = snap.render_snapshot("golden", "fedora", "uid-1", "vsc", "tenant/clone")
    meta = body["metadata"]
    assert (meta["name"], meta["namespace"]) == ("tmp-snapshot-uid-1", "golden")
    assert meta["labels"][plan.LABEL_CLONE_FOR] == "uid-1" and "ownerReferences" not in meta
    assert body["spec"] == {
        "source": {"persistentVolumeClaimName": "fedora"},
        "volumeSnapshotClassName": "vsc",
    }
    assert snap.made_for(body, "uid-1") and not snap.made_for(body, "uid-2")
    assert not snap.ready(body) and snap.ready(snapshot())
    failed = {"status": {"readyToUse": False, "error": {"message": "driver said no"}}}
    assert snap.snapshot_error(failed) == "driver said no"


def test_a_restore_is_made_at_the_snapshots_size_and_grows_to_the_targets() -> None:
    target, tmp = snap.restore_plan(claim("128Mi"), snapshot(), "golden", "uid-1", "golden/t")
    assert tmp is None
    assert target["spec"]["dataSource"] == {
        "apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "snap"
    }  # fmt: skip
    assert target["spec"]["resources"]["requests"]["storage"] == str(64 * 2**20)
    assert target["metadata"]["annotations"][snap.ANN_TARGET_SIZE] == str(128 * 2**20)
    bound = {**target, "status": {"capacity": {"storage": "64Mi"}}}
    assert snap.growth(bound) == 128 * 2**20
    assert snap.growth({**target, "status": {"capacity": {"storage": "128Mi"}}}) is None
    same, _ = snap.restore_plan(claim("64Mi"), snapshot(), "golden", "uid-1", "golden/t")
    assert snap.ANN_TARGET_SIZE not in same["metadata"]["annotations"]
    assert snap.growth(same) is None
    any_size, _ = snap.restore_plan(claim("96Mi"), snapshot(size="0"), "golden", "u", "golden/t")
    assert any_size["spec"]["resources"]["requests"]["storage"] == "96Mi"  # 0: any size


def test_across_namespaces_a_temporary_claim_is_restored_then_moved() -> None:
    target, tmp = snap.restore_plan(claim("128Mi"), snapshot(), "tenant", "uid-1", "tenant/t")
    assert tmp is not None
    assert (tmp["metadata"]["name"], tmp["metadata"]["namespace"]) == ("tmp-pvc-uid-1", "golden")
    assert tmp["metadata"]["labels"][plan.LABEL_CLONE_FOR] == "uid-1"
    assert tmp["spec"]["dataSource"]["kind"] == "VolumeSnapshot"
    assert tmp["spec"]["resources"]["requests"]["storage"] == str(64 * 2**20)
    moved = plan.moved_target(target, "pv-1")
    assert moved["spec"]["volumeName"] == "pv-1" and "dataSource" not in moved["spec"]
    assert moved["metadata"]["annotations"][snap.ANN_TARGET_SIZE] == str(128 * 2**20)


@pytest.mark.parametrize(
    ("driver", "mode", "target", "reason"),
    [
        (DRIVER, "Filesystem", claim(), None),
        (DRIVER, None, claim("128Mi"), None),  # mode unknown (source gone): as CDI, restore
        ("", None, claim(), "NoProvisionerMatch"),  # no class: driver unknown
        ("ebs.csi.aws.com", None, claim(), "NoProvisionerMatch"),
        (DRIVER, "Block", claim(), "IncompatibleVolumeModes"),
        (DRIVER, None, claim("128Mi", cls="csi-fixed"), "NoVolumeExpansion"),
    ],
    ids=["restore", "bigger", "unknown driver", "other driver", "modes", "no expansion"],
)
def test_a_snapshot_source_is_restored_or_falls_back_with_cdis_reason(
    driver: str, mode: str | None, target: dict, reason: str | None
) -> None:
    chosen = snap.plan_snapshot_source(driver, mode, snapshot(), target, CLASSES)
    if reason is None:
        assert chosen == plan.StrategyPlan("snapshot")
    else:
        assert chosen.strategy == "copy" and chosen.fallback is not None
        assert chosen.fallback.reason == reason


def test_a_snapshot_as_a_source_sizes_the_target_and_refuses_a_smaller_one() -> None:
    src = snap.as_source_claim(snapshot(size="64Mi"), "Filesystem")
    assert plan.fill_size(claim(None), src)["spec"]["resources"]["requests"]["storage"] == str(
        64 * 2**20
    )
    assert plan.size_problem(src, claim("16Mi")) is not None
    assert plan.size_problem(src, claim("64Mi")) is None


def test_a_snapshot_event_concerns_its_clone_and_the_datavolumes_naming_it() -> None:
    tmp = snap.render_snapshot("golden", "fedora", "uid-1", "vsc", "tenant/clone")
    named = {"metadata": {"namespace": "tenant", "name": "from-snap"},
             "spec": {"source": {"snapshot": {"namespace": "golden", "name": "snap"}}}}  # fmt: skip
    local = {"metadata": {"namespace": "golden", "name": "local"},
             "spec": {"source": {"snapshot": {"name": "snap"}}}}  # fmt: skip
    other = {"metadata": {"namespace": "tenant", "name": "x"}, "spec": {"source": {"http": {}}}}
    assert datavolume_keys(tmp, [named, other]) == ["tenant/clone"]
    keys = datavolume_keys(snapshot(), [named, local, other])
    assert keys == ["tenant/from-snap", "golden/local"]


def test_the_fallbacks_source_is_restored_on_a_class_of_the_snapshots_driver() -> None:
    classes = [
        {"metadata": {"name": "a-wffc"}, "provisioner": DRIVER,
         "volumeBindingMode": "WaitForFirstConsumer"},
        {"metadata": {"name": "b"}, "provisioner": DRIVER},
        {"metadata": {"name": "a-other"}, "provisioner": "ebs.csi.aws.com"},
    ]  # fmt: skip
    assert snap.restore_class(DRIVER, classes) == "b"  # Immediate before WaitForFirstConsumer
    assert snap.restore_class(DRIVER, classes[:1]) == "a-wffc"
    assert snap.restore_class("", classes) is None
    assert snap.restore_class("x.example", classes) is None
    tmp = snap.temporary_source(snapshot(), "b", claim("128Mi", mode="Block"), None, "u1", "t/c")
    meta, spec = tmp["metadata"], tmp["spec"]
    assert (meta["name"], meta["namespace"]) == ("tmp-source-pvc-u1", "golden")
    assert meta["labels"][plan.LABEL_CLONE_FOR] == "u1"
    assert meta["annotations"][plan.ANN_MOVE_TARGET] == "t/c"
    assert spec["storageClassName"] == "b" and spec["accessModes"] == ["ReadWriteOnce"]
    assert spec["volumeMode"] == "Block"  # the snapshotted mode unknown: the target's
    assert spec["resources"]["requests"]["storage"] == str(64 * 2**20)  # the restore size
    assert spec["dataSource"]["name"] == "snap"
    unsized = snap.temporary_source(snapshot(size=None), "b", claim("96Mi"), "Filesystem", "u", "")
    assert unsized["spec"]["resources"]["requests"]["storage"] == "96Mi"
