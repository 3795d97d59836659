"""What every CDI populator shares: the prime claim's life around the work that fills it.

The import, upload and clone populators differ only in how ``prime-<target uid>`` gets its
data (an importer pod, an upload server, the CSI driver's clone). Everything around that is
the same and lives here, in ``PrimePopulator``, which each populator subclasses:

1. ``reconcile(target key)``: target gone, being deleted, or naming another kind: nothing.
   Target bound (the handover is over): delete the prime (kept with
   ``storage.pod.retainAfterCompletion``) and say so with the populator's ``succeeded``
   event. No prime yet: on WaitForFirstConsumer storage wait for a consumer to be scheduled,
   then read the source (``read_source``; missing: a Warning ``<Kind>Missing`` once, polled),
   create the prime the subclass renders (``render``) and name it on the target
   (``storage.populator.pvcPrime``, what the upload proxy and the DataVolume read). Otherwise
   ``populate``.
2. ``handover``: the data is complete: the prime's PV gets ``claimRef`` = the target; the PV
   binder then binds the target, which brings us back to 1.
3. ``mirror``: the prime's record (``cdi.controller.record``), the live pod phase and progress
   are copied onto the target, where users and the DataVolume reconciler look.

4. ``populate``: the record on the prime says Succeeded: hand over; Failed for good: a
   Warning (the populator's ``failed`` reason) once, the target stays unbound; else, with the
   prime bound (or bindable by its worker pod on WaitForFirstConsumer storage), ``work``.

Trust (issue 23, N1): the prime lives in the tenant's namespace, so a tenant can create
``prime-<target uid>`` first (pre-bound to someone else's PV) or rewrite its annotations. So:

- the controller seals the UID of the prime it created on the target
  (``storage.populator.pvcPrimeUID``, ``cdi.controller.seal``) in the same patch that names it;
  any other claim at that name is an impostor: a Warning ``PrimeNotCreatedByController``, never
  read, never handed over (deleted while unbound, so the population can go on);
- the outcome that authorizes a handover is the controller's sealed record on the prime
  (``cdi.controller.record.read_sealed``), written by the flavour from the worker pod whose UID
  it recorded; CDI's keys on the prime, which the tenant can rewrite, are ignored (a Warning
  ``PrimeRecordAltered`` says so once);
- ``handover`` patches only a PV whose ``claimRef`` is the prime (namespace, name and UID) while
  the prime is Bound to it, guarded by the PV's resourceVersion; anything else is refused with
  a Warning ``PrimeVolumeMismatch``.

Why a base class and not a helper object: the steps call back into the subclass at three
points (``read_source``, ``render``, ``work``) and share a few small I/O helpers; a
template method keeps each populator module to what is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_POD_PHASE,
    ANN_POPULATOR_PROGRESS,
    ANN_PVC_PRIME_NAME,
    ANN_RETAIN_AFTER_COMPLETION,
    PROGRESS_COMPLETE,
)
from cdi.controller.flavours import JSON
from cdi.controller.populators.datavolume import Store, pending_population
from cdi.controller.progress import Progress
from cdi.controller.record import (
    ANN_IMPORT_POD_UID,
    ANN_SEALED_RECORD,
    OUTCOME_FAILED,
    OUTCOME_SUCCEEDED,
    ClaimRecord,
    read_sealed,
)
from cdi.controller.seal import Seal, object_uid
from cdi.kube.client import PVCS, PVS, AsyncKube, split_key
from cdi.kube.errors import Conflict
from cdi.kube.events import NORMAL, WARNING, EventRecorder
from cdi.kube.workqueue import Result
from cdi.render.prime import claim_ref_uid, populator_kind, prime_name, rebind_patch, source_name

# CDI's event reasons on the target claim.
REASON_PRIME_CREATED = "CreatedPVCPrimeSuccessfully"
REASON_REBIND = "RebindInProgress"
SOURCE_RECHECK = 5.0  # seconds: no informer on populator sources, so a missing one is polled
# Ours: the reason of the last wait event on the target, so a polled wait is said once.
ANN_LAST_EVENT = "cdi.kubevirt.io/storage.populator.lastEvent"
# Ours: the UID of the prime the controller created, sealed (``cdi.controller.seal``).
ANN_PRIME_UID = "cdi.kubevirt.io/storage.populator.pvcPrimeUID"
PRIME_SEAL_PURPOSE = "populator-prime"
REASON_IMPOSTOR = "PrimeNotCreatedByController"
REASON_ALTERED = "PrimeRecordAltered"
REASON_MISMATCH = "PrimeVolumeMismatch"


class PrimePopulator:
    """The prime claim's life for one kind of populator source (see the module docstring)."""

    kinds: tuple[str, ...] = ()
    activity = "Population"  # the event words: "<activity> complete; volume ... bound"
    succeeded = "PopulationSucceeded"  # the event reason when the target is bound
    failed = "PopulationFailed"  # the event reason when the work failed for good
    done_extra: Mapping[str, str] = {}  # what else the target gets once the work is over

    def __init__(
        self,
        kube: AsyncKube,
        storage_classes: Store,
        cdi_config: Callable[[], CDIConfig],
        events: EventRecorder,
        seal: Seal,
    ) -> None:
        self.kube = kube
        self.storage_classes = storage_classes
        self.cdi_config = cdi_config
        self.events = events
        self.seal = seal
        # target UID -> UID of the prime this process created: its sealed record on the target
        # is a second write, which a crash or an outage can lose; without this our own prime
        # would look like an impostor. In memory, so nothing a tenant writes can add to it.
        self._made: dict[str, str] = {}

    # -- what a populator supplies -------------------------------------------------------
    async def read_source(self, target: JSON) -> JSON | None:
        """The source object the target names, or None when it does not exist (yet)."""
        raise NotImplementedError

    def render(self, target: JSON, source: JSON) -> JSON:
        """The prime claim to create for ``target``, to be filled from ``source``."""
        raise NotImplementedError

    async def work(self, target: JSON, prime: JSON, record: ClaimRecord) -> Result:
        """One step of the worker that fills a ready prime (``populate`` decides when)."""
        raise NotImplementedError

    # -- the shared steps ----------------------------------------------------------------
    async def populate(self, target: JSON, prime: JSON) -> Result:
        """On the existing prime: hand over once the record on it says Succeeded; report a
        failure for good once; else, once the prime is bound (or bindable by the worker, on
        WaitForFirstConsumer storage), one step of ``work``."""
        record = await self.sealed_record(target, prime)
        if record.outcome == OUTCOME_SUCCEEDED:
            await self.mirror(target, record, None, None, self.done_extra)
            return await self.handover(target, prime)
        if record.outcome == OUTCOME_FAILED:
            if await self.mirror(target, record, None, None, self.done_extra):
                message = f"{record.reason}: {record.message}"
                await self.events.emit(target, WARNING, self.failed, message)
            return Result()
        bound = (prime.get("status") or {}).get("phase") == "Bound"
        if not bound and not self.waits_for_consumer(prime):
            return Result()  # the prime's binding re-queues us; on WFFC the pod binds it
        return await self.work(target, prime, record)

    async def reconcile(self, key: str) -> Result:
        namespace, name = split_key(key)
        target = await self.kube.get_or_none(PVCS, name, namespace)
        if target is None or target["metadata"].get("deletionTimestamp"):
            return Result()
        if populator_kind(target) not in self.kinds:
            return Result()
        prime = await self.kube.get_or_none(PVCS, prime_name(target["metadata"]["uid"]), namespace)
        if prime is not None and not await self.is_ours(target, prime):
            return await self.impostor(target, prime)
        if (target.get("spec") or {}).get("volumeName"):
            if prime is not None:
                await self.finish(target, prime)
            return Result()
        if prime is None:
            return await self.create_prime(target)
        return await self.populate(target, prime)

    async def is_ours(self, target: JSON, prime: JSON) -> bool:
        """The prime is the one the controller created for this target: its UID is the one
        sealed on the target (or, before that write, the one this process created)."""
        uid, target_uid = object_uid(prime), object_uid(target)
        ann = target["metadata"].get("annotations") or {}
        if self.seal.open(PRIME_SEAL_PURPOSE, target_uid, ann.get(ANN_PRIME_UID)) == uid:
            return True
        if not uid or self._made.get(target_uid) != uid:
            return False
        await self.annotate(target, self.prime_record(target, prime))
        del self._made[target_uid]
        return True

    def prime_record(self, target: JSON, prime: JSON) -> dict[str, str]:
        """The target's record of its prime: its name (what the proxy and a DataVolume read,
        as in CDI) and its UID, sealed."""
        uid = object_uid(prime)
        return {
            ANN_PVC_PRIME_NAME: prime["metadata"]["name"],
            ANN_PRIME_UID: self.seal.seal(PRIME_SEAL_PURPOSE, object_uid(target), uid),
        }

    async def impostor(self, target: JSON, prime: JSON) -> Result:
        """A claim at the prime's name that the controller did not create: never read, never
        handed over. Unbound, it is deleted (only its own UID), so the population can go on; a
        bound one stays (its volume is the tenant's), and the population waits for it to go."""
        meta = prime["metadata"]
        bound = (prime.get("status") or {}).get("phase") == "Bound"
        message = (
            f"Claim {meta['name']} (uid {meta.get('uid')}) was not created by the controller "
            "for this claim; it is ignored"
            + ("; delete it to let the population proceed" if bound else " and deleted")
        )
        await self.event_once(target, WARNING, REASON_IMPOSTOR, message)
        if bound or meta.get("deletionTimestamp"):
            return Result(requeue_after=SOURCE_RECHECK)
        await self.kube.delete_if_present(
            PVCS, meta["name"], meta["namespace"], uid=meta.get("uid")
        )
        return Result(requeue_after=1.0)

    async def sealed_record(self, target: JSON, prime: JSON) -> ClaimRecord:
        """The controller's own record on the prime; CDI's keys there, if someone else changed
        them, are ignored and a Warning says so once."""
        read = read_sealed(self.seal, prime)
        if read.altered:
            name = prime["metadata"]["name"]
            message = (
                f"The import record on {name} was changed by someone other than the "
                "controller; the change is ignored"
            )
            await self.event_once(target, WARNING, REASON_ALTERED, message)
        return read.record

    def waits_for_consumer(self, pvc: JSON) -> bool:
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        sc = self.storage_classes.get(str(sc_name)) if sc_name else None
        return bool(sc and sc.get("volumeBindingMode") == "WaitForFirstConsumer")

    async def create_prime(self, target: JSON) -> Result:
        if pending_population(target, self.waits_for_consumer(target)):
            return Result()  # the scheduler's selected-node annotation re-queues us
        source = await self.read_source(target)
        if source is None:
            kind = populator_kind(target)
            message = f"{kind} {source_name(target)} not found; waiting for it"
            await self.event_once(target, WARNING, f"{kind}Missing", message)
            return Result(requeue_after=SOURCE_RECHECK)
        prime = self.render(target, source)
        meta = target["metadata"]
        created = await self.kube.create_if_absent(PVCS, prime, meta["namespace"])
        if created is None:
            return Result(requeue_after=1.0)
        self._made[object_uid(target)] = object_uid(created)
        await self.annotate(target, self.prime_record(target, created))
        self._made.pop(object_uid(target), None)
        await self.events.emit(
            target, NORMAL, REASON_PRIME_CREATED, "PVC Prime created successfully"
        )
        return Result(requeue_after=1.0)

    async def mirror(
        self,
        target: JSON,
        record: ClaimRecord,
        pod_phase: str | None,
        progress: Progress | None,
        extra: Mapping[str, str] | None = None,
    ) -> bool:
        """Copy the prime's record (and the live pod phase and progress) onto the target."""
        wanted: dict[str, Any] = {
            k: v
            for k, v in record.annotations().items()
            if k not in (ANN_IMPORT_POD_UID, ANN_SEALED_RECORD) and not k.endswith("importPodName")
        }
        wanted[ANN_POD_PHASE] = record.outcome or pod_phase
        if record.outcome == OUTCOME_SUCCEEDED:
            wanted[ANN_POPULATOR_PROGRESS] = PROGRESS_COMPLETE
        elif progress is not None:
            wanted[ANN_POPULATOR_PROGRESS] = progress.text
        wanted.update(extra or {})
        return await self.annotate(target, wanted)

    async def annotate(self, target: JSON, wanted: Mapping[str, Any]) -> bool:
        current = target["metadata"].get("annotations") or {}
        changes = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not changes:
            return False
        meta = target["metadata"]
        patch = {"metadata": {"annotations": changes}}
        updated = await self.kube.patch(PVCS, meta["name"], patch, meta["namespace"])
        target["metadata"] = updated["metadata"]
        return True

    async def handover(self, target: JSON, prime: JSON) -> Result:
        """Point the prime's PV at the target; the PV binder does the rest. Only a PV bound to
        the prime (its claimRef is the prime: namespace, name and UID; the prime Bound to it),
        and only over the version checked: a PV is cluster-wide, the prime is not."""
        pv_name = (prime.get("spec") or {}).get("volumeName")
        if not pv_name:
            return Result(requeue_after=1.0)
        pv = await self.kube.get_or_none(PVS, pv_name)
        if pv is not None and claim_ref_uid(pv) == object_uid(target):
            return Result(requeue_after=1.0)  # handed over: the binder's turn
        if pv is None or not bound_to(pv, prime):
            message = (
                f"Volume {pv_name} is not bound to {prime['metadata']['name']}; "
                "it is not handed over"
            )
            await self.event_once(target, WARNING, REASON_MISMATCH, message)
            return Result(requeue_after=SOURCE_RECHECK)
        version = pv["metadata"].get("resourceVersion")
        try:
            await self.kube.patch(PVS, pv_name, rebind_patch(target, version))
        except Conflict:
            return Result(requeue_after=1.0)  # the PV changed since: check again
        message = f"Rebinding {pv_name} from {prime['metadata']['name']} to the target"
        await self.events.emit(target, NORMAL, REASON_REBIND, message)
        return Result(requeue_after=1.0)  # until the binder has bound the target

    async def finish(self, target: JSON, prime: JSON) -> None:
        """The target is bound: the prime (now Lost, its PV gone to the target) is deleted,
        unless asked to keep it for debugging, as CDI does."""
        record = read_sealed(self.seal, prime).record
        if record.done:  # a clone's prime has no record: the target's stays as written
            await self.mirror(target, record, None, None)
        ann = target["metadata"].get("annotations") or {}
        if ann.get(ANN_RETAIN_AFTER_COMPLETION) == "true":
            return
        meta = prime["metadata"]
        if not await self.kube.delete_if_present(
            PVCS, meta["name"], meta["namespace"], uid=meta.get("uid")
        ):
            return
        pv = (target.get("spec") or {}).get("volumeName")
        message = f"{self.activity} complete; volume {pv} bound to the claim"
        await self.events.emit(target, NORMAL, self.succeeded, message)

    async def event_once(self, target: JSON, kind: str, reason: str, message: str) -> None:
        """An event, unless the same reason is already the claim's last word (a re-queued
        wait must not write an event every few seconds)."""
        if (target["metadata"].get("annotations") or {}).get(ANN_LAST_EVENT) == reason:
            return
        await self.events.emit(target, kind, reason, message)
        await self.annotate(target, {ANN_LAST_EVENT: reason})


def bound_to(pv: JSON, claim: JSON) -> bool:
    """``pv`` and ``claim`` are bound to each other: the PV's claimRef is the claim (namespace,
    name and UID), the claim names the PV and is Bound."""
    ref = (pv.get("spec") or {}).get("claimRef") or {}
    meta = claim.get("metadata") or {}
    return (
        bool(meta.get("uid"))
        and (ref.get("namespace"), ref.get("name"), ref.get("uid"))
        == (meta.get("namespace"), meta.get("name"), meta.get("uid"))
        and (claim.get("spec") or {}).get("volumeName") == (pv.get("metadata") or {}).get("name")
        and (claim.get("status") or {}).get("phase") == "Bound"
    )
