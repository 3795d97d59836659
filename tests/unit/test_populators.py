"""Volume populators, the pure parts: the prime claim, the import it runs, the rebind, which
DataVolumes take the populator road, their status read from the claim, the admission rules,
and how watched objects map to the target claim's key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cdi.api.constants import Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours.import_ import IMPORT_PHASES
from cdi.controller.populators import claim_target_key, pod_target_key
from cdi.controller.populators.datavolume import parse_progress, population_view
from cdi.controller.status import View, compute_phase
from cdi.render import RenderError
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.prime import (
    import_request,
    import_source_name,
    prime_name,
    rebind_patch,
    render_import_source,
    render_prime,
    uses_populator,
    with_data_source_ref,
)
from cdi.webhooks.populators import validate_populator
from testkit.vm import VmError, between_markers, kernel_release

A = "cdi.kubevirt.io/"
UID = "0b8c5e1e-1111-4222-8333-444455556666"
VIS_REF = {"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": "src"}


def target(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "disk", "namespace": "ns", "uid": UID, "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}},
            "dataSourceRef": VIS_REF,
        },
        "status": {"phase": "Pending"},
    }


def source(spec: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "VolumeImportSource", "metadata": {"name": "src"}, "spec": spec}


HTTP = {"source": {"http": {"url": "https://example.com/disk.qcow2"}}, "preallocation": True}


def test_prime_copies_the_targets_storage_and_node_and_records_the_source() -> None:
    prime = render_prime(target(**{"volume.kubernetes.io/selected-node": "n1"}), source(HTTP))
    meta = prime["metadata"]
    assert meta["name"] == prime_name(UID) == f"prime-{UID}"
    assert meta["ownerReferences"][0]["uid"] == UID
    assert meta["ownerReferences"][0]["kind"] == "PersistentVolumeClaim"
    assert meta["annotations"]["volume.kubernetes.io/selected-node"] == "n1"
    assert json.loads(meta["annotations"][A + "storage.populator.source"]) == HTTP
    spec = prime["spec"]
    assert "dataSourceRef" not in spec  # the provisioner fills the prime normally
    assert (spec["volumeMode"], spec["storageClassName"]) == ("Block", "fast")
    assert spec["resources"] == {"requests": {"storage": "1Gi"}}


def test_the_importer_pod_of_a_prime_is_owned_by_the_target_and_writes_the_prime() -> None:
    t = target()
    prime = {**render_prime(t, source(HTTP)), "spec": {**t["spec"]}}
    request = import_request(t, prime)
    assert request.spec.preallocation is True and request.uid == UID
    pod = render_importer_pod(request, prime, ImporterPodConfig(image="importer"))
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["apiVersion"], owner["uid"]) == (
        "PersistentVolumeClaim",
        "v1",
        UID,
    )
    claims = [
        v["persistentVolumeClaim"]["claimName"]
        for v in pod["spec"]["volumes"]
        if "persistentVolumeClaim" in v
    ]
    assert claims == [prime_name(UID)]
    assert pod["metadata"]["name"] == f"importer-prime-{UID}"


@pytest.mark.parametrize("recorded", [None, "not json", json.dumps({"source": {}})])
def test_an_unusable_recorded_source_is_a_render_error(recorded: str | None) -> None:
    prime = {"metadata": {"annotations": {A + "storage.populator.source": recorded}}}
    with pytest.raises(RenderError):
        import_request(target(), prime)


def test_rebind_points_the_volume_at_the_target_without_a_resource_version() -> None:
    ref = rebind_patch(target())["spec"]["claimRef"]
    assert (ref["name"], ref["namespace"], ref["uid"]) == ("disk", "ns", UID)
    assert ref["resourceVersion"] is None  # a merge patch deletes the prime's


def dv(source: dict[str, Any], **annotations: str) -> DataVolume:
    return DataVolume.from_dict(
        {
            "metadata": {
                "name": "d",
                "namespace": "ns",
                "uid": "dv-uid",
                "annotations": annotations,
            },
            "spec": {"source": source, "storage": {}},
        }
    )


@pytest.mark.parametrize(
    ("source", "annotation", "csi", "expected"),
    [
        ({"http": {"url": "http://x/y"}}, None, True, True),
        ({"blank": {}}, None, False, False),
        ({"blank": {}}, "true", False, True),
        ({"http": {"url": "http://x/y"}}, "false", True, False),
        ({"upload": {}}, None, True, True),  # through a VolumeUploadSource
        ({"upload": {}}, "false", True, False),
        ({"pvc": {"namespace": "a", "name": "b"}}, None, True, False),
    ],
)
def test_which_datavolumes_use_the_populator(
    source: dict[str, Any], annotation: str | None, csi: bool, expected: bool
) -> None:
    ann = {A + "storage.usePopulator": annotation} if annotation else {}
    assert uses_populator(dv(source, **ann), csi) is expected


def test_a_datavolumes_import_source_is_owned_by_it_and_named_by_the_claim() -> None:
    d = dv({"http": {"url": "http://x/y", "checksum": "sha256:" + "a" * 64}})
    vis = render_import_source(d)
    assert vis["metadata"]["name"] == import_source_name(d) == "volume-import-source-dv-uid"
    assert vis["metadata"]["ownerReferences"][0]["uid"] == "dv-uid"
    assert vis["spec"]["source"]["http"]["checksum"] == "sha256:" + "a" * 64
    assert validate_populator(vis).allowed
    pvc = with_data_source_ref({"spec": {"volumeMode": "Block"}}, vis)
    assert pvc["spec"]["dataSourceRef"]["name"] == vis["metadata"]["name"]


def view_of(pvc: dict[str, Any], wffc: bool = False) -> tuple[Phase, View]:
    v = population_view(View(claim_name="disk", phases=IMPORT_PHASES), pvc, wffc)
    return compute_phase(v), v


def test_datavolume_phases_follow_the_populated_claim() -> None:
    assert view_of(target(), wffc=True)[0] == Phase.PENDING_POPULATION
    node = {"volume.kubernetes.io/selected-node": "n1"}
    assert view_of(target(**node), wffc=True)[0] == Phase.PENDING
    running = target(
        **{A + "storage.pod.phase": "Running", A + "storage.populator.progress": "42.50%"}
    )
    phase, v = view_of(running)
    assert phase == Phase.IMPORT_IN_PROGRESS and v.progress is not None
    assert v.progress.text == "42.50%"
    done = {A + "storage.pod.phase": "Succeeded", A + "storage.populator.progress": "100.0%"}
    assert view_of(target(**done))[0] == Phase.REBIND_IN_PROGRESS
    bound = {**target(**done), "status": {"phase": "Bound"}}
    assert view_of(bound)[0] == Phase.SUCCEEDED
    failed = target(**{A + "storage.pod.phase": "Failed", A + "storage.import.fatalError": "true"})
    assert view_of(failed)[0] == Phase.FAILED


def test_progress_text_is_parsed_only_when_it_is_a_percentage() -> None:
    assert parse_progress("7.25%") is not None
    assert parse_progress("N/A") is None and parse_progress(None) is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"source": {}}, "Missing import source"),
        ({"source": {"blank": {}, "http": {"url": "http://x"}}}, "Multiple import sources"),
        (
            {"source": {"http": {"url": "ftp://x/y"}}},
            "spec.source Invalid source URL scheme: ftp://x/y",
        ),
        (
            {"source": {"blank": {}}, "contentType": "tarball"},
            "ContentType not one of: kubevirt, archive",
        ),
        (
            {
                "source": {"http": {"url": "http://x"}},
                "checkpoints": [{"previous": "", "current": "a"}],
            },
            "Unable to do multi-stage import without specifying a target claim",
        ),
    ],
)
def test_bad_import_sources_are_refused_with_cdis_messages(
    spec: dict[str, Any], message: str
) -> None:
    verdict = validate_populator(source(spec))
    assert not verdict.allowed and verdict.messages == [message]


def test_an_import_sources_spec_cannot_change() -> None:
    old = source(HTTP)
    assert validate_populator(old, old).allowed  # metadata-only update
    verdict = validate_populator(source({"source": {"blank": {}}}), old)
    assert verdict.messages == ["Cannot update VolumeImportSource Spec"]


def test_watched_objects_map_to_the_target_claim() -> None:
    kinds = ("VolumeImportSource",)
    assert claim_target_key(target(), kinds) == "ns/disk"
    prime = render_prime(target(), source(HTTP))
    assert claim_target_key(prime, kinds) == "ns/disk"
    plain = {"metadata": {"name": "p", "namespace": "ns"}, "spec": {}}
    assert claim_target_key(plain, kinds) is None
    pod = {"metadata": {"namespace": "ns", "ownerReferences": prime["metadata"]["ownerReferences"]}}
    assert pod_target_key(pod) == "ns/disk"


def test_the_vm_console_marker_is_found_behind_terminal_escapes() -> None:
    console = "\x1bc\x1b[?7lCDI-VM-MARKER-BEGIN\r\nhello\r\nCDI-VM-MARKER-END\r\n[ 1.0] reboot"
    assert between_markers(console) == "hello"
    assert between_markers("no ext4 filesystem on /dev/vda\n") is None


def test_the_vm_boots_the_newest_kernel_that_has_its_modules(tmp_path: Path) -> None:
    boot, modules = tmp_path / "boot", tmp_path / "modules"
    for release, has_modules in (
        ("6.1.0-9-amd64", True),
        ("6.1.0-57-amd64", True),
        ("6.2.0-1-amd64", False),
    ):
        (boot / f"vmlinuz-{release}").parent.mkdir(exist_ok=True)
        (boot / f"vmlinuz-{release}").write_bytes(b"")
        if has_modules:
            (modules / release).mkdir(parents=True)
            (modules / release / "modules.dep").write_text("")
    assert kernel_release(boot, modules) == "6.1.0-57-amd64"
    with pytest.raises(VmError):
        kernel_release(tmp_path / "empty", modules)
