"""The flavour seam against the real API server: the reconciler, in process, picks the flavour
from the DataVolume's source, does the shared claim work itself, and writes the status the
flavour's phases say.

``PretendUpload`` stands in the table under ``vddk``, a source the installed product's own
controller leaves alone (every other source has a real flavour now, and the product's controller
would race the in-process reconciler for the DataVolume): a ``Flavour`` with the upload phases
which reports its server pod scheduled. Everything else is the product: the
reconciler, ``AsyncKube`` (every verb it uses here goes to the API server through the typed
descriptor), the event recorder, the PVC renderer, the testkit provisioner binding the claim.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from cdi.api.constants import Phase, SourceKind
from cdi.controller.datavolume import Caches, ControllerConfig, DataVolumeReconciler
from cdi.controller.flavours import Claim, FlavourDefaults, FlavourDeps, FlavourTable, PhaseEvent
from cdi.controller.flavours.import_ import ImportSettings
from cdi.controller.flavours.table import standard_flavours
from cdi.controller.status import FlavourPhases, View
from cdi.kube.client import STORAGE_CLASSES, AsyncKube
from cdi.kube.client import Kube as ProductKube
from cdi.kube.events import NORMAL, EventRecorder
from cdi.kube.workqueue import Result
from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import condition, datavolume, dv_path, events_for

pytestmark = pytest.mark.integration


class PretendUpload(FlavourDefaults):
    """In the upload flavour's place: its worker is always just scheduled."""

    phases = FlavourPhases(
        scheduled=Phase.UPLOAD_SCHEDULED,
        in_progress=Phase.UPLOAD_READY,
        worker="Upload server",
        activity="Upload",
    )
    events: Mapping[str, PhaseEvent] = {
        Phase.UPLOAD_SCHEDULED: PhaseEvent(NORMAL, "UploadScheduled", "Upload into {claim} ready")
    }

    def __init__(self) -> None:
        self.synced: list[Claim] = []

    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        self.synced.append(claim)
        return dataclasses.replace(view, pod_phase="Pending"), Result(requeue_after=1.0)

    async def finish(self, claim: Claim) -> None:
        return None


class Listed:
    """A cache filled by one list: enough for a reconcile that only reads it."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.store = {str(o["metadata"]["name"]): o for o in items}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.store.get(key)

    def items(self) -> list[dict[str, Any]]:
        return list(self.store.values())


@pytest.fixture
def async_kube(cluster: Cluster, cdi_crds: None) -> Iterator[AsyncKube]:
    kube = AsyncKube(ProductKube(cluster.api_client()))
    yield kube
    kube.close()


async def reconciler(kube: AsyncKube, table: FlavourTable | None) -> DataVolumeReconciler:
    classes = (await kube.list(STORAGE_CLASSES))["items"]
    caches = Caches(Listed([]), Listed(classes), Listed([]), Listed([]))
    events = EventRecorder(kube, "flavour-test")
    return DataVolumeReconciler(
        kube, caches, events, no_metrics, ControllerConfig(), flavours=table
    )


async def no_metrics(pod_ip: str, port: int) -> str | None:
    return None


VDDK = {"url": "https://vc", "uuid": "u", "backingFile": "f", "secretRef": "s", "thumbprint": "t"}


def standard(kube: AsyncKube) -> FlavourTable:
    deps = FlavourDeps(kube, EventRecorder(kube, "flavour-test"), no_metrics)
    return standard_flavours(deps, ImportSettings(image="importer"))


async def test_the_source_picks_the_flavour_and_its_phases_become_the_status(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    upload = PretendUpload()
    table = {**standard(async_kube), SourceKind.VDDK: upload}
    r = await reconciler(async_kube, table)
    kube.create(dv_path(namespace), datavolume("up", {"vddk": VDDK}))

    await r.reconcile(f"{namespace}/up")  # creates the claim; the flavour waits for it
    claim_path = f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/up"
    pvc = kube.get(claim_path)
    assert pvc["metadata"]["ownerReferences"][0]["name"] == "up"
    assert kube.get(dv_path(namespace, "up"))["status"]["phase"] == "Pending"
    assert upload.synced == []
    wait_until(lambda: kube.get(claim_path)["status"].get("phase") == "Bound", "claim bound", 60)

    await r.reconcile(f"{namespace}/up")
    assert [c.name for c in upload.synced] == ["up"]
    dv = kube.get(dv_path(namespace, "up"))
    assert dv["status"]["phase"] == "UploadScheduled"
    assert condition(dv, "Running")["message"] == "Upload server pod pending"
    assert condition(dv, "Ready")["reason"] == "TransferRunning"
    assert condition(dv, "Bound")["status"] == "True"
    reasons = {e["reason"]: e["message"] for e in events_for(kube, namespace, "up")}
    assert reasons["UploadScheduled"] == "Upload into up ready"


async def test_a_source_with_no_flavour_yet_is_left_alone(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    r = await reconciler(async_kube, None)  # the standard table
    kube.create(dv_path(namespace), datavolume("vm", {"vddk": VDDK}))
    await r.reconcile(f"{namespace}/vm")
    assert kube.get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/vm") is None
    assert "status" not in kube.get(dv_path(namespace, "vm"))
