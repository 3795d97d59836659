"""Verified volumes (issue 28), the control plane's pure parts: who asks (the DataVolume's
annotation, CDIConfig's switch), what the worker pods are told (IMPORTER_VERIFY,
UPLOAD_VERIFY), what the termination message carries, how the claim record keeps the result
and which Verified condition the DataVolume shows."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cdi.api.config import CDIConfig, CDIConfigSpec, verification_requested
from cdi.api.termination import (
    REASON_COMPLETED,
    VERIFICATION_NOT_SUPPORTED,
    VERIFIED,
    TerminationMessage,
    Verification,
)
from cdi.api.types import DataVolume
from cdi.controller.flavours.import_ import IMPORT_PHASES
from cdi.controller.flavours.upload import Action, assess
from cdi.controller.policy import Outcome, verification_of
from cdi.controller.record import ClaimRecord
from cdi.controller.status import View, compute_status
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.prime import import_request, render_prime, render_upload_prime
from cdi.render.pvc import render_pvc
from cdi.render.upload_pod import UploadPodConfig, render_upload_pod

ANN = "cdi.kubevirt.io/storage.verify"
T0 = "2026-01-01T00:00:00Z"


@pytest.mark.parametrize(
    ("annotation", "cluster", "asked"),
    [
        (None, None, False),
        ("true", None, True),
        ("True", False, True),
        ("false", None, False),
        ("yes", None, False),  # Go's ParseBool does not know it
        (None, True, True),
        ("false", True, True),  # the administrator's switch: no opting out
    ],
)
def test_a_datavolume_or_cdiconfig_asks_for_verification(
    annotation: str | None, cluster: bool | None, asked: bool
) -> None:
    assert verification_requested(annotation, cluster) is asked


def _dv(annotations: dict[str, str]) -> DataVolume:
    return DataVolume.from_dict(
        {
            "metadata": {"name": "d", "namespace": "n", "uid": "u", "annotations": annotations},
            "spec": {
                "source": {"http": {"url": "http://x/d.img"}},
                "pvc": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        }
    )


def _importer_env(dv: DataVolume, cdi: CDIConfig) -> dict[str, Any]:
    pvc = render_pvc(dv, None, cdi)
    pod = render_importer_pod(dv, pvc, ImporterPodConfig(image="importer:dev", cdi_config=cdi))
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_importer_pod_is_told_to_verify_only_when_asked() -> None:
    on = CDIConfig(spec=CDIConfigSpec(verify_volumes=True))
    assert _importer_env(_dv({ANN: "true"}), CDIConfig())["IMPORTER_VERIFY"] == "true"
    assert _importer_env(_dv({}), on)["IMPORTER_VERIFY"] == "true"
    assert "IMPORTER_VERIFY" not in _importer_env(_dv({}), CDIConfig())


def test_the_request_reaches_the_claim_and_its_upload_server_and_a_prime() -> None:
    dv = _dv({ANN: "true"})
    pvc = render_pvc(dv, None, CDIConfig())
    assert pvc["metadata"]["annotations"][ANN] == "true"  # user-settable: kept on the claim
    pvc["metadata"]["uid"] = "pvc-uid"
    config = UploadPodConfig(image="uploadserver:dev", deadline="2026-01-01T19:12:00Z")
    pod = render_upload_pod(pvc, config)
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["UPLOAD_VERIFY"] == "true"
    prime = render_upload_prime(pvc, {"spec": {}})
    assert prime["metadata"]["annotations"][ANN] == "true"
    plain = render_pvc(_dv({}), None, CDIConfig())
    plain["metadata"]["uid"] = "pvc-uid"
    plain_env = render_upload_pod(plain, config)["spec"]["containers"][0]["env"]
    assert "UPLOAD_VERIFY" not in {e["name"] for e in plain_env}
    on = dataclasses.replace(config, cdi_config=CDIConfig(spec=CDIConfigSpec(verify_volumes=True)))
    cluster_env = render_upload_pod(plain, on)["spec"]["containers"][0]["env"]
    assert {"name": "UPLOAD_VERIFY", "value": "true"} in cluster_env


def test_a_populated_import_keeps_the_request_of_its_target_claim() -> None:
    """On CSI storage the importer runs for a prime claim; its pod is rendered from the
    import the prime records, with the target claim's identity and its request to verify."""
    dv = _dv({ANN: "true"})
    target = render_pvc(dv, None, CDIConfig())
    target["metadata"].update(uid="t-uid", namespace="n")
    source = {"spec": {"source": {"http": {"url": "http://x/d.img"}}}}
    prime = render_prime(target, source)
    request = import_request(target, prime)
    assert request.annotations[ANN] == "true"
    pod = render_importer_pod(request, prime, ImporterPodConfig(image="importer:dev"))
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["IMPORTER_VERIFY"] == "true"
    del target["metadata"]["annotations"][ANN]
    assert ANN not in import_request(target, prime).annotations


def test_the_termination_message_carries_the_verification_and_tolerates_its_absence() -> None:
    check = Verification(VERIFIED, "verified: 3 blocks", "xxh3-128-sum/64k:ab", 3, 196608)
    message = TerminationMessage(REASON_COMPLETED, "Import Complete", verification=check)
    assert TerminationMessage.from_json(message.to_json()).verification == check
    assert (
        TerminationMessage.from_json('{"reason": "Completed", "message": ""}').verification is None
    )
    odd = '{"reason": "Completed", "message": "", "verification": "yes"}'
    assert TerminationMessage.from_json(odd).verification is None


def _outcome(result: str | None) -> Outcome:
    check = Verification(result, "m") if result else None
    term = TerminationMessage(REASON_COMPLETED, "Import Complete", verification=check)
    return Outcome(REASON_COMPLETED, "Import Complete", False, termination=term)


def test_only_known_results_reach_the_claim_record() -> None:
    assert verification_of(_outcome(VERIFIED)) == VERIFIED
    assert verification_of(_outcome(VERIFICATION_NOT_SUPPORTED)) == VERIFICATION_NOT_SUPPORTED
    assert verification_of(_outcome("Trust me")) is None
    assert verification_of(_outcome(None)) is None


def test_the_record_keeps_the_result_in_an_annotation_and_reads_older_sealed_records() -> None:
    record = ClaimRecord(outcome="Succeeded", reason="Completed", verification=VERIFIED)
    pvc = {"metadata": {"annotations": record.annotations()}}
    assert pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.verification"] == VERIFIED
    assert ClaimRecord.from_pvc(pvc) == record
    assert ClaimRecord.from_json(record.to_json()) == record
    older = record.to_json().replace(',"verification":"Verified"', "")
    assert ClaimRecord.from_json(older) == dataclasses.replace(record, verification=None)


def test_an_upload_servers_result_reaches_the_upload_verdict() -> None:
    term = TerminationMessage(
        REASON_COMPLETED, "Upload Complete", verification=Verification(VERIFIED, "m")
    )
    pod = {
        "metadata": {"uid": "p"},
        "status": {
            "phase": "Succeeded",
            "containerStatuses": [
                {
                    "name": "cdi-upload-server",
                    "state": {"terminated": {"exitCode": 0, "message": term.to_json()}},
                }
            ],
        },
    }
    verdict = assess(pod, "p")
    assert verdict.action == Action.SUCCEED
    assert verdict.verification == VERIFIED


def _conditions(record: ClaimRecord) -> dict[str, dict[str, Any]]:
    status = compute_status(View("dv", IMPORT_PHASES, pvc_phase="Bound", record=record), None, T0)
    return {c["type"]: c for c in status["conditions"]}


def test_the_datavolume_shows_a_verified_condition_only_where_verification_ran() -> None:
    done = ClaimRecord(outcome="Succeeded", reason="Completed", message="Import Complete")
    assert "Verified" not in _conditions(done)
    verified = _conditions(dataclasses.replace(done, verification=VERIFIED))["Verified"]
    assert (verified["status"], verified["reason"]) == ("True", "Verified")
    skipped = _conditions(dataclasses.replace(done, verification=VERIFICATION_NOT_SUPPORTED))
    assert (skipped["Verified"]["status"], skipped["Verified"]["reason"]) == (
        "False",
        VERIFICATION_NOT_SUPPORTED,
    )
    failed = ClaimRecord(outcome="Failed", reason="VerificationFailed", message="differs")
    condition = _conditions(failed)["Verified"]
    assert (condition["status"], condition["reason"], condition["message"]) == (
        "False",
        "VerificationFailed",
        "differs",
    )
