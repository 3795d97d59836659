"""The VolumeImportSource populator: fill ``prime-<uid>`` by an import, then hand its PV over.

``reconcile(target key)`` is level-triggered and takes one step from what it reads fresh:

1. target gone, being deleted, bound already (population over: the prime, if still there, is
   deleted) or not naming a ``VolumeImportSource``: nothing more to do. A deleted target takes
   its prime and importer pods with it (both are owned by it), and the prime's PV goes with
   the prime, so nothing is left behind;
2. no prime yet: on WaitForFirstConsumer storage wait until the scheduler picked a node for a
   consumer (``selected-node`` on the target; the DataVolume says PendingPopulation) unless
   immediate binding is asked for (the importer pod is then the consumer), then read
   the source and create the prime (``cdi.render.prime.render_prime``) on that node;
3. prime bound (or bindable by its first consumer, on WaitForFirstConsumer storage), import not
   finished: one step of the import flavour
   (``cdi.controller.flavours.import_``: importer pods per attempt, failure policy, progress),
   exactly as for a DataVolume, with the prime as the claim it writes and the target as the
   object its events are about;
4. import succeeded: point the prime's PV at the target (``claimRef``); the PV binder binds
   the target, which brings us to 1. Failed for good: the target stays unbound forever, with
   the reason on it and a Warning event.

The target carries what a user (or the DataVolume reconciler) needs to see: the prime's name
(``storage.populator.pvcPrime``), progress (``storage.populator.progress``) and the import's
record (``storage.pod.phase``, restarts, last reason and message), mirrored from the prime.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_POD_PHASE,
    ANN_POPULATOR_PROGRESS,
    ANN_PVC_PRIME_NAME,
    ANN_RETAIN_AFTER_COMPLETION,
    KIND_VOLUME_IMPORT_SOURCE,
    PROGRESS_COMPLETE,
)
from cdi.controller.datavolume import Store
from cdi.controller.flavours import JSON, Claim
from cdi.controller.flavours.import_ import IMPORT_PHASES, ImportFlavour
from cdi.controller.pods import owned_pods
from cdi.controller.populators.datavolume import pending_population
from cdi.controller.progress import Progress
from cdi.controller.record import (
    ANN_IMPORT_POD_UID,
    OUTCOME_FAILED,
    OUTCOME_SUCCEEDED,
    ImportRecord,
)
from cdi.controller.status import View
from cdi.kube.client import PVCS, PVS, VOLUME_IMPORT_SOURCES, AsyncKube, split_key
from cdi.kube.errors import Conflict, NotFound
from cdi.kube.events import NORMAL, WARNING, EventRecorder
from cdi.kube.workqueue import Result
from cdi.render import RenderError
from cdi.render.prime import (
    claim_ref_uid,
    import_request,
    populator_kind,
    prime_name,
    rebind_patch,
    render_prime,
    source_name,
)

log = logging.getLogger(__name__)

# CDI's event reasons on the target claim.
REASON_PRIME_CREATED = "CreatedPVCPrimeSuccessfully"
REASON_SOURCE_MISSING = "VolumeImportSourceMissing"
REASON_REBIND = "RebindInProgress"
REASON_POPULATED = "ImportSucceeded"
REASON_FAILED = "ImportFailed"
SOURCE_RECHECK = 5.0  # seconds: no informer on VolumeImportSources, so a missing one is polled
# Ours: the reason of the last wait event on the target, so a polled wait is said once.
ANN_LAST_EVENT = "cdi.kubevirt.io/storage.populator.lastEvent"


class ImportPopulator:
    """Populate claims whose ``dataSourceRef`` names a ``VolumeImportSource``."""

    kinds = (KIND_VOLUME_IMPORT_SOURCE,)

    def __init__(
        self,
        kube: AsyncKube,
        pods: Store,
        storage_classes: Store,
        cdi_config: Callable[[], CDIConfig],
        events: EventRecorder,
        flavour: ImportFlavour,
    ) -> None:
        self.kube = kube
        self.pods = pods
        self.storage_classes = storage_classes
        self.cdi_config = cdi_config
        self.events = events
        self.flavour = flavour

    async def reconcile(self, key: str) -> Result:
        namespace, name = split_key(key)
        target = await self.kube.get_or_none(PVCS, name, namespace)
        if target is None or target["metadata"].get("deletionTimestamp"):
            return Result()
        if populator_kind(target) not in self.kinds:
            return Result()
        prime = await self.kube.get_or_none(PVCS, prime_name(target["metadata"]["uid"]), namespace)
        if (target.get("spec") or {}).get("volumeName"):
            if prime is not None:
                await self._finish(target, prime)
            return Result()
        if prime is None:
            return await self._create_prime(target)
        return await self._populate(target, prime)

    # -- 2: the prime --------------------------------------------------------------------
    def waits_for_consumer(self, pvc: JSON) -> bool:
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        sc = self.storage_classes.get(str(sc_name)) if sc_name else None
        return bool(sc and sc.get("volumeBindingMode") == "WaitForFirstConsumer")

    async def _create_prime(self, target: JSON) -> Result:
        if pending_population(target, self.waits_for_consumer(target)):
            return Result()  # the scheduler's selected-node annotation re-queues us
        meta = target["metadata"]
        source = await self.kube.get_or_none(
            VOLUME_IMPORT_SOURCES, source_name(target), meta["namespace"]
        )
        if source is None:
            await self._event_once(
                target,
                WARNING,
                REASON_SOURCE_MISSING,
                f"VolumeImportSource {source_name(target)} not found; waiting for it",
            )
            return Result(requeue_after=SOURCE_RECHECK)
        prime = render_prime(target, source)
        try:
            await self.kube.create(PVCS, prime, meta["namespace"])
        except Conflict:
            return Result(requeue_after=1.0)
        await self._annotate(target, {ANN_PVC_PRIME_NAME: prime["metadata"]["name"]})
        await self.events.emit(
            target, NORMAL, REASON_PRIME_CREATED, "PVC Prime created successfully"
        )
        return Result(requeue_after=1.0)

    # -- 3: the import -------------------------------------------------------------------
    async def _populate(self, target: JSON, prime: JSON) -> Result:
        record = ImportRecord.from_pvc(prime)
        if record.outcome == OUTCOME_SUCCEEDED:
            return await self._rebind(target, prime, record)
        if record.outcome == OUTCOME_FAILED:
            if await self._mirror(target, record, None, None):
                message = f"{record.reason}: {record.message}"
                await self.events.emit(target, WARNING, REASON_FAILED, message)
            return Result()
        bound = (prime.get("status") or {}).get("phase") == "Bound"
        if not bound and not self.waits_for_consumer(prime):
            return Result()  # the prime's binding re-queues us; on WFFC the pod binds it
        try:
            request = import_request(target, prime)
        except RenderError as exc:
            log.warning("%s: %s", target["metadata"]["name"], exc.message)
            await self._event_once(target, WARNING, exc.reason, exc.message)
            return Result()
        pods = owned_pods(self.pods.items(), target["metadata"]["uid"])
        claim = Claim(request, target, prime, record, pods, self.cdi_config())
        view = View(claim_name=target["metadata"]["name"], phases=IMPORT_PHASES)
        view, result = await self.flavour.sync(claim, view)
        await self._mirror(target, view.record, view.pod_phase, view.progress)
        return result

    async def _mirror(
        self, target: JSON, record: ImportRecord, pod_phase: str | None, progress: Progress | None
    ) -> bool:
        """Copy the prime's record (and the live pod phase and progress) onto the target."""
        wanted: dict[str, Any] = {
            k: v
            for k, v in record.annotations().items()
            if k not in (ANN_IMPORT_POD_UID,) and not k.endswith("importPodName")
        }
        wanted[ANN_POD_PHASE] = record.outcome or pod_phase
        if record.outcome == OUTCOME_SUCCEEDED:
            wanted[ANN_POPULATOR_PROGRESS] = PROGRESS_COMPLETE
        elif progress is not None:
            wanted[ANN_POPULATOR_PROGRESS] = progress.text
        return await self._annotate(target, wanted)

    async def _annotate(self, target: JSON, wanted: dict[str, Any]) -> bool:
        current = target["metadata"].get("annotations") or {}
        changes = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not changes:
            return False
        meta = target["metadata"]
        patch = {"metadata": {"annotations": changes}}
        updated = await self.kube.patch(PVCS, meta["name"], patch, meta["namespace"])
        target["metadata"] = updated["metadata"]
        return True

    # -- 4: the handover -----------------------------------------------------------------
    async def _rebind(self, target: JSON, prime: JSON, record: ImportRecord) -> Result:
        await self._mirror(target, record, None, None)
        pv_name = (prime.get("spec") or {}).get("volumeName")
        if not pv_name:
            return Result(requeue_after=1.0)
        pv = await self.kube.get(PVS, pv_name)
        if claim_ref_uid(pv) != target["metadata"]["uid"]:
            await self.kube.patch(PVS, pv_name, rebind_patch(target))
            message = f"Rebinding {pv_name} from {prime['metadata']['name']} to the target"
            await self.events.emit(target, NORMAL, REASON_REBIND, message)
        return Result(requeue_after=1.0)  # until the binder has bound the target

    async def _finish(self, target: JSON, prime: JSON) -> None:
        """The target is bound: the prime (now Lost, its PV gone to the target) is deleted,
        unless asked to keep it for debugging, as CDI does."""
        record = ImportRecord.from_pvc(prime)
        await self._mirror(target, record, None, None)
        ann = target["metadata"].get("annotations") or {}
        if ann.get(ANN_RETAIN_AFTER_COMPLETION) == "true":
            return
        meta = prime["metadata"]
        try:
            await self.kube.delete(PVCS, meta["name"], meta["namespace"], uid=meta.get("uid"))
        except (NotFound, Conflict):
            return
        pv = (target.get("spec") or {}).get("volumeName")
        await self.events.emit(
            target, NORMAL, REASON_POPULATED, f"Import complete; volume {pv} bound to the claim"
        )

    async def _event_once(self, target: JSON, kind: str, reason: str, message: str) -> None:
        """An event, unless the same reason is already the claim's last word (a re-queued
        wait must not write an event every few seconds)."""
        if (target["metadata"].get("annotations") or {}).get(ANN_LAST_EVENT) == reason:
            return
        await self.events.emit(target, kind, reason, message)
        await self._annotate(target, {ANN_LAST_EVENT: reason})
