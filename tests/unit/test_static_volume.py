"""CDI's static-volume rules as pure functions: which pre-bound volumes may hold a claim
(``CheckVolumeSatisfyClaim``) and what a claim made for them waits for."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.controller.static_volume import (
    StaticState,
    listed_annotation,
    listed_volumes,
    static_state,
    static_volumes,
)

CLAIM = {
    "metadata": {"name": "disk", "namespace": "vms"},
    "spec": {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "local",
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": "1Gi"}},
    },
}


def pv(name: str, **changes: Any) -> dict[str, Any]:
    spec = {
        "capacity": {"storage": "2Gi"},
        "accessModes": ["ReadWriteOnce", "ReadWriteMany"],
        "storageClassName": "local",
        "claimRef": {"namespace": "vms", "name": "disk"},
    }
    spec.update(changes.pop("spec", {}))
    return {
        "metadata": {"name": name, **changes.pop("metadata", {})},
        "spec": spec,
        "status": {"phase": changes.pop("phase", "Available")},
    }


def test_only_available_volumes_pre_bound_to_the_claim_that_satisfy_it_are_listed() -> None:
    volumes = [
        pv("b-fits"),
        pv("a-fits-exactly", spec={"capacity": {"storage": "1Gi"}}),
        pv("small", spec={"capacity": {"storage": "1023Mi"}}),
        pv("other-class", spec={"storageClassName": "fast"}),
        pv("block", spec={"volumeMode": "Block"}),
        pv("read-only", spec={"accessModes": ["ReadOnlyMany"]}),
        pv("other-claim", spec={"claimRef": {"namespace": "vms", "name": "other"}}),
        pv("other-namespace", spec={"claimRef": {"namespace": "x", "name": "disk"}}),
        pv("unbound", spec={"claimRef": None}),
        pv("released", phase="Released"),
        pv("deleting", metadata={"deletionTimestamp": "2026-01-01T00:00:00Z"}),
    ]
    assert static_volumes(volumes, CLAIM) == ["a-fits-exactly", "b-fits"]


@pytest.mark.parametrize(
    ("phase", "volume", "state"),
    [
        ("Pending", None, StaticState.WAITING),
        ("Bound", "pv-1", StaticState.BOUND),
        ("Bound", "pv-9", StaticState.WRONG_VOLUME),
    ],
)
def test_a_static_claim_waits_for_its_bind_and_only_a_listed_volume_counts(
    phase: str, volume: str | None, state: StaticState
) -> None:
    claim = {
        "metadata": {"annotations": listed_annotation(["pv-1", "pv-2"])},
        "spec": {"volumeName": volume},
        "status": {"phase": phase},
    }
    listed = listed_volumes(claim)
    assert listed == ["pv-1", "pv-2"]
    assert static_state(claim, listed) is state


def test_no_list_is_no_static_provision_and_a_garbled_one_lists_nothing() -> None:
    assert listed_volumes({"metadata": {}}) is None
    garbled = {"metadata": {"annotations": {"cdi.kubevirt.io/storage.persistentVolumeList": "{"}}}
    assert listed_volumes(garbled) == []
