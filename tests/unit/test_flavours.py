"""Flavour selection by the DataVolume's source, and status computed for a non-import flavour.

The flavours in the status tests are ``FlavourPhases`` values shaped like the upload and clone
flavours that issues 11 and 12 add (CDI's phases for them); they are the protocol's data, not
doubles of our API.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from kubernetes import client

from cdi.api.constants import Phase, SourceKind
from cdi.api.types import DataVolume
from cdi.controller.flavours import (
    EXTERNAL,
    Claim,
    FlavourDefaults,
    FlavourDeps,
    FlavourTable,
    PhaseEvent,
    Unsupported,
    select_flavour,
)
from cdi.controller.flavours.clone import CloneFlavour
from cdi.controller.flavours.import_ import ImportFlavour, ImportSettings
from cdi.controller.flavours.table import standard_flavours
from cdi.controller.flavours.upload import UploadFlavour
from cdi.controller.progress import Progress
from cdi.controller.record import ClaimRecord
from cdi.controller.status import FlavourPhases, View, compute_status
from cdi.kube.client import AsyncKube, Kube
from cdi.kube.events import EventRecorder
from cdi.kube.workqueue import Result

T0 = "2026-01-01T00:00:00Z"
SOURCES: dict[SourceKind, dict[str, Any]] = {
    SourceKind.HTTP: {"url": "https://h/disk.img"},
    SourceKind.S3: {"url": "https://s3/b/disk.img"},
    SourceKind.GCS: {"url": "gs://b/disk.img"},
    SourceKind.REGISTRY: {"url": "docker://quay.io/a/b"},
    SourceKind.BLANK: {},
    SourceKind.UPLOAD: {},
    SourceKind.PVC: {"namespace": "ns", "name": "golden"},
    SourceKind.SNAPSHOT: {"namespace": "ns", "name": "snap"},
    SourceKind.IMAGEIO: {"url": "https://ovirt/api", "diskId": "d", "secretRef": "s"},
    SourceKind.VDDK: {"url": "https://vc", "uuid": "u", "backingFile": "f", "secretRef": "s"},
}
IMPORTED = {SourceKind.HTTP, SourceKind.S3, SourceKind.GCS, SourceKind.REGISTRY, SourceKind.BLANK}
FILLED = IMPORTED | {SourceKind.UPLOAD}

UPLOAD = FlavourPhases(
    scheduled=Phase.UPLOAD_SCHEDULED,
    in_progress=Phase.UPLOAD_READY,
    worker="Upload server",
    activity="Upload",
)
CLONE = FlavourPhases(
    scheduled=Phase.CLONE_SCHEDULED,
    in_progress=Phase.CLONE_IN_PROGRESS,
    worker="Clone source",
    activity="Clone",
)


def datavolume(spec: Mapping[str, Any]) -> DataVolume:
    storage = {"storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    return DataVolume.from_dict(
        {"metadata": {"name": "disk", "namespace": "ns", "uid": "u"}, "spec": {**spec, **storage}}
    )


def from_source(kind: SourceKind) -> DataVolume:
    return datavolume({"source": {str(kind): SOURCES[kind]}})


@pytest.fixture
def table() -> Iterator[FlavourTable]:
    # A client that is never called: no request leaves the process in these tests.
    kube = AsyncKube(Kube(client.ApiClient(client.Configuration())))
    try:
        deps = FlavourDeps(kube, EventRecorder(kube, "test"), no_metrics)
        yield standard_flavours(deps, ImportSettings(image="importer"))
    finally:
        kube.close()


async def no_metrics(pod_ip: str, port: int) -> str | None:
    return None


def test_every_source_kind_has_an_entry_in_the_table(table: FlavourTable) -> None:
    assert set(table) == set(SourceKind) | {EXTERNAL}  # and a claim dataSourceRef


@pytest.mark.parametrize("kind", sorted(IMPORTED))
def test_import_sources_are_filled_by_the_import_flavour(
    table: FlavourTable, kind: SourceKind
) -> None:
    chosen = select_flavour(from_source(kind), table)
    assert isinstance(chosen, ImportFlavour)
    assert chosen.phases.scheduled == Phase.IMPORT_SCHEDULED


def test_upload_is_filled_by_the_upload_flavour(table: FlavourTable) -> None:
    chosen = select_flavour(from_source(SourceKind.UPLOAD), table)
    assert isinstance(chosen, UploadFlavour)
    assert chosen.phases.in_progress == Phase.UPLOAD_READY


CLONED = {SourceKind.PVC, SourceKind.SNAPSHOT}


@pytest.mark.parametrize("kind", sorted(set(SourceKind) - FILLED - CLONED))
def test_other_sources_are_not_supported_yet_and_say_so(
    table: FlavourTable, kind: SourceKind
) -> None:
    chosen = select_flavour(from_source(kind), table)
    assert isinstance(chosen, Unsupported)
    assert chosen.source == kind
    assert "not supported yet" in chosen.message


def test_clones_and_datasource_references_get_the_clone_flavour(table: FlavourTable) -> None:
    dv = datavolume({"sourceRef": {"kind": "DataSource", "name": "fedora"}})
    assert isinstance(select_flavour(dv, table), CloneFlavour)
    for kind in CLONED:
        assert isinstance(select_flavour(from_source(kind), table), CloneFlavour)


class StubUpload(FlavourDefaults):
    """A second flavour, as the upload flavour will plug in: only the table changes."""

    phases = UPLOAD
    events: Mapping[str, PhaseEvent] = {}

    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        return view, Result()

    async def finish(self, claim: Claim) -> None:
        return None


def test_a_new_flavour_is_one_table_entry(table: FlavourTable) -> None:
    upload = StubUpload()
    extended: FlavourTable = {**table, SourceKind.UPLOAD: upload}
    assert select_flavour(from_source(SourceKind.UPLOAD), extended) is upload
    assert isinstance(select_flavour(from_source(SourceKind.HTTP), extended), ImportFlavour)


def conds(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


@pytest.mark.parametrize(
    ("observed", "phase"),
    [
        ({"pvc_phase": "Bound"}, "PVCBound"),
        ({"pvc_phase": "Bound", "pod_phase": "Pending"}, "UploadScheduled"),
        ({"pvc_phase": "Bound", "pod_phase": "Running"}, "UploadReady"),
        ({"pvc_phase": "Pending", "waiting_for_consumer": True}, "WaitForFirstConsumer"),
        ({"pvc_phase": "Bound", "record": ClaimRecord(outcome="Succeeded")}, "Succeeded"),
        ({"pvc_phase": "Lost"}, "Failed"),
    ],
)
def test_upload_flavour_status_uses_its_own_phases(observed: dict[str, Any], phase: str) -> None:
    assert compute_status(View("disk", UPLOAD, **observed), None, T0)["phase"] == phase


def test_upload_flavour_conditions_use_its_own_words() -> None:
    pending = conds(
        compute_status(View("disk", UPLOAD, pvc_phase="Bound", pod_phase="Pending"), None, T0)
    )
    assert pending["Running"]["message"] == "Upload server pod pending"
    assert (pending["Ready"]["status"], pending["Ready"]["reason"]) == ("False", "TransferRunning")
    progress = Progress(percent=50.0, bytes_done=1024**2, bytes_total=2 * 1024**2, rate=1024**2)
    ready = View("disk", UPLOAD, pvc_phase="Bound", pod_phase="Running", progress=progress)
    status = compute_status(ready, None, T0)
    running = conds(status)["Running"]
    assert (running["status"], running["message"]) == (
        "True",
        "Upload in progress: 1.0 MiB of 2.0 MiB at 1.0 MiB/s",
    )
    assert status["progress"] == "50.00%"


def test_a_flavour_step_of_its_own_is_the_phase_until_the_outcome() -> None:
    csi = View("disk", CLONE, pvc_phase="Pending", step=Phase.CSI_CLONE_IN_PROGRESS)
    status = compute_status(csi, {"progress": "10.00%"}, T0)
    assert status["phase"] == "CSICloneInProgress"
    assert status["progress"] == "10.00%"
    assert conds(status)["Ready"]["reason"] == "TransferRunning"
    done = View(
        "disk",
        CLONE,
        pvc_phase="Bound",
        step=Phase.CSI_CLONE_IN_PROGRESS,
        record=ClaimRecord(outcome="Succeeded", reason="Completed", message="Clone Complete"),
    )
    status = compute_status(done, status, T0)
    assert (status["phase"], status["progress"]) == ("Succeeded", "100.0%")
    assert conds(status)["Running"]["message"] == "Clone Complete"
