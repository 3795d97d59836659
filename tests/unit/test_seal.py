"""The controller's seals (issue 23, N1): what it wrote on a tenant-writable claim can be told
from what a tenant wrote there, and the populator hands over only a PV bound to its own prime."""

from __future__ import annotations

from typing import Any

from cdi.controller.populators.handover import bound_to
from cdi.controller.record import (
    ANN_SEALED_RECORD,
    ClaimRecord,
    read_sealed,
    sealed_annotations,
)
from cdi.controller.seal import Seal
from cdi.render.prime import rebind_patch

SEAL = Seal.from_shared_key(b"k" * 32)
RUNNING = ClaimRecord(failed_attempts=1, pod_name="importer-p-1", pod_uid="pod-uid")


def claim(uid: str, annotations: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "prime-x", "namespace": "ns", "uid": uid,
                         "annotations": annotations or {}}}  # fmt: skip


def written(uid: str, record: ClaimRecord) -> dict[str, Any]:
    """A claim as the flavour writes it: CDI's keys and the sealed record, in one patch."""
    pvc = claim(uid)
    ann = {k: v for k, v in record.annotations().items() if v is not None}
    pvc["metadata"]["annotations"] = {**ann, **sealed_annotations(SEAL, pvc, record)}
    return pvc


def test_a_value_sealed_for_one_object_opens_only_for_it_and_its_purpose() -> None:
    sealed = SEAL.seal("populator-prime", "target-uid", "prime-uid")
    assert SEAL.open("populator-prime", "target-uid", sealed) == "prime-uid"
    assert SEAL.open("populator-prime", "other-uid", sealed) is None  # copied to another claim
    assert SEAL.open("import-record", "target-uid", sealed) is None  # another kind of seal
    forged = sealed.rsplit(":", 1)[0] + ":attacker-prime-uid"
    assert SEAL.open("populator-prime", "target-uid", forged) is None
    other_key = Seal.from_shared_key(b"x" * 32)
    assert other_key.open("populator-prime", "target-uid", sealed) is None
    for junk in (None, "", "v1", "v1:abc", "v2:" + sealed[3:], 42):
        assert SEAL.open("populator-prime", "target-uid", junk) is None


def test_without_a_shared_key_each_process_seals_with_its_own() -> None:
    one, two = Seal.from_shared_key(None), Seal.from_shared_key(None)
    assert two.open("p", "u", one.seal("p", "u", "v")) is None


def test_the_record_round_trips_through_json() -> None:
    done = ClaimRecord(2, "Succeeded", "Completed", "Import Complete", "importer-p-2", "u")
    assert ClaimRecord.from_json(done.to_json()) == done
    for junk in ("", "[]", "{}", '{"outcome": "Succeeded"}', "not json"):
        assert ClaimRecord.from_json(junk) is None


def test_the_sealed_record_is_read_and_a_forged_outcome_beside_it_is_ignored() -> None:
    pvc = written("prime-uid", RUNNING)
    assert read_sealed(SEAL, pvc) == read_sealed(SEAL, pvc).__class__(RUNNING, False)
    pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"] = "Succeeded"
    read = read_sealed(SEAL, pvc)
    assert read.record == RUNNING and read.record.outcome is None
    assert read.altered


def test_a_claim_with_no_seal_has_a_fresh_record_whatever_its_keys_say() -> None:
    fresh = read_sealed(SEAL, claim("prime-uid"))
    assert fresh.record == ClaimRecord() and not fresh.altered
    forged = read_sealed(
        SEAL, claim("prime-uid", {"cdi.kubevirt.io/storage.pod.phase": "Succeeded"})
    )
    assert forged.record.outcome is None and forged.altered


def test_a_sealed_success_copied_from_another_claim_does_not_verify() -> None:
    done = ClaimRecord(outcome="Succeeded", pod_name="importer-p-0", pod_uid="pod")
    elsewhere = written("another-prime-uid", done)
    pvc = claim("prime-uid", dict(elsewhere["metadata"]["annotations"]))
    read = read_sealed(SEAL, pvc)
    assert read.record.outcome is None and read.altered
    assert ANN_SEALED_RECORD in pvc["metadata"]["annotations"]


def volume(ref: dict[str, Any] | None) -> dict[str, Any]:
    return {"metadata": {"name": "pv-1", "resourceVersion": "7"}, "spec": {"claimRef": ref}}


def bound_claim(phase: str = "Bound", volume_name: str = "pv-1") -> dict[str, Any]:
    pvc = claim("prime-uid")
    pvc["spec"] = {"volumeName": volume_name}
    pvc["status"] = {"phase": phase}
    return pvc


def test_a_volume_is_bound_to_a_claim_only_when_both_name_each_other() -> None:
    ref = {"namespace": "ns", "name": "prime-x", "uid": "prime-uid"}
    assert bound_to(volume(ref), bound_claim())
    # the attack: the tenant's claim names the victim's volume, which names the victim's claim
    victim = {"namespace": "golden", "name": "fedora", "uid": "victim-uid"}
    assert not bound_to(volume(victim), bound_claim())
    assert not bound_to(volume({**ref, "uid": "old-uid"}), bound_claim())  # same name, re-made
    assert not bound_to(volume({**ref, "namespace": "other"}), bound_claim())
    assert not bound_to(volume(ref), bound_claim(phase="Pending"))
    assert not bound_to(volume(ref), bound_claim(volume_name="pv-2"))
    assert not bound_to(volume(None), bound_claim())


def test_the_rebind_patch_is_guarded_by_the_checked_version() -> None:
    target = {"metadata": {"name": "t", "namespace": "ns", "uid": "t-uid"}}
    assert rebind_patch(target, "7")["metadata"] == {"resourceVersion": "7"}
    assert "metadata" not in rebind_patch(target)
