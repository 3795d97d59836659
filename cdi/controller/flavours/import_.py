"""The import flavour: importer pods, one per attempt, for http, s3, gcs, registry and blank.

On a claim that is ready (bound, or bindable by the pod itself), one ``sync`` takes one step:

1. no pod for the current attempt: create it (after the retry backoff, for a retry), having
   first recorded its name on the PVC (the first attempt's is on the claim from its creation,
   ``first_record``) and, when CDIConfig importProxy carries credentials,
   created the Secret that brings the pod a ticket for the relay that holds them
   (``cdi.controller.proxy_relay``), and when it names a ``trustedCAProxy``, copied that CA
   bundle beside the import (``cdi.controller.proxy_ca``);
2. pod running: scrape progress, come back in ``progress_interval``;
3. pod finished: the failure policy decides; the decision is recorded on the PVC first
   (``cdi.controller.record``) and acted on after (delete the pods after success, keep a failed
   one for its logs).

Under a burst of new DataVolumes (``FlavourDeps.burst``) the UID record waits for the next
reconcile, which finds the pod it made in memory and records it then: the claim and pod creates
of the DataVolumes waiting go first.

The attempt number is the record's count of failed attempts, and the pod's name, labels and
metrics address are inputs of ``render_importer_pod``, so the pod created is exactly the pure
renderer's output. The UID of the pod the create returned is recorded on the PVC at once, and
only the pod with that UID is followed (``cdi.controller.workerpod``): any other pod at the
attempt's name (a tenant's look-alike, or our own orphan from a crash between create and
record) gets a Warning event and is deleted, never read for its phase, termination message or
metrics; the attempt's pod is then created afresh. A recorded pod that has gone from the pod
cache is made again only if the claim as the API server holds it still records it
(``_still_wanted``): a lagging claim cache must not bring back the pod of an import that has
finished. Progress is scraped from the podIP the
kubelet reports for the recorded pod, on the port this flavour rendered.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_RETAIN_AFTER_COMPLETION,
    ConditionReason,
    Phase,
)
from cdi.controller.flavours import JSON, Claim, FlavourDefaults, FlavourDeps, PhaseEvent
from cdi.controller.importslots import QUEUED_REASON, ImportSlots, node_queued
from cdi.controller.importslots import REQUEUE as SLOT_REQUEUE
from cdi.controller.policy import (
    Decision,
    FailurePolicy,
    Outcome,
    pod_outcome,
    pod_problem,
    verification_of,
)
from cdi.controller.progress import Progress, parse_metrics
from cdi.controller.proxy_ca import ProxyCA
from cdi.controller.proxy_relay import ProxyRelay, RelaySettings
from cdi.controller.record import (
    OUTCOME_FAILED,
    OUTCOME_SUCCEEDED,
    ClaimRecord,
    read_sealed,
    sealed_annotations,
)
from cdi.controller.refusals import QUOTA_RETRY, refused_pod
from cdi.controller.registry_result import result_patch, with_node_digest
from cdi.controller.scratch import CREATING_MESSAGE, ScratchChoice, ScratchClaims
from cdi.controller.status import ClaimProblem, FlavourPhases, View
from cdi.controller.workerpod import assess, create_pod, pod_uid, remove_impostor
from cdi.kube.client import PODS, PVCS
from cdi.kube.errors import Forbidden
from cdi.kube.events import NORMAL, WARNING
from cdi.kube.workqueue import Result
from cdi.render import RenderError
from cdi.render.importer_pod import SCRATCH_VOLUME, ImporterPodConfig, render_importer_pod
from cdi.render.naming import importer_pod_name
from cdi.render.worker_pod import Metrics

IMPORT_PHASES = FlavourPhases(
    scheduled=Phase.IMPORT_SCHEDULED,
    in_progress=Phase.IMPORT_IN_PROGRESS,
    worker="Importer",
    activity="Import",
)

IMPORT_EVENTS: Mapping[str, PhaseEvent] = {
    Phase.IMPORT_SCHEDULED: PhaseEvent(
        NORMAL, ConditionReason.IMPORT_SCHEDULED, "Import into {claim} scheduled"
    ),
    Phase.IMPORT_IN_PROGRESS: PhaseEvent(
        NORMAL, ConditionReason.IMPORT_IN_PROGRESS, "Import into {claim} in progress"
    ),
    Phase.SUCCEEDED: PhaseEvent(
        NORMAL, ConditionReason.IMPORT_SUCCEEDED, "Successfully imported into PVC {claim}"
    ),
    Phase.FAILED: PhaseEvent(WARNING, ConditionReason.IMPORT_FAILED),
}

# The event reason for a pod at the importer's name that the controller did not record.
REASON_UNRECORDED_POD = "UnrecordedImporterPod"


@dataclass(frozen=True)
class ImportSettings:
    """How importer pods are made and followed."""

    image: str
    pull_policy: str = "IfNotPresent"
    policy: FailurePolicy = field(default_factory=FailurePolicy)
    progress_interval: float = 2.0
    metrics: Metrics = field(default_factory=lambda: Metrics(on_pod_ip=True))
    relay: RelaySettings = field(default_factory=RelaySettings)  # credentialed importProxy


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


class ImportFlavour(FlavourDefaults):
    """Fill a claim by running importer pods, retrying transient failures with backoff."""

    phases = IMPORT_PHASES
    events = IMPORT_EVENTS
    # every claim write goes through ``FlavourDeps.claims`` (the flavour under load reads its
    # claim from the cache), and the importer may be scheduled while an Immediate claim binds
    claim_from_cache = True
    pod_before_bind = True

    def __init__(self, deps: FlavourDeps, settings: ImportSettings) -> None:
        self.deps = deps
        self.settings = settings
        self.relay = ProxyRelay(deps, settings.relay)
        self.proxy_ca = ProxyCA(deps, settings.relay.namespace)  # trustedCAProxy's namespace
        self.scratch = ScratchClaims(deps)
        # PVC UID -> the last resume checkpoint scraped from its recorded importer pod: the
        # only resume point a later attempt may keep (datapath.checkpoint). In memory, so a
        # new leader has none and the next attempt restarts from byte 0 (safe, slower).
        self._attested: dict[str, tuple[int, str]] = {}
        # (namespace, pod name) -> UID of the importer pod this process created. Recording the
        # UID on the PVC is a second write, which fails when the API server or etcd goes away
        # right after the create; without this our own pod would then look like an impostor
        # and be deleted and re-created (once per outage). In memory, so nothing a tenant
        # writes can make a pod "ours"; a new leader re-creates such a pod once. An entry
        # lives only until its record is written.
        self._created: dict[tuple[str, str], str] = {}

    def first_record(self, claim_name: str) -> dict[str, str]:
        """The record a new claim is created with: the first attempt's pod name (the intent
        ``_start_attempt`` would otherwise write first), so the pod follows with no write."""
        record = ClaimRecord(pod_name=importer_pod_name(claim_name, 0))
        return {k: v for k, v in record.annotations().items() if v is not None}

    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        attempt = claim.record.failed_attempts
        view = dataclasses.replace(view, max_attempts=self.settings.policy.max_attempts)
        name = importer_pod_name(claim.name, attempt)
        seen = assess(claim.pods.get(name), claim.record.pod_uid)
        if seen.impostor is not None:
            if not self._made_here(claim, seen.impostor):
                return await self._remove_impostor(claim, view, seen.impostor)
            await self._record_created(claim, seen.impostor)
            return dataclasses.replace(view, pod_phase="Pending"), Result(requeue_after=1.0)
        pod = seen.pod
        if pod is None:
            return await self._start_attempt(claim, view, attempt)
        pod_phase = seen.phase
        view = dataclasses.replace(view, pod_phase=pod_phase)
        outcome = seen.outcome
        if outcome is None:
            per_node = claim.cdi_config.spec.max_concurrent_imports_per_node or 0
            problem = node_queued(pod, per_node, self.deps.worker_pods()) or pod_problem(pod)
            view = dataclasses.replace(view, pod_problem=problem)
            if pod_phase != "Running":
                if claim.record.requires_scratch and _has_scratch(pod):
                    pending = await self.scratch.pending(claim)
                    view = dataclasses.replace(view, creating_scratch=pending)
                    return view, Result(requeue_after=1.0 if pending else None)
                return view, Result()
            progress = await self._scrape(claim, pod)
            if progress is not None and progress.checkpoint is not None:
                self._attested[self._claim_uid(claim)] = progress.checkpoint
            return dataclasses.replace(view, progress=progress), Result(
                requeue_after=self.settings.progress_interval
            )
        term = outcome.termination
        if term is not None and term.scratch_space_required and not _has_scratch(pod):
            return await self._needs_scratch(claim, view, pod, outcome)
        if outcome.termination is not None:  # node pull: the digest is the kubelet's
            outcome = dataclasses.replace(
                outcome, termination=with_node_digest(outcome.termination, pod)
            )
        return await self._decide(claim, view, outcome, attempt)

    async def _needs_scratch(
        self, claim: Claim, view: View, pod: Mapping[str, Any], outcome: Outcome
    ) -> tuple[View, Result]:
        """CDI's scratch dance: a pod without scratch space said the source needs some. Not a
        failed attempt: the record says ``requiresScratch``, the pod goes, and the attempt's
        pod is made again with a scratch claim (``cdi.controller.scratch``)."""
        record = dataclasses.replace(
            claim.record, requires_scratch=True, reason=outcome.reason, message=outcome.message
        )
        await self._record(claim.pvc, record)
        meta = pod.get("metadata") or {}
        await self.deps.kube.delete_if_present(
            PODS, str(meta.get("name")), claim.dv.namespace, uid=meta.get("uid")
        )
        view = dataclasses.replace(
            view,
            record=record,
            pod_phase="Pending",
            pod_problem=(ConditionReason.SCRATCH_SPACE_REQUIRED, CREATING_MESSAGE),
            creating_scratch=True,
        )
        return view, Result(requeue_after=0.5)

    async def _decide(
        self, claim: Claim, view: View, outcome: Outcome, attempt: int
    ) -> tuple[View, Result]:
        policy = self.settings.policy
        decision = policy.decide(outcome, attempt)
        base = dataclasses.replace(claim.record, reason=outcome.reason, message=outcome.message)
        if decision == Decision.SUCCEED:
            new = dataclasses.replace(
                base, outcome=OUTCOME_SUCCEEDED, verification=verification_of(outcome)
            )
        elif decision == Decision.RETRY:
            new = dataclasses.replace(base, failed_attempts=attempt + 1)
        else:
            new = dataclasses.replace(base, outcome=OUTCOME_FAILED)
        pvc = await self._record(claim.pvc, new)
        if decision != Decision.RETRY:
            self._attested.pop(self._claim_uid(claim), None)
            if new.requires_scratch:  # the import has ended: its scratch claim goes
                await self.scratch.release(claim)
        view = dataclasses.replace(view, record=new, pod_phase=None)
        if decision == Decision.RETRY:
            delay = policy.retry_delay(attempt + 1)
            await self.deps.events.emit(
                dict(claim.obj),
                WARNING,
                ConditionReason.ERR_IMPORT_FAILED,
                f"Import attempt {attempt + 1} of {policy.max_attempts} failed: "
                f"{outcome.reason}: {outcome.message}; retrying in {delay:.0f}s",
            )
            return dataclasses.replace(view, retry_in=delay), Result(requeue_after=delay)
        if decision == Decision.SUCCEED:
            extra = result_patch(outcome.termination)  # preallocation; registry: labels, digest
            if extra is not None:
                meta = pvc["metadata"]
                pvc = await self.deps.kube.patch(PVCS, meta["name"], extra, meta.get("namespace"))
                self.deps.claims.wrote(pvc)
            await self.finish(dataclasses.replace(claim, pvc=pvc, record=new))
        return view, Result()

    async def _start_attempt(self, claim: Claim, view: View, attempt: int) -> tuple[View, Result]:
        dv, settings = claim.dv, self.settings
        if attempt > 0:
            previous = claim.pods.get(importer_pod_name(claim.name, attempt - 1))
            wait = self._backoff_left(previous, attempt)
            if wait > 0:
                return dataclasses.replace(view, retry_in=wait), Result(requeue_after=wait)
        name = importer_pod_name(claim.name, attempt)
        queued = self._queued(claim, name)
        if queued is not None:
            view = dataclasses.replace(view, pod_phase="Pending", pod_problem=queued)
            return view, Result(requeue_after=SLOT_REQUEUE)
        intent = claim.record
        if intent.pod_name == name and intent.pod_uid and not await self._still_wanted(claim):
            return view, Result(requeue_after=1.0)  # the claim cache is behind: wait for it
        if intent.pod_name != name:
            intent = dataclasses.replace(intent, pod_name=name, pod_uid=None)
        pvc = await self._record(claim.pvc, intent)
        try:
            scratch = ScratchChoice()
            if intent.requires_scratch:
                scratch = await self.scratch.prepare(dataclasses.replace(claim, pvc=pvc))
            if scratch.wait is not None:
                view = dataclasses.replace(view, pod_phase="Pending", pod_problem=scratch.wait)
                return view, Result(requeue_after=1.0)
            proxy_auth_secret, cdi_config = await self._proxy_auth_secret(claim)
            proxy_ca = await self.proxy_ca.copy_for(claim, cdi_config)
            config = ImporterPodConfig(
                image=settings.image,
                command=(),
                pull_policy=settings.pull_policy,
                attempt=attempt,
                metrics=settings.metrics,
                cdi_config=cdi_config,
                proxy_auth_secret=proxy_auth_secret,
                proxy_ca_config_map=proxy_ca,
                checkpoint_attested=self._attested.get(self._claim_uid(claim)),
                scratch_pvc_name=scratch.claim_name,
                scratch_empty_dir=scratch.empty_dir,
                import_slot=(cdi_config.spec.max_concurrent_imports_per_node or 0) > 0,
            )
            pod = render_importer_pod(dv, pvc, config)
        except RenderError as exc:
            problem = ClaimProblem(exc.reason, exc.message)
            return dataclasses.replace(view, problem=problem), Result(requeue_after=30.0)
        try:
            uid = await create_pod(self.deps.kube, pod, dv.namespace)
        except Forbidden as exc:  # a quota (or admission) refusal: again later
            refused = refused_pod(name, exc)
            view = dataclasses.replace(view, pod_phase="Pending", pod_problem=refused)
            return view, Result(requeue_after=QUOTA_RETRY)
        if uid is None:
            # Someone's pod holds the name, and it is not one we recorded: never adopt it.
            found = await self.deps.kube.get_or_none(PODS, name, dv.namespace)
            if found is None:
                return view, Result(requeue_after=1.0)
            if self._made_here(claim, found):
                await self._record_created(claim, found)
            elif not assess(found, intent.pod_uid).ours:
                return await self._remove_impostor(claim, view, found)
            # ours, recorded, and not yet in the informer's cache
            return dataclasses.replace(view, pod_phase="Pending"), Result(requeue_after=1.0)
        # Unguarded: creating the pod may bind the claim (a new resourceVersion) before this
        # write, and a lost UID would make our own pod look like an impostor. The guarded
        # intent above already settled this attempt; only the leader writes these keys.
        self._created[(dv.namespace, name)] = uid
        view = dataclasses.replace(view, pod_phase="Pending")
        if self.deps.burst():
            # new DataVolumes wait for their claims and pods: the record is a follow-up's
            # (``_made_here`` knows the pod meanwhile; a new leader would re-create it once)
            return view, Result(requeue_after=settings.progress_interval)
        recorded = dataclasses.replace(intent, pod_uid=uid or None)
        await self._record(pvc, recorded, guarded=False)
        del self._created[(dv.namespace, name)]  # recorded: the PVC vouches for it now
        return view, Result(requeue_after=settings.progress_interval)

    def _queued(self, claim: Claim, pod_name: str) -> tuple[str, str] | None:
        """The Running condition's (reason, message) while CDIConfig's ``maxConcurrentImports``
        keeps this import waiting for a slot (``cdi.controller.importslots``); None: go on."""
        limit = claim.cdi_config.spec.max_concurrent_imports
        if not limit or limit <= 0:
            return None
        dv = claim.dv
        ns = str(claim.pvc["metadata"].get("namespace") or dv.namespace)
        ahead = self.deps.slots.take(
            (dv.namespace, dv.name),
            dv.metadata.creation_timestamp or "",
            (ns, pod_name),
            limit,
            self.deps.worker_pods(),
        )
        if ahead is None:
            return None
        return QUEUED_REASON, ImportSlots.message(limit, ahead)

    async def _proxy_auth_secret(self, claim: Claim) -> tuple[str | None, CDIConfig]:
        """With a credentialed importProxy: the Secret holding this attempt's relay ticket
        (its name) and the CDIConfig whose proxies point at the relay; the credentials never
        reach the tenant's namespace (``cdi.controller.proxy_relay``)."""
        return await self.relay.importer_proxy(claim)

    async def _remove_impostor(
        self, claim: Claim, view: View, pod: Mapping[str, Any]
    ) -> tuple[View, Result]:
        """A pod at the attempt's name the controller did not record: say so, delete it (by UID,
        so a pod created meanwhile is spared) and create the attempt's pod when it is gone."""
        if await self._recorded_now(claim, pod):  # the claim was read from a lagging cache
            return dataclasses.replace(view, pod_phase="Pending"), Result(requeue_after=0.5)
        await remove_impostor(
            self.deps.kube,
            pod,
            claim.dv.namespace,
            events=self.deps.events,
            about=claim.obj,
            reason=REASON_UNRECORDED_POD,
            work="import",
        )
        view = dataclasses.replace(view, pod_phase=None)
        return view, Result(requeue_after=self.settings.progress_interval)

    async def _recorded_now(self, claim: Claim, pod: Mapping[str, Any]) -> bool:
        """The pod's UID is recorded on the claim as the API server holds it now. The claim in
        ``claim`` may come from the informer cache; deleting a pod is the one decision a stale
        record must never make, so the verdict is checked against a fresh GET (rare: only a
        pod that looks unrecorded costs it)."""
        fresh = await self._server_record(claim)
        uid = pod_uid(pod)
        return fresh is not None and uid is not None and fresh.pod_uid == uid

    async def _still_wanted(self, claim: Claim) -> bool:
        """The attempt's recorded pod is not in the pod cache (deleted, or not seen yet): the
        claim as the API server holds it now still calls for that pod. A cached claim may lag
        behind a later record: the import finished and its pods were deleted (by this process,
        or by a leader before it whose writes landed as this one took over), or the attempt
        moved on; a pod made from the stale record would be a second importer. Rare: only a
        recorded pod that has gone from the cache costs this GET."""
        return await self._server_record(claim) == claim.record

    async def _server_record(self, claim: Claim) -> ClaimRecord | None:
        """The record on the claim as the API server holds it now (a GET, not the cache);
        None when the claim is gone."""
        meta = claim.pvc.get("metadata") or {}
        fresh = await self.deps.kube.get_or_none(PVCS, claim.name, meta.get("namespace"))
        if fresh is None:
            return None
        if claim.sealed and self.deps.seal is not None:
            return read_sealed(self.deps.seal, fresh).record
        return ClaimRecord.from_pvc(fresh)

    def _made_here(self, claim: Claim, pod: Mapping[str, Any]) -> bool:
        """The pod is one this process created (its UID record may not have been written)."""
        meta = pod.get("metadata") or {}
        key = (claim.dv.namespace, str(meta.get("name")))
        return bool(meta.get("uid")) and self._created.get(key) == meta.get("uid")

    async def _record_created(self, claim: Claim, pod: Mapping[str, Any]) -> None:
        """Write the UID record that failed after this process created ``pod``."""
        name = str((pod.get("metadata") or {}).get("name"))
        record = dataclasses.replace(claim.record, pod_name=name, pod_uid=pod_uid(pod))
        await self._record(claim.pvc, record, guarded=False)
        self._created.pop((claim.dv.namespace, name), None)

    def _backoff_left(self, previous: Mapping[str, Any] | None, attempt: int) -> float:
        delay = self.settings.policy.retry_delay(attempt)
        outcome = pod_outcome(dict(previous)) if previous else None
        finished = parse_time(outcome.finished_at) if outcome else None
        if finished is None:
            return 0.0
        return max(0.0, finished + delay - self.deps.clock())

    @staticmethod
    def _claim_uid(claim: Claim) -> str:
        return str((claim.pvc.get("metadata") or {}).get("uid") or "")

    async def _scrape(self, claim: Claim, pod: Mapping[str, Any]) -> Progress | None:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        text = await self.deps.scraper(str(ip), self.settings.metrics.port)
        return parse_metrics(text, claim.dv.uid) if text else None

    async def _record(self, pvc: JSON, record: ClaimRecord, *, guarded: bool = True) -> JSON:
        """Write ``record`` on the PVC; ``guarded``: only over the version that was read."""
        if not record.differs_from(pvc):
            return pvc
        meta = pvc["metadata"]
        annotations = {**record.annotations(), **sealed_annotations(self.deps.seal, pvc, record)}
        patch: JSON = {"metadata": {"annotations": annotations}}
        if guarded:
            patch["metadata"]["resourceVersion"] = meta.get("resourceVersion")
        written = await self.deps.kube.patch(PVCS, meta["name"], patch, meta.get("namespace"))
        self.deps.claims.wrote(written)  # the claim cache may not show it yet
        return written

    async def finish(self, claim: Claim) -> None:
        """After success the importer pods go (unless asked to retain them); failed attempts'
        pods stay for their logs until the DataVolume is deleted."""
        if claim.record.outcome != OUTCOME_SUCCEEDED:
            return
        if claim.record.requires_scratch:
            await self.scratch.release(claim)
        if claim.dv.annotations.get(ANN_RETAIN_AFTER_COMPLETION) == "true":
            return
        for name, pod in claim.pods.items():
            if (pod.get("status") or {}).get("phase") == "Failed":
                continue
            uid = pod["metadata"].get("uid")
            await self.deps.kube.delete_if_present(PODS, name, claim.dv.namespace, uid=uid)


def _has_scratch(pod: Mapping[str, Any]) -> bool:
    """The pod was given scratch space (a claim or the emptyDir fallback)."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any(v.get("name") == SCRATCH_VOLUME for v in volumes)
