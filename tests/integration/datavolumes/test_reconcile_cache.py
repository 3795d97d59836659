"""The DataVolume reconciler with the controller's caches, in process, against the real API
server: the requests it saves under load are saved without changing what ends up in the
cluster.

- a claim the claim cache has never seen is created without a GET first, already carrying the
  first importer pod's name (the API server's own watch shows the claim's first version), and
  the pod follows in the same pass with its UID recorded;
- a claim the cache lags behind (it exists, the cache does not know yet) is read after the
  create's 409 and followed, not created twice;
- a DataVolume read from a cache that has not seen the reconciler's own status write is seen
  through that write (``OwnWrites``): the next reconcile does not send a stale status patch;
- a claim read from a cache that has not seen the flavour's own UID record is seen through that
  record: the follow-up finds its pod recorded, no impostor;
- a claim read from a cache that lags behind a record this process does not remember (another
  leader wrote it, or the memory expired) never gets its recorded pod deleted as an impostor:
  the verdict is checked against the claim as the API server holds it;
- under a burst of new DataVolumes the pod's UID record waits for the follow-up, which records
  the pod it made (remembered in memory) instead of taking it for an impostor;
- a finished import's deleted pod is not made again from a claim cache that lags behind the
  success record (a leader change lands the old leader's last writes as the new one starts);
- a DataVolume gone from the cache stays gone, whatever status this process wrote to it last.

The DataVolumes have a vddk source, which the installed product's controller (other tests of
the session start it) leaves alone; the reconciler here fills them with the import flavour, so
the two never race for one DataVolume (as in ``test_flavours``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from cdi.api.constants import SourceKind
from cdi.controller.datavolume import Caches, ControllerConfig, DataVolumeReconciler
from cdi.controller.flavours import FlavourDeps
from cdi.controller.flavours.import_ import ImportSettings
from cdi.controller.flavours.table import standard_flavours
from cdi.controller.record import ANN_IMPORT_POD_UID, OUTCOME_SUCCEEDED, ClaimRecord
from cdi.kube.client import PODS, PVCS, STORAGE_CLASSES, AsyncKube
from cdi.kube.client import Kube as ProductKube
from cdi.kube.events import EventRecorder
from cdi.kube.own_writes import OwnWrites
from cdi.kube.workqueue import Result
from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from tests.integration.datavolumes.cdi_env import datavolume, dv_path
from tests.integration.datavolumes.test_flavours import VDDK, async_kube, no_metrics

__all__ = ["async_kube"]  # the fixture, shared with the flavour tests

pytestmark = pytest.mark.integration

POD_NAME_KEY = "cdi.kubevirt.io/storage.import.importPodName"


class Listed:
    """A cache filled by hand: what an informer would hold at that moment."""

    def __init__(self, items: list[dict[str, Any]], namespaced: bool = True) -> None:
        self.store: dict[str, dict[str, Any]] = {}
        for obj in items:
            meta = obj["metadata"]
            key = f"{meta['namespace']}/{meta['name']}" if namespaced else meta["name"]
            self.store[key] = obj

    def get(self, key: str) -> dict[str, Any] | None:
        return self.store.get(key)

    def items(self) -> list[dict[str, Any]]:
        return list(self.store.values())


async def reconciler(
    kube: AsyncKube,
    dvs: Listed,
    claims: Listed,
    pods: Listed | None = None,
    burst: Callable[[], bool] = lambda: False,
) -> DataVolumeReconciler:
    classes = Listed((await kube.list(STORAGE_CLASSES))["items"], namespaced=False)
    caches = Caches(pods or Listed([]), classes, Listed([]), Listed([]), dvs, claims)
    events = EventRecorder(kube, "cache-test")
    own = OwnWrites()
    deps = FlavourDeps(kube, events, no_metrics, claims=own, burst=burst)
    table = standard_flavours(deps, ImportSettings("importer"))
    table = {**table, SourceKind.VDDK: table[SourceKind.HTTP]}  # the import flavour
    config = ControllerConfig("importer")
    return DataVolumeReconciler(
        kube, caches, events, no_metrics, config, flavours=table, own_claims=own, burst=burst
    )


def vddk_datavolume(name: str) -> dict[str, Any]:
    return datavolume(name, {"vddk": VDDK}, size="8Mi")


def first_claim_version(cluster: Cluster, namespace: str, since: str) -> dict[str, Any]:
    """The claim as the API server first stored it (its ADDED event after ``since``)."""
    kube = ProductKube(cluster.api_client())
    for kind, obj in kube.watch(PVCS, namespace, resource_version=since, timeout_seconds=2):
        if kind == "ADDED":
            return obj
    raise AssertionError("no claim was created")


async def test_a_new_claim_carries_the_first_pod_name_and_the_pod_follows_at_once(
    kube: Kube, namespace: str, async_kube: AsyncKube, cluster: Cluster
) -> None:
    dv = kube.create(dv_path(namespace), vddk_datavolume("fast"))
    since = kube.get(ns_path(namespace, "persistentvolumeclaims"))["metadata"]["resourceVersion"]
    r = await reconciler(async_kube, Listed([dv]), Listed([]))
    await r.reconcile(f"{namespace}/fast")

    created = first_claim_version(cluster, namespace, since)
    assert created["metadata"]["annotations"][POD_NAME_KEY] == "importer-fast"
    pod = kube.get(ns_path(namespace, "pods", "importer-fast"))
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "fast"))
    assert pvc["metadata"]["annotations"][ANN_IMPORT_POD_UID] == pod["metadata"]["uid"]
    assert kube.get(dv_path(namespace, "fast"))["status"]["phase"] == "ImportScheduled"


async def test_a_claim_the_cache_has_not_seen_yet_is_followed_not_created_twice(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    dv = kube.create(dv_path(namespace), vddk_datavolume("lag"))
    first = await reconciler(async_kube, Listed([dv]), Listed([]))
    await first.reconcile(f"{namespace}/lag")
    pod = kube.get(ns_path(namespace, "pods", "importer-lag"))

    # a second process (a new leader) whose claim cache lags: the create says 409, the claim
    # is read and followed; the recorded pod is seen as ours, nothing is created or deleted
    again = await reconciler(async_kube, Listed([dv]), Listed([]), Listed([pod]))
    await again.reconcile(f"{namespace}/lag")
    claims = kube.get(ns_path(namespace, "persistentvolumeclaims"))["items"]
    assert [c["metadata"]["name"] for c in claims] == ["lag"]
    still = kube.get(ns_path(namespace, "pods", "importer-lag"))
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not still["metadata"].get("deletionTimestamp")


async def test_the_reconciler_sees_its_own_status_write_through_a_lagging_cache(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    dv = kube.create(dv_path(namespace), vddk_datavolume("own"))
    r = await reconciler(async_kube, Listed([dv]), Listed([]))
    await r.reconcile(f"{namespace}/own")
    written = kube.get(dv_path(namespace, "own"))
    assert written["status"]["phase"] == "ImportScheduled"

    # the cache still holds the DataVolume without status: a reconcile from it alone would
    # patch the same status over a stale resourceVersion (409) and come back in 0.5 s
    result = await r.reconcile(f"{namespace}/own")
    assert result.requeue_after != 0.5
    assert (
        kube.get(dv_path(namespace, "own"))["metadata"]["resourceVersion"]
        == (written["metadata"]["resourceVersion"])
    )


async def created_with_stale_claim(
    kube: Kube, namespace: str, async_kube: AsyncKube, cluster: Cluster, name: str
) -> tuple[DataVolumeReconciler, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A reconciler that created the claim and the recorded pod; the DataVolume, the claim as
    first stored (the pod's name, no UID record yet: what a lagging cache holds) and the pod."""
    dv = kube.create(dv_path(namespace), vddk_datavolume(name))
    since = kube.get(ns_path(namespace, "persistentvolumeclaims"))["metadata"]["resourceVersion"]
    r = await reconciler(async_kube, Listed([dv]), Listed([]))
    await r.reconcile(f"{namespace}/{name}")
    stale = first_claim_version(cluster, namespace, since)
    assert ANN_IMPORT_POD_UID not in stale["metadata"]["annotations"]
    return r, dv, stale, kube.get(ns_path(namespace, "pods", f"importer-{name}"))


def assert_pod_kept(kube: Kube, namespace: str, pod: dict[str, Any]) -> None:
    still = kube.get(ns_path(namespace, "pods", pod["metadata"]["name"]))
    assert still["metadata"]["uid"] == pod["metadata"]["uid"]
    assert not still["metadata"].get("deletionTimestamp")
    events = kube.get(ns_path(namespace, "events"))["items"]
    assert not [e for e in events if e.get("reason") == "UnrecordedImporterPod"]


async def test_a_follow_up_sees_the_flavours_own_uid_record_through_a_lagging_claim_cache(
    kube: Kube, namespace: str, async_kube: AsyncKube, cluster: Cluster
) -> None:
    r, _, stale, pod = await created_with_stale_claim(
        kube, namespace, async_kube, cluster, "record"
    )
    assert isinstance(r.caches.claims, Listed) and isinstance(r.caches.pods, Listed)
    r.caches.claims.store[f"{namespace}/record"] = stale
    r.caches.pods.store[f"{namespace}/importer-record"] = pod

    # the pod matches the record the flavour wrote (remembered), not the cache's claim: no
    # impostor verdict to check again (that path comes back in 0.5 s)
    result = await r.reconcile(f"{namespace}/record")
    assert result.requeue_after != 0.5
    assert_pod_kept(kube, namespace, pod)
    assert kube.get(dv_path(namespace, "record"))["status"]["phase"] == "ImportScheduled"


async def test_a_recorded_pod_is_not_deleted_when_the_claim_cache_lags_behind_its_record(
    kube: Kube, namespace: str, async_kube: AsyncKube, cluster: Cluster
) -> None:
    _, dv, stale, pod = await created_with_stale_claim(
        kube, namespace, async_kube, cluster, "stale"
    )
    # a process that does not remember the record (a new leader, or its memory expired) and
    # whose claim cache still holds the claim without it: the pod looks unrecorded there
    again = await reconciler(async_kube, Listed([dv]), Listed([stale]), Listed([pod]))
    result = await again.reconcile(f"{namespace}/stale")
    assert result.requeue_after == 0.5  # checked against the server's claim, and waited
    assert_pod_kept(kube, namespace, pod)


async def test_under_a_burst_the_uid_record_waits_for_the_follow_up_and_the_pod_stays(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    pvc, pod, r = await first_reconcile_in_a_burst(kube, namespace, async_kube, "burst")
    r.caches.claims.store[f"{namespace}/burst"] = pvc  # type: ignore[union-attr]
    r.caches.pods.store[f"{namespace}/importer-burst"] = pod  # type: ignore[union-attr]
    await r.reconcile(f"{namespace}/burst")  # the follow-up, the burst over

    assert_pod_kept(kube, namespace, pod)
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "burst"))
    assert pvc["metadata"]["annotations"][ANN_IMPORT_POD_UID] == pod["metadata"]["uid"]
    assert kube.get(dv_path(namespace, "burst"))["status"]["phase"] == "ImportScheduled"
    assert reasons(kube, namespace) == ["ImportScheduled"]


async def test_a_deferred_first_status_keeps_its_phase_event_when_the_follow_up_sees_more(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    """The follow-up finds the pod recorded and already running (the burst ended between the
    pod's create and the status write): it writes ImportInProgress, and the ImportScheduled
    event the deferred write would have brought comes first."""
    _, pod, r = await first_reconcile_in_a_burst(kube, namespace, async_kube, "quick")
    record = {"metadata": {"annotations": {ANN_IMPORT_POD_UID: pod["metadata"]["uid"]}}}
    pvc = kube.patch(ns_path(namespace, "persistentvolumeclaims", "quick"), record)
    running = {**pod, "status": {"phase": "Running"}}
    r.caches.claims.store[f"{namespace}/quick"] = pvc  # type: ignore[union-attr]
    r.caches.pods.store[f"{namespace}/importer-quick"] = running  # type: ignore[union-attr]
    await r.reconcile(f"{namespace}/quick")

    assert kube.get(dv_path(namespace, "quick"))["status"]["phase"] == "ImportInProgress"
    assert reasons(kube, namespace) == ["ImportScheduled", "ImportInProgress"]


async def first_reconcile_in_a_burst(
    kube: Kube, namespace: str, async_kube: AsyncKube, name: str
) -> tuple[dict[str, Any], dict[str, Any], DataVolumeReconciler]:
    """Other new DataVolumes wait: the first reconcile creates the claim and the pod only
    (no UID record, no status, no event: the follow-up's). The claim and pod as created."""
    dv = kube.create(dv_path(namespace), vddk_datavolume(name))
    bursting = [True]
    r = await reconciler(async_kube, Listed([dv]), Listed([]), burst=lambda: bursting[0])
    await r.reconcile(f"{namespace}/{name}")
    bursting[0] = False
    pod = kube.get(ns_path(namespace, "pods", f"importer-{name}"))
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", name))
    assert ANN_IMPORT_POD_UID not in pvc["metadata"]["annotations"]
    assert not kube.get(dv_path(namespace, name)).get("status")
    assert reasons(kube, namespace) == []
    return pvc, pod, r


def reasons(kube: Kube, namespace: str) -> list[str]:
    """The reasons of the DataVolumes' events, oldest first."""
    items = kube.get(ns_path(namespace, "events"))["items"]
    ours = [e for e in items if e["involvedObject"].get("kind") == "DataVolume"]
    return [e["reason"] for e in sorted(ours, key=lambda e: e["metadata"]["name"])]


def added_since(cluster: Cluster, namespace: str, resource: Any, since: str) -> list[str]:
    """The names of the objects of ``resource`` created in ``namespace`` after ``since``."""
    kube = ProductKube(cluster.api_client())
    events = kube.watch(resource, namespace, resource_version=since, timeout_seconds=1)
    return [o["metadata"]["name"] for kind, o in events if kind == "ADDED"]


async def test_a_finished_imports_pod_is_not_made_again_when_the_claim_cache_lags_behind(
    kube: Kube, namespace: str, async_kube: AsyncKube, cluster: Cluster
) -> None:
    """The claim records the pod; then the import's success is recorded and its pod deleted
    (by a leader whose writes landed as the next one took over). The next leader's claim
    cache still shows the record without the outcome, and its pod cache no pod: the pod is
    not made again, because the claim as the API server holds it no longer calls for it."""
    dv = kube.create(dv_path(namespace), vddk_datavolume("done"))
    first = await reconciler(async_kube, Listed([dv]), Listed([]))
    await first.reconcile(f"{namespace}/done")
    claim_path = ns_path(namespace, "persistentvolumeclaims", "done")
    recorded = kube.get(claim_path)
    assert recorded["metadata"]["annotations"][ANN_IMPORT_POD_UID]
    finished = dataclasses.replace(ClaimRecord.from_pvc(recorded), outcome=OUTCOME_SUCCEEDED)
    kube.patch(claim_path, {"metadata": {"annotations": finished.annotations()}})
    kube.delete(ns_path(namespace, "pods", "importer-done"))
    since = kube.get(ns_path(namespace, "pods"))["metadata"]["resourceVersion"]

    dv = kube.get(dv_path(namespace, "done"))
    successor = await reconciler(async_kube, Listed([dv]), Listed([recorded]), Listed([]))
    result = await successor.reconcile(f"{namespace}/done")
    assert result.requeue_after == 1.0  # waits for its claim cache
    assert added_since(cluster, namespace, PODS, since) == []


async def test_a_deleted_datavolume_is_not_brought_back_by_the_reconcilers_own_status_write(
    kube: Kube, namespace: str, async_kube: AsyncKube, cluster: Cluster
) -> None:
    """The DataVolume is deleted right after the reconciler wrote its status (a user deletes
    it as soon as it succeeds); its claim and pod go with it. The caches show it gone: the
    next reconcile creates nothing for it (it used to see the DataVolume through its own
    write, and made claims and pods for it until that memory expired)."""
    dv = kube.create(dv_path(namespace), vddk_datavolume("gone"))
    dvs = Listed([dv])
    r = await reconciler(async_kube, dvs, Listed([]))
    await r.reconcile(f"{namespace}/gone")
    assert kube.get(dv_path(namespace, "gone"))["status"]["phase"] == "ImportScheduled"
    claim_path = ns_path(namespace, "persistentvolumeclaims", "gone")
    claim = kube.get(claim_path)
    kube.delete(dv_path(namespace, "gone"))
    # the garbage collector may delete these first (their owner is gone)
    kube.delete_ignore_missing(claim_path)
    kube.delete_ignore_missing(ns_path(namespace, "pods", "importer-gone"))
    del dvs.store[f"{namespace}/gone"]  # the informers' delete events
    r.own_claims.gone(claim)
    since = kube.get(ns_path(namespace, "persistentvolumeclaims"))["metadata"]["resourceVersion"]

    assert await r.reconcile(f"{namespace}/gone") == Result()
    assert added_since(cluster, namespace, PVCS, since) == []
