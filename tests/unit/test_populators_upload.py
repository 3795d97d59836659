"""The upload and clone populators, the pure parts: their prime claims, which DataVolumes name
a VolumeUploadSource, a DataVolume's upload phases read from its populated claim, the
admission rules of both sources, and how an upload server pod maps to the target's key."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.constants import Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours.upload import UPLOAD_PHASES
from cdi.controller.populators import claim_target_key, worker_pod_target_key
from cdi.controller.populators.datavolume import population_view
from cdi.controller.status import View, compute_phase
from cdi.controller.uploadpvc import is_upload_target
from cdi.render.prime import (
    clone_source_claim,
    is_prime,
    render_clone_prime,
    render_import_source,
    render_prime,
    render_upload_prime,
    upload_source_name,
    uses_populator,
    with_data_source_ref,
)
from cdi.render.upload_pod import UploadPodConfig, render_upload_pod, upload_pod_name
from cdi.upload.readiness import upload_target
from cdi.upload.token import UploadGrant
from cdi.webhooks.populators import validate_populator

A = "cdi.kubevirt.io/"
UID = "0b8c5e1e-1111-4222-8333-444455556666"
KINDS = ("VolumeUploadSource",)


def target(kind: str = "VolumeUploadSource", **annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "disk", "namespace": "ns", "uid": UID, "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Filesystem",
            "storageClassName": "csi",
            "resources": {"requests": {"storage": "1Gi"}},
            "dataSourceRef": {"apiGroup": "cdi.kubevirt.io", "kind": kind, "name": "src"},
        },
        "status": {"phase": "Pending"},
    }


def source(kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": "src", "namespace": "ns"}, "spec": spec}


def test_an_upload_prime_is_an_upload_target_with_the_sources_content_type() -> None:
    prime = render_upload_prime(
        target(), source("VolumeUploadSource", {"contentType": "archive", "preallocation": True})
    )
    ann = prime["metadata"]["annotations"]
    assert prime["metadata"]["name"] == f"prime-{UID}"
    assert is_prime(prime) and not is_prime(target())
    assert is_upload_target(prime)
    assert ann[A + "storage.contentType"] == "archive"
    assert ann[A + "storage.preallocation.requested"] == "true"
    assert ann[A + "storage.populator.kind"] == "VolumeUploadSource"
    assert prime["metadata"]["ownerReferences"][0]["uid"] == UID
    assert "dataSourceRef" not in prime["spec"]  # the provisioner provisions it normally
    plain = render_upload_prime(target(), source("VolumeUploadSource", {}))
    assert plain["metadata"]["annotations"][A + "storage.contentType"] == "kubevirt"
    assert A + "storage.preallocation.requested" not in plain["metadata"]["annotations"]


def test_the_upload_server_of_a_prime_is_named_and_owned_after_the_prime() -> None:
    prime = {**render_upload_prime(target(), source("VolumeUploadSource", {})), "status": {}}
    prime["metadata"]["uid"] = "prime-uid"
    pod = render_upload_pod(prime, UploadPodConfig(image="uploadserver", deadline="2030"))
    assert pod["metadata"]["name"] == upload_pod_name(f"prime-{UID}")
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "prime-uid"
    claims = {f"ns/prime-{UID}": prime}
    assert worker_pod_target_key(pod, claims.get, KINDS) == "ns/disk"
    # an importer pod (owned by the target itself) keeps mapping to the target
    importer = {"metadata": {"namespace": "ns", "ownerReferences": [
        {"controller": True, "kind": "PersistentVolumeClaim", "name": "disk"}
    ]}}  # fmt: skip
    assert worker_pod_target_key(importer, {"ns/disk": target()}.get, KINDS) == "ns/disk"
    assert worker_pod_target_key({"metadata": {"namespace": "ns"}}, claims.get, KINDS) is None
    assert claim_target_key(prime, KINDS) == "ns/disk"


def test_the_proxy_relays_a_token_for_the_target_to_the_ready_prime() -> None:
    grant = UploadGrant("ns", "disk", UID)
    prime = render_upload_prime(target(), source("VolumeUploadSource", {}))
    named = target(**{A + "storage.populator.pvcPrime": prime["metadata"]["name"]})
    assert upload_target(grant, named, prime) is None  # not ready yet
    prime["metadata"]["annotations"][A + "storage.pod.ready"] = "true"
    assert upload_target(grant, named, prime) is prime


def dv(source_: dict[str, Any], **annotations: str) -> DataVolume:
    return DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {
                "name": "d",
                "namespace": "ns",
                "uid": "dv-uid",
                "annotations": annotations,
            },
            "spec": {
                "source": source_,
                "contentType": "archive",
                "storage": {"resources": {"requests": {"storage": "1Gi"}}},
            },
        }
    )


def test_an_upload_datavolume_names_its_own_volume_upload_source() -> None:
    d = dv({"upload": {}})
    assert uses_populator(d, csi_storage=True)
    assert not uses_populator(d, csi_storage=False)
    assert not uses_populator(dv({"upload": {}}, **{A + "storage.usePopulator": "false"}), True)
    vus = render_import_source(d)
    assert vus["kind"] == "VolumeUploadSource"
    assert vus["metadata"]["name"] == upload_source_name(d) == "volume-upload-source-dv-uid"
    assert vus["metadata"]["ownerReferences"][0]["uid"] == "dv-uid"
    assert vus["spec"] == {"contentType": "archive"}
    assert validate_populator(vus).allowed
    ref = with_data_source_ref({"spec": {}}, vus)["spec"]["dataSourceRef"]
    assert ref["kind"] == "VolumeUploadSource"


def upload_phase(**annotations: str) -> Phase:
    pvc = target(**annotations)
    return compute_phase(population_view(View(claim_name="disk", phases=UPLOAD_PHASES), pvc, False))


def test_an_upload_datavolumes_phases_follow_its_populated_claim() -> None:
    assert upload_phase(**{A + "storage.pod.phase": "Pending"}) == Phase.UPLOAD_SCHEDULED
    assert upload_phase(**{A + "storage.pod.phase": "Running"}) == Phase.UPLOAD_READY
    assert upload_phase(**{A + "storage.pod.phase": "Succeeded"}) == Phase.REBIND_IN_PROGRESS
    failed = {A + "storage.pod.phase": "Failed", A + "storage.import.fatalError": "true"}
    assert upload_phase(**failed) == Phase.FAILED


@pytest.mark.parametrize(
    ("content", "allowed"), [("", True), ("archive", True), ("kubevirt", True), ("invalid", False)]
)
def test_an_upload_sources_content_type_is_one_cdi_knows(content: str, allowed: bool) -> None:
    verdict = validate_populator(source("VolumeUploadSource", {"contentType": content}))
    assert verdict.allowed is allowed
    if not allowed:
        assert verdict.messages == ["ContentType not one of: kubevirt, archive"]


def test_populator_source_specs_cannot_change() -> None:
    for kind, old, new in (
        ("VolumeUploadSource", {"contentType": "archive"}, {"contentType": "kubevirt"}),
        (
            "VolumeCloneSource",
            {"source": {"kind": "PersistentVolumeClaim", "name": "a"}},
            {"source": {"kind": "PersistentVolumeClaim", "name": "b"}},
        ),
    ):
        assert validate_populator(source(kind, old), source(kind, old)).allowed
        verdict = validate_populator(source(kind, new), source(kind, old))
        assert verdict.messages == [f"Cannot update {kind} Spec"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({}, "Missing clone source"),
        ({"source": {"kind": "PersistentVolumeClaim"}}, "Missing clone source"),
        (
            {"source": {"kind": "VolumeSnapshot", "name": "s"}},
            "Unsupported clone source kind 'VolumeSnapshot'",
        ),
    ],
)
def test_bad_clone_sources_are_refused(spec: dict[str, Any], message: str) -> None:
    verdict = validate_populator(source("VolumeCloneSource", spec))
    assert not verdict.allowed and verdict.messages == [message]


def test_a_clone_prime_asks_the_provisioner_for_a_clone_of_the_source() -> None:
    vcs = source(
        "VolumeCloneSource", {"source": {"kind": "PersistentVolumeClaim", "name": "golden"}}
    )
    assert validate_populator(vcs).allowed
    assert clone_source_claim(vcs) == "golden"
    prime = render_clone_prime(target("VolumeCloneSource"), vcs)
    assert prime["spec"]["dataSource"] == {"kind": "PersistentVolumeClaim", "name": "golden"}
    assert prime["metadata"]["annotations"][A + "storage.populator.kind"] == "VolumeCloneSource"
    assert claim_target_key(prime, ("VolumeCloneSource",)) == "ns/disk"
    assert "dataSource" not in render_prime(target(), source("VolumeImportSource", {}))["spec"]
