"""The DataVolume reconciler for import (http, s3, registry, ...) and blank sources.

``reconcile(key) -> Result`` is level-triggered: it reads the DataVolume and its PVC from the
API server (fresh, so a decision is never made on a stale cache), the importer pods, storage
classes and config from informer caches, then takes at most one step toward the goal and
writes the status once:

1. no PVC: render it (``cdi.render.pvc``) and create it, owned by the DataVolume; a PVC that
   exists and is not ours is adopted only when the DataVolume allows it
   (``allowClaimAdoption``; an adopted PVC gets no owner reference, so it outlives the DV);
2. PVC not bound on a WaitForFirstConsumer class: wait (WaitForFirstConsumer) unless the DV
   asks for immediate binding, in which case the importer pod is the first consumer;
3. no pod for the current attempt: create it (after the retry backoff, for a retry);
4. pod running: scrape progress, come back in ``progress_interval``;
5. pod finished: the failure policy decides; the decision is recorded on the PVC first
   (``cdi.controller.record``) and acted on after (delete the pod after success, keep a failed
   one for its logs).

Every child name is deterministic and every create treats 409 AlreadyExists as "already done",
so a controller killed at any point and restarted neither duplicates pods nor loses progress.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig, StorageProfile
from cdi.api.constants import (
    ANN_ALLOW_CLAIM_ADOPTION,
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_IMMEDIATE_BINDING,
    ANN_POPULATED_FOR,
    ANN_PRE_POPULATED,
    ANN_RETAIN_AFTER_COMPLETION,
    CDICONFIG_NAME,
    METRICS_PORT,
    ConditionReason,
    Phase,
    SourceKind,
)
from cdi.api.termination import REASON_COMPLETED
from cdi.api.types import DataVolume, ObjectMeta
from cdi.controller.pods import attempt_pod_name, desired_pod, metrics_port, owned_pods
from cdi.controller.policy import Decision, FailurePolicy, pod_outcome
from cdi.controller.progress import Progress, Scraper, parse_metrics
from cdi.controller.record import OUTCOME_FAILED, OUTCOME_SUCCEEDED, ImportRecord
from cdi.controller.status import ClaimProblem, View, compute_status
from cdi.kube.client import DATAVOLUMES, PODS, PVCS, SECRETS, AsyncKube, split_key
from cdi.kube.errors import Conflict, NotFound
from cdi.kube.events import NORMAL, WARNING, EventRecorder
from cdi.kube.workqueue import Result
from cdi.render import RenderError
from cdi.render.importer_pod import ImporterPodConfig
from cdi.render.proxy_auth import render_proxy_auth_secret
from cdi.render.pvc import render_pvc

log = logging.getLogger(__name__)

IMPORT_SOURCES = frozenset(
    {SourceKind.HTTP, SourceKind.S3, SourceKind.GCS, SourceKind.REGISTRY, SourceKind.BLANK}
)
ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
ANN_DEFAULT_VIRT_CLASS = "storageclass.kubevirt.io/is-default-virt-class"

PHASE_EVENTS: dict[str, tuple[str, str]] = {
    Phase.PENDING: (NORMAL, ConditionReason.PENDING),
    Phase.WAIT_FOR_FIRST_CONSUMER: (NORMAL, "WaitForFirstConsumer"),
    Phase.PVC_BOUND: (NORMAL, ConditionReason.BOUND),
    Phase.IMPORT_SCHEDULED: (NORMAL, ConditionReason.IMPORT_SCHEDULED),
    Phase.IMPORT_IN_PROGRESS: (NORMAL, ConditionReason.IMPORT_IN_PROGRESS),
    Phase.SUCCEEDED: (NORMAL, ConditionReason.IMPORT_SUCCEEDED),
    Phase.FAILED: (WARNING, ConditionReason.IMPORT_FAILED),
}


class Store(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def items(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Caches:
    pods: Store  # importer pods (label cdi.kubevirt.io=importer)
    storage_classes: Store
    storage_profiles: Store
    cdi_configs: Store


@dataclass(frozen=True)
class ControllerConfig:
    importer_image: str = "quay.io/cdi-py/cdi-importer:latest"
    pull_policy: str = "IfNotPresent"
    policy: FailurePolicy = field(default_factory=FailurePolicy)
    progress_interval: float = 2.0
    claim_adoption_gate: bool = False  # CDI feature gate DataVolumeClaimAdoption
    cluster_cidrs: tuple[str, ...] = ()  # pod/service/node ranges imports may not reach


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


class DataVolumeReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        caches: Caches,
        events: EventRecorder,
        scraper: Scraper,
        config: ControllerConfig,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.caches = caches
        self.events = events
        self.scraper = scraper
        self.config = config
        self.clock = clock

    async def reconcile(self, key: str) -> Result:
        namespace, name = split_key(key)
        try:
            obj = await self.kube.get(DATAVOLUMES, name, namespace)
        except NotFound:
            return Result()  # deleted: owner references let the garbage collector clean up
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        try:
            dv = DataVolume.from_dict(obj)
        except SchemaError as exc:
            log.warning("%s: unparsable DataVolume: %s", key, exc)
            return Result()
        if dv.spec.source_ref is not None or dv.spec.source_kind not in IMPORT_SOURCES:
            return Result()  # clone, upload, external population: not this reconciler's
        step = Step(self, dv, obj)
        return await step.run()

    # -- cluster lookups -------------------------------------------------------------------
    def cdi_config(self) -> CDIConfig:
        raw = self.caches.cdi_configs.get(CDICONFIG_NAME)
        try:
            config = CDIConfig.from_dict(raw) if raw else CDIConfig()
        except SchemaError:
            config = CDIConfig()
        return config.with_cluster_cidrs(self.config.cluster_cidrs)

    def default_storage_class(self) -> str | None:
        classes = self.caches.storage_classes.items()
        for ann in (ANN_DEFAULT_VIRT_CLASS, ANN_DEFAULT_CLASS):
            for sc in sorted(classes, key=lambda s: str(s["metadata"]["name"])):
                if (sc["metadata"].get("annotations") or {}).get(ann) == "true":
                    return str(sc["metadata"]["name"])
        return None

    def storage_profile(self, dv: DataVolume) -> StorageProfile | None:
        claim = dv.spec.claim
        name = (claim.storage_class_name if claim else None) or self.default_storage_class()
        if not name:
            return None
        raw = self.caches.storage_profiles.get(name)
        try:
            if raw:
                return StorageProfile.from_dict(raw)
        except SchemaError:
            pass
        return StorageProfile(metadata=ObjectMeta(name=name))

    def waits_for_consumer(self, pvc: Mapping[str, Any]) -> bool:
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        sc = self.caches.storage_classes.get(str(sc_name)) if sc_name else None
        return bool(sc and sc.get("volumeBindingMode") == "WaitForFirstConsumer")


class Step:
    """One reconcile of one DataVolume: the state it read and the status it will write."""

    def __init__(self, r: DataVolumeReconciler, dv: DataVolume, obj: dict[str, Any]) -> None:
        self.r = r
        self.dv = dv
        self.obj = obj
        self.view = View(claim_name=dv.name, max_attempts=r.config.policy.max_attempts)

    async def run(self) -> Result:
        result = await self._advance()
        await self._write_status()
        return result

    def _see(self, **changes: Any) -> None:
        self.view = dataclasses.replace(self.view, **changes)

    # -- the steps -------------------------------------------------------------------------
    async def _advance(self) -> Result:
        dv, r = self.dv, self.r
        pvc = await r.kube.get_or_none(PVCS, dv.name, dv.namespace)
        if pvc is None:
            return await self._create_pvc()
        if not self._ours(pvc):
            adopted = await self._adopt(pvc)
            if adopted is None:
                return Result(requeue_after=30.0)
            pvc = adopted
        record = ImportRecord.from_pvc(pvc)
        phase = (pvc.get("status") or {}).get("phase") or "Pending"
        self._see(pvc_phase=phase, record=record)
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            deleting = f'Resource "{dv.name}" marked for deletion'
            self._see(problem=ClaimProblem(ConditionReason.PENDING, deleting))
            return Result(requeue_after=5.0)
        pods = owned_pods(r.caches.pods.items(), dv.uid)
        if record.done:
            await self._clean_up(record, pods)
            return Result()
        if phase == "Lost":
            return Result()
        waiting = r.waits_for_consumer(pvc)
        immediate = ANN_IMMEDIATE_BINDING in dv.annotations
        if phase != "Bound" and not (waiting and immediate):
            self._see(waiting_for_consumer=waiting)
            return Result()
        return await self._follow_attempt(pvc, record, pods)

    def _ours(self, pvc: Mapping[str, Any]) -> bool:
        meta = pvc.get("metadata") or {}
        refs = meta.get("ownerReferences") or []
        if any(ref.get("controller") and ref.get("uid") == self.dv.uid for ref in refs):
            return True
        return (meta.get("annotations") or {}).get(ANN_CREATED_FOR_DATAVOLUME) == self.dv.uid

    def _render_pvc(self) -> dict[str, Any] | None:
        r = self.r
        try:
            return render_pvc(self.dv, r.storage_profile(self.dv), r.cdi_config())
        except RenderError as exc:
            self._see(problem=ClaimProblem(exc.reason, exc.message))
            return None

    async def _create_pvc(self) -> Result:
        desired = self._render_pvc()
        if desired is None:
            return Result(requeue_after=30.0)
        try:
            await self.r.kube.create(PVCS, desired, self.dv.namespace)
        except Conflict:
            return Result(requeue_after=1.0)  # someone (we, before a restart) made it already
        return Result(requeue_after=1.0)

    async def _adopt(self, pvc: dict[str, Any]) -> dict[str, Any] | None:
        dv, r = self.dv, self.r
        allowed = dv.annotations.get(ANN_ALLOW_CLAIM_ADOPTION)
        if not (allowed == "true" or (allowed is None and r.config.claim_adoption_gate)):
            msg = f'Resource "{dv.name}" already exists and is not managed by DataVolume'
            self._see(problem=ClaimProblem(ConditionReason.ERR_RESOURCE_EXISTS, msg))
            return None
        desired = self._render_pvc()
        if desired is None:
            return None
        annotations: dict[str, Any] = dict(desired["metadata"]["annotations"])
        current = (pvc.get("metadata") or {}).get("annotations") or {}
        if ANN_PRE_POPULATED in dv.annotations or current.get(ANN_POPULATED_FOR) == dv.name:
            done = ImportRecord(
                outcome=OUTCOME_SUCCEEDED, reason=REASON_COMPLETED, message="PVC pre-populated"
            )
            annotations.update(done.annotations())
        # No owner reference: an adopted claim outlives its DataVolume.
        return await r.kube.patch(
            PVCS, dv.name, {"metadata": {"annotations": annotations}}, dv.namespace
        )

    async def _follow_attempt(
        self, pvc: dict[str, Any], record: ImportRecord, pods: dict[str, dict[str, Any]]
    ) -> Result:
        claim = str(pvc["metadata"]["name"])
        attempt = record.failed_attempts
        pod = pods.get(attempt_pod_name(claim, attempt))
        if pod is None:
            return await self._start_attempt(pvc, record, pods, attempt)
        pod_phase = (pod.get("status") or {}).get("phase") or "Pending"
        self._see(pod_phase=pod_phase)
        outcome = pod_outcome(pod)
        if outcome is None:
            if pod_phase != "Running":
                return Result()
            self._see(progress=await self._scrape(pod))
            return Result(requeue_after=self.r.config.progress_interval)
        policy = self.r.config.policy
        decision = policy.decide(outcome, attempt)
        base = dataclasses.replace(record, reason=outcome.reason, message=outcome.message)
        if decision == Decision.SUCCEED:
            new = dataclasses.replace(base, outcome=OUTCOME_SUCCEEDED)
        elif decision == Decision.RETRY:
            new = dataclasses.replace(base, failed_attempts=attempt + 1)
        else:
            new = dataclasses.replace(base, outcome=OUTCOME_FAILED)
        pvc = await self._record(pvc, new)
        self._see(record=new, pod_phase=None)
        if decision == Decision.RETRY:
            delay = policy.retry_delay(attempt + 1)
            self._see(retry_in=delay)
            await self.r.events.emit(
                self.obj,
                WARNING,
                ConditionReason.ERR_IMPORT_FAILED,
                f"Import attempt {attempt + 1} of {policy.max_attempts} failed: "
                f"{outcome.reason}: {outcome.message}; retrying in {delay:.0f}s",
            )
            return Result(requeue_after=delay)
        if decision == Decision.SUCCEED:
            await self._clean_up(new, pods)
        return Result()

    async def _start_attempt(
        self,
        pvc: dict[str, Any],
        record: ImportRecord,
        pods: dict[str, dict[str, Any]],
        attempt: int,
    ) -> Result:
        r, dv = self.r, self.dv
        claim = str(pvc["metadata"]["name"])
        if attempt > 0:
            wait = self._backoff_left(pods.get(attempt_pod_name(claim, attempt - 1)), attempt)
            if wait > 0:
                self._see(retry_in=wait)
                return Result(requeue_after=wait)
        name = attempt_pod_name(claim, attempt)
        if record.pod_name != name:
            pvc = await self._record(pvc, dataclasses.replace(record, pod_name=name))
        cdi_config = r.cdi_config()
        config = ImporterPodConfig(
            image=r.config.importer_image,
            cdi_config=cdi_config,
            command=(),
            pull_policy=r.config.pull_policy,
            proxy_auth_secret=await self._proxy_auth_secret(claim, cdi_config),
        )
        try:
            pod = desired_pod(dv, pvc, config, attempt)
        except RenderError as exc:
            self._see(problem=ClaimProblem(exc.reason, exc.message))
            return Result(requeue_after=30.0)
        try:
            await r.kube.create(PODS, pod, dv.namespace)
        except Conflict:
            pass  # created before a restart, or by the previous reconcile: same pod
        self._see(pod_phase="Pending")
        return Result(requeue_after=r.config.progress_interval)

    async def _proxy_auth_secret(self, claim: str, cdi_config: CDIConfig) -> str | None:
        """Create the Secret with the importProxy credentials (``cdi.render.proxy_auth``);
        its name. The name is a digest of the content, so one that exists is the same."""
        secret = render_proxy_auth_secret(self.dv, claim, cdi_config)
        if secret is None:
            return None
        try:
            await self.r.kube.create(SECRETS, secret, self.dv.namespace)
        except Conflict:
            pass  # an earlier attempt (or reconcile) created it
        return str(secret["metadata"]["name"])

    def _backoff_left(self, previous: Mapping[str, Any] | None, attempt: int) -> float:
        delay = self.r.config.policy.retry_delay(attempt)
        outcome = pod_outcome(dict(previous)) if previous else None
        finished = parse_time(outcome.finished_at) if outcome else None
        if finished is None:
            return 0.0
        return max(0.0, finished + delay - self.r.clock())

    async def _scrape(self, pod: Mapping[str, Any]) -> Progress | None:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        text = await self.r.scraper(str(ip), metrics_port(pod, METRICS_PORT))
        return parse_metrics(text, self.dv.uid) if text else None

    async def _record(self, pvc: dict[str, Any], record: ImportRecord) -> dict[str, Any]:
        if not record.differs_from(pvc):
            return pvc
        meta = pvc["metadata"]
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": record.annotations(),
            }
        }
        return await self.r.kube.patch(PVCS, meta["name"], patch, meta.get("namespace"))

    async def _clean_up(self, record: ImportRecord, pods: dict[str, dict[str, Any]]) -> None:
        """After success the importer pods go (unless asked to retain them); failed attempts'
        pods stay for their logs until the DataVolume is deleted."""
        if record.outcome != OUTCOME_SUCCEEDED:
            return
        if self.dv.annotations.get(ANN_RETAIN_AFTER_COMPLETION) == "true":
            return
        for name, pod in pods.items():
            if (pod.get("status") or {}).get("phase") == "Failed":
                continue
            try:
                await self.r.kube.delete(
                    PODS, name, self.dv.namespace, uid=pod["metadata"].get("uid")
                )
            except (NotFound, Conflict):
                pass

    # -- status ----------------------------------------------------------------------------
    async def _write_status(self) -> None:
        old = dict(self.obj.get("status") or {})
        new = compute_status(self.view, old, utc_now())
        if new == old:
            return
        meta = self.obj["metadata"]
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": new}
        await self.r.kube.patch(DATAVOLUMES, self.dv.name, patch, self.dv.namespace, sub="status")
        if new.get("phase") != old.get("phase"):
            await self._phase_event(str(new["phase"]))

    async def _phase_event(self, phase: str) -> None:
        view = self.view
        if view.problem is not None:
            await self.r.events.emit(self.obj, WARNING, view.problem.reason, view.problem.message)
            return
        kind, reason = PHASE_EVENTS.get(phase, (NORMAL, phase))
        messages: dict[str, str] = {
            Phase.PENDING: f"PVC {view.claim_name} Pending",
            Phase.WAIT_FOR_FIRST_CONSUMER: f"PVC {view.claim_name} waits for its first consumer",
            Phase.PVC_BOUND: f"PVC {view.claim_name} Bound",
            Phase.IMPORT_SCHEDULED: f"Import into {view.claim_name} scheduled",
            Phase.IMPORT_IN_PROGRESS: f"Import into {view.claim_name} in progress",
            Phase.SUCCEEDED: f"Successfully imported into PVC {view.claim_name}",
        }
        message = messages.get(phase) or (
            f"{view.record.reason}: {view.record.message}" if view.record.reason else phase
        )
        await self.r.events.emit(self.obj, kind, reason, message)
