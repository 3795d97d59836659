"""The DataSource's Ready condition and resolved source, as CDI's datasource controller says."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.types import DataSource, DataSourceSource, ObjectRef
from cdi.controller.datasource import (
    Observed,
    desired_status,
    keys_naming,
    kubevirt_labels,
    ready_condition,
    resolve,
)


def ds(name: str, source: dict[str, Any], ns: str = "golden") -> DataSource:
    return DataSource.from_dict(
        {"metadata": {"name": name, "namespace": ns}, "spec": {"source": source}}
    )


PVC = DataSourceSource(pvc=ObjectRef("golden", "fedora"))


def test_an_empty_source_is_no_source() -> None:
    r = ready_condition(DataSourceSource(), Observed())
    assert (r.ready, r.reason, r.message) == (False, "NoSource", "No source PVC set")


def test_a_missing_pvc_is_not_found_and_an_existing_one_ready() -> None:
    assert ready_condition(PVC, Observed()).reason == "NotFound"
    r = ready_condition(PVC, Observed(pvc={"metadata": {"name": "fedora"}}))
    assert (r.ready, r.reason) == (True, "Ready")


@pytest.mark.parametrize("phase", ["ImportInProgress", "ImportScheduled", "Failed"])
def test_the_source_datavolume_phase_is_the_reason_until_it_succeeds(phase: str) -> None:
    seen = Observed(datavolume={"status": {"phase": phase}}, pvc={"metadata": {}})
    r = ready_condition(PVC, seen)
    assert (r.ready, r.reason, r.message) == (False, phase, f"Import DataVolume phase {phase}")
    done = Observed(datavolume={"status": {"phase": "Succeeded"}}, pvc={"metadata": {}})
    assert ready_condition(PVC, done).ready


def test_snapshot_sources_need_a_ready_snapshot() -> None:
    src = DataSourceSource(snapshot=ObjectRef("golden", "snap1"))
    assert ready_condition(src, Observed()).reason == "NotFound"
    pending = Observed(snapshot={"status": {"readyToUse": False}})
    assert ready_condition(src, pending).reason == "SnapshotNotReady"
    assert ready_condition(src, Observed(snapshot={"status": {"readyToUse": True}})).ready


def test_a_reference_resolves_to_the_inner_source_one_level_deep() -> None:
    inner = ds("inner", {"pvc": {"namespace": "golden", "name": "fedora"}})
    outer = ds("outer", {"dataSource": {"namespace": "golden", "name": "inner"}})
    assert resolve(outer, inner) == (inner.spec.source, None)
    _, missing = resolve(outer, None)
    assert missing is not None and missing.reason == "NotFound"
    deeper = ds("inner", {"dataSource": {"namespace": "golden", "name": "x"}})
    _, deep = resolve(outer, deeper)
    assert deep is not None and deep.reason == "MaxReferenceDepthReached"
    selfish = ds("me", {"dataSource": {"namespace": "golden", "name": "me"}})
    assert resolve(selfish, None)[1].reason == "SelfReference"  # type: ignore[union-attr]
    other = ds("o", {"dataSource": {"namespace": "elsewhere", "name": "x"}})
    assert resolve(other, None)[1].reason == "CrossNamespaceReference"  # type: ignore[union-attr]


def test_transition_time_moves_when_the_source_is_repointed_though_still_ready() -> None:
    ready = ready_condition(PVC, Observed(pvc={"metadata": {}}))
    first = desired_status({}, PVC, ready, "2026-01-01T00:00:00Z")
    same = desired_status(first, PVC, ready, "2026-01-01T00:05:00Z")
    assert same == first
    other = DataSourceSource(pvc=ObjectRef("golden", "centos"))
    moved = desired_status(first, other, ready, "2026-01-01T00:09:00Z")
    assert moved["conditions"][0]["status"] == "True"
    assert moved["conditions"][0]["lastTransitionTime"] == "2026-01-01T00:09:00Z"
    assert moved["source"] == {"pvc": {"namespace": "golden", "name": "centos"}}


def test_only_kubevirt_io_labels_are_copied() -> None:
    pvc = {"metadata": {"labels": {"instancetype.kubevirt.io/default-preference": "fedora",
                                   "test.kubevirt.io/test": "x", "app": "no",
                                   "kubevirt.io/plain": "no"}}}  # fmt: skip
    assert kubevirt_labels(pvc) == {
        "instancetype.kubevirt.io/default-preference": "fedora",
        "test.kubevirt.io/test": "x",
    }


def test_objects_map_to_the_datasources_naming_them() -> None:
    raw = [
        {"metadata": {"namespace": "golden", "name": "a"},
         "spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}}},
        {"metadata": {"namespace": "golden", "name": "b"},
         "spec": {"source": {"dataSource": {"namespace": "golden", "name": "a"}}},
         "status": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}}},
        {"metadata": {"namespace": "golden", "name": "c"}, "spec": {"source": {}}},
    ]  # fmt: skip
    assert keys_naming(raw, "pvc", "golden", "fedora") == ["golden/a", "golden/b"]
    assert keys_naming(raw, "dataSource", "golden", "a") == ["golden/b"]
    assert keys_naming(raw, "pvc", "other", "fedora") == []
