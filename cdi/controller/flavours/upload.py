"""The upload flavour: an upload server pod, its Service and certificate Secret for a PVC.

CDI splits upload in two: a PVC-level controller that runs the server for any PVC annotated
``cdi.kubevirt.io/storage.upload.target``, and a DataVolume controller that only reads that
PVC's annotations into phases. We keep the same split with one engine: ``UploadWorker`` takes
one level-triggered step on a PVC (DataVolume or not) and says what it saw; ``UploadFlavour``
is the DataVolume face (``Flavour`` protocol: phases, events, ``sync``/``finish``) and
``cdi.controller.uploadpvc`` the face for plain PVCs.

What a step decides is a pure function of the pod (``assess``, on the worker pod engine
``cdi.controller.workerpod``, which says whether the pod is ours and reads it), so every path is
visible in one place and unit-testable; the worker then acts on the decision:

==================================  =========================================================
the server pod                      action
==================================  =========================================================
none                                issue a serving certificate (Secret ``<pod>-tls``), create
                                    the Service and the pod, record the pod's UID on the PVC
not the UID recorded                an impostor: Warning event, deleted by UID, never read
pending, or running and not ready   ``storage.pod.ready: "false"`` (UploadScheduled)
running and ready                   ``storage.pod.ready: "true"`` (UploadReady)
exited 0, ``DeadlinePassed``        delete pod and Secret; the next step creates both afresh
exited 0, ``Completed``             ``storage.pod.phase: Succeeded``; pod, Service, Secret go
failed                              ``storage.pod.phase: Failed`` with the typed reason
==================================  =========================================================

Container restarts (``restartPolicy: OnFailure``) are recorded as ``storage.pod.restarts``
(the DataVolume's ``status.restartCount``) with the last termination's reason. As in CDI they
never fail the upload: the server restarts so the user can retry (an async upload that failed
after it was answered exits 1 on purpose). The durable
record is CDI's annotations (``cdi.controller.record``), written with one merge patch per step.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cdi.api.cdiresource import lifetimes
from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_POD_READY,
    ANN_PREALLOCATION_APPLIED,
    ANN_RETAIN_AFTER_COMPLETION,
    Phase,
)
from cdi.api.termination import REASON_COMPLETED
from cdi.controller import workerpod
from cdi.controller.flavours import JSON, Claim, FlavourDefaults, FlavourDeps, PhaseEvent
from cdi.controller.policy import Outcome, pod_problem, verification_of
from cdi.controller.record import (
    OUTCOME_FAILED,
    OUTCOME_SUCCEEDED,
    ClaimRecord,
    sealed_annotations,
)
from cdi.controller.refusals import QUOTA_RETRY, refused_pod
from cdi.controller.status import ClaimProblem, FlavourPhases, View
from cdi.controller.workerpod import Trust, create_pod, pod_uid, remove_impostor
from cdi.kube.client import PODS, PVCS, SECRETS, SERVICES, Resource
from cdi.kube.errors import Forbidden
from cdi.kube.events import NORMAL, WARNING
from cdi.kube.workqueue import Result
from cdi.pki.upload import (
    SERVER_CERT_LIFETIME,
    UploadCAs,
    issue_server_credentials,
    server_lifetime,
)
from cdi.pki.uploadca import fingerprints
from cdi.render import RenderError
from cdi.render.upload_pod import (
    UPLOAD_CLIENT_NAME,
    UPLOAD_COMPONENT,
    UploadPodConfig,
    render_upload_pod,
    render_upload_secret,
    render_upload_service,
    upload_pod_name,
    upload_secret_name,
)

UPLOAD_PHASES = FlavourPhases(
    scheduled=Phase.UPLOAD_SCHEDULED,
    in_progress=Phase.UPLOAD_READY,
    worker="Upload server",
    activity="Upload",
    running_reason="Pod is running",
)
UPLOAD_EVENTS: Mapping[str, PhaseEvent] = {
    Phase.UPLOAD_SCHEDULED: PhaseEvent(NORMAL, "UploadScheduled", "Upload into {claim} scheduled"),
    Phase.UPLOAD_READY: PhaseEvent(NORMAL, "UploadReady", "Upload into {claim} ready"),
    Phase.SUCCEEDED: PhaseEvent(NORMAL, "UploadSucceeded", "Successfully uploaded into {claim}"),
    Phase.FAILED: PhaseEvent(WARNING, "UploadFailed"),
}
REASON_UNRECORDED_POD = "UnrecordedUploadPod"
UPLOAD_COMPLETE = "Upload Complete"
UNSCHEDULABLE = "Upload server pod cannot be scheduled"
# The server's reason for exiting 0 at its deadline with no upload in flight (CDI's
# ``deadlinePassed``): its certificate is due for renewal, the upload is not over.
REASON_DEADLINE_PASSED = "DeadlinePassed"


@dataclass(frozen=True)
class UploadSettings:
    """How upload server pods are made and followed."""

    image: str = "quay.io/cdi-py/cdi-uploadserver:latest"
    pull_policy: str = "IfNotPresent"
    namespace: str = "cdi"  # where the CA Secrets live
    cert_lifetime: dt.timedelta = SERVER_CERT_LIFETIME
    poll_interval: float = 2.0  # requeue while the pod is not ready yet


class Action(StrEnum):
    CREATE = "Create"
    IMPOSTOR = "Impostor"
    WAIT = "Wait"
    READY = "Ready"
    RENEW = "Renew"
    SUCCEED = "Succeed"
    FAIL = "Fail"


@dataclass(frozen=True)
class Verdict:
    """What the server pod says (``cdi.controller.workerpod.assess``), and what to do about it."""

    action: Action
    restarts: int = 0
    reason: str | None = None  # of the last termination (a restart, or the end)
    message: str | None = None
    preallocation_applied: bool = False
    verification: str | None = None  # a verified volume: what reading it back found


def assess(pod: Mapping[str, Any] | None, recorded_uid: str | None) -> Verdict:
    """The decision for one step, from the pod at the server's name and the UID recorded."""
    seen = workerpod.assess(pod, recorded_uid, UPLOAD_COMPONENT)
    if seen.trust == Trust.ABSENT:
        return Verdict(Action.CREATE)
    if seen.trust == Trust.IMPOSTOR:
        return Verdict(Action.IMPOSTOR)
    last = seen.last_restart
    base = Verdict(
        Action.WAIT, seen.restarts, last.reason if last else None, last.message if last else None
    )
    if seen.deleting:
        return base
    if seen.outcome is not None:
        return _finished(seen.outcome, seen.phase, base)
    if seen.phase == "Running" and seen.ready:
        return dataclasses.replace(base, action=Action.READY)
    return base


def _finished(outcome: Outcome, phase: str | None, base: Verdict) -> Verdict:
    term = outcome.termination
    if outcome.reason == REASON_DEADLINE_PASSED and phase == "Succeeded":
        return dataclasses.replace(base, action=Action.RENEW)
    if outcome.succeeded:
        applied = bool(term and term.preallocation_applied)
        message = (term.message if term else "") or UPLOAD_COMPLETE
        return Verdict(
            Action.SUCCEED,
            base.restarts,
            REASON_COMPLETED,
            message,
            applied,
            verification_of(outcome),
        )
    return Verdict(Action.FAIL, base.restarts, outcome.reason, outcome.message)


def phase_for(assessment: Verdict) -> str | None:
    """The pod phase the status function should see (UploadReady only once ready)."""
    return {Action.READY: "Running", Action.SUCCEED: None, Action.FAIL: None}.get(
        assessment.action, "Pending"
    )


@dataclass(frozen=True)
class Target:
    """A PVC to fill by upload: as read this step, its record, and the config in force."""

    pvc: JSON
    record: ClaimRecord
    cdi_config: CDIConfig = field(default_factory=CDIConfig)
    client_name: str = UPLOAD_CLIENT_NAME  # the CN the server demands (a clone's own name)

    @property
    def name(self) -> str:
        return str(self.pvc["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.pvc["metadata"]["namespace"])


@dataclass
class Seen:
    """What one step of the worker saw and wrote."""

    assessment: Verdict
    record: ClaimRecord
    problem: ClaimProblem | None = None
    requeue_after: float | None = None
    pod_problem: tuple[str, str] | None = None  # the server pod's create was refused


class UploadWorker:
    """One step of upload work on a PVC (bound, or bindable by the server pod itself)."""

    def __init__(self, deps: FlavourDeps, settings: UploadSettings) -> None:
        self.deps, self.settings = deps, settings
        self.cas = UploadCAs(deps.kube.sync, settings.namespace)

    async def step(self, claim: Target, event_target: Mapping[str, Any]) -> Seen:
        ns, name = claim.namespace, claim.name
        pod = await self.deps.kube.get_or_none(PODS, upload_pod_name(name), ns)
        verdict = assess(pod, claim.record.pod_uid)
        record = _recorded(claim.record, verdict)
        if verdict.action == Action.CREATE:
            return await self._create(claim, record, verdict)
        if verdict.action == Action.IMPOSTOR:
            assert pod is not None
            await remove_impostor(
                self.deps.kube,
                pod,
                ns,
                events=self.deps.events,
                about=event_target,
                reason=REASON_UNRECORDED_POD,
                work="upload",
            )
            return Seen(verdict, record, requeue_after=1.0)
        if verdict.action == Action.RENEW:
            await self._delete(PODS, upload_pod_name(name), ns, pod_uid(pod or {}))
            await self._delete(SECRETS, upload_secret_name(name), ns)
            record = dataclasses.replace(record, pod_uid=None)
            await self._write(claim.pvc, record, ready=False)
            return Seen(verdict, record, requeue_after=1.0)
        ready = verdict.action == Action.READY
        extra = {ANN_PREALLOCATION_APPLIED: "true"} if verdict.preallocation_applied else {}
        pvc = await self._write(claim.pvc, record, ready=ready, extra=extra)
        if verdict.action == Action.SUCCEED:
            await self.cleanup(dataclasses.replace(claim, pvc=pvc, record=record))
        if verdict.action in (Action.SUCCEED, Action.FAIL):
            return Seen(verdict, record)
        # a server pod the scheduler cannot place (cdi.render.placement) waits, and says so
        stuck = pod_problem(pod, UNSCHEDULABLE) if pod and verdict.action == Action.WAIT else None
        return Seen(
            verdict,
            record,
            requeue_after=None if ready else self.settings.poll_interval,
            pod_problem=stuck,
        )

    async def _create(self, claim: Target, record: ClaimRecord, verdict: Verdict) -> Seen:
        pvc, ns, name = claim.pvc, claim.namespace, claim.name
        server_ca, client_ca = await self.deps.kube.call(self.cas.load)
        now = dt.datetime.fromtimestamp(self.deps.clock(), dt.UTC)
        life = server_lifetime(claim.cdi_config, self.settings.cert_lifetime)
        ca_life = lifetimes(claim.cdi_config.cert_config).ca
        creds = issue_server_credentials(
            server_ca, client_ca, upload_pod_name(name), ns, now, life, ca_life
        )
        config = UploadPodConfig(
            image=self.settings.image,
            pull_policy=self.settings.pull_policy,
            cdi_config=claim.cdi_config,
            deadline=creds.deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
            client_name=claim.client_name,
            client_cas=fingerprints(creds.client_ca_pem),
        )
        try:
            pod = render_upload_pod(pvc, config)
        except RenderError as exc:
            return Seen(verdict, record, ClaimProblem(exc.reason, exc.message), 30.0)
        try:
            await self._replace_secret(render_upload_secret(pvc, creds.secret_data()), ns)
            # None: made by an earlier step; its spec is ours (name and selector are fixed)
            await self.deps.kube.create_if_absent(SERVICES, render_upload_service(pvc), ns)
            uid = await create_pod(self.deps.kube, pod, ns)
        except Forbidden as exc:  # a quota (or admission) refusal: again later
            refused = refused_pod(upload_pod_name(name), exc)
            return Seen(verdict, record, requeue_after=QUOTA_RETRY, pod_problem=refused)
        if uid is None:
            return Seen(verdict, record, requeue_after=1.0)  # someone's pod: next step judges
        record = dataclasses.replace(record, pod_uid=uid)
        # Unguarded: the pod may bind the claim (a new resourceVersion) before this write.
        await self._write(pvc, record, ready=False, guarded=False)
        return Seen(verdict, record, requeue_after=self.settings.poll_interval)

    async def _replace_secret(self, secret: JSON, ns: str) -> None:
        """A fresh certificate every time a pod is created: an old Secret goes first."""
        if await self.deps.kube.create_if_absent(SECRETS, secret, ns) is None:
            await self._delete(SECRETS, secret["metadata"]["name"], ns)
            await self.deps.kube.create(SECRETS, secret, ns)

    async def _delete(self, res: Resource, name: str, ns: str, uid: str | None = None) -> None:
        await self.deps.kube.delete_if_present(res, name, ns, uid=uid)

    async def _write(
        self,
        pvc: JSON,
        record: ClaimRecord,
        *,
        ready: bool,
        extra: Mapping[str, str] | None = None,
        guarded: bool = True,
    ) -> JSON:
        """One merge patch of the record, ``storage.pod.ready`` and ``extra``, if any differs."""
        meta = pvc["metadata"]
        wanted: dict[str, str | None] = {
            **record.annotations(),
            **sealed_annotations(self.deps.seal, pvc, record),
            ANN_POD_READY: str(ready).lower(),
            **(extra or {}),
        }
        current = meta.get("annotations") or {}
        if all(current.get(k) == v for k, v in wanted.items()):
            return pvc
        patch: JSON = {"metadata": {"annotations": wanted}}
        if guarded:
            patch["metadata"]["resourceVersion"] = meta.get("resourceVersion")
        return await self.deps.kube.patch(PVCS, meta["name"], patch, meta.get("namespace"))

    async def cleanup(self, claim: Target) -> None:
        """After success: the pod (unless asked to retain it), the Service and the Secret go.
        A failed pod stays for its logs until the PVC goes."""
        ns, name = claim.namespace, claim.name
        if claim.record.outcome != OUTCOME_SUCCEEDED:
            return
        ann = claim.pvc["metadata"].get("annotations") or {}
        if ann.get(ANN_RETAIN_AFTER_COMPLETION) != "true":
            await self._delete(PODS, upload_pod_name(name), ns, claim.record.pod_uid)
        await self._delete(SERVICES, upload_pod_name(name), ns)
        await self._delete(SECRETS, upload_secret_name(name), ns)

    async def remove(self, pvc: Mapping[str, Any]) -> None:
        """The PVC is no upload target (any more): its server, Service and Secret go."""
        ns, name = pvc["metadata"]["namespace"], pvc["metadata"]["name"]
        for res, child in ((PODS, upload_pod_name(name)), (SERVICES, upload_pod_name(name))):
            found = await self.deps.kube.get_or_none(res, child, ns)
            refs = ((found or {}).get("metadata") or {}).get("ownerReferences") or []
            if any(r.get("uid") == pvc["metadata"].get("uid") for r in refs):
                await self._delete(res, child, ns, (found or {})["metadata"].get("uid"))
        # The controller may not read Secrets; the certificate Secret's name is ours (as in
        # _replace_secret), and the PVC's owner reference removes it with the claim anyway.
        await self._delete(SECRETS, upload_secret_name(name), ns)


def _recorded(record: ClaimRecord, verdict: Verdict) -> ClaimRecord:
    """The record after this step: restarts and their last reason; the outcome when over."""
    out = dataclasses.replace(record, failed_attempts=max(record.failed_attempts, verdict.restarts))
    if verdict.reason and verdict.action not in (Action.CREATE, Action.IMPOSTOR):
        out = dataclasses.replace(out, reason=verdict.reason, message=verdict.message)
    if verdict.action == Action.SUCCEED:
        out = dataclasses.replace(out, outcome=OUTCOME_SUCCEEDED, verification=verdict.verification)
    elif verdict.action == Action.FAIL:
        out = dataclasses.replace(out, outcome=OUTCOME_FAILED)
    return out


class UploadFlavour(FlavourDefaults):
    """The DataVolume face of ``UploadWorker`` (``source.upload``)."""

    phases = UPLOAD_PHASES
    events = UPLOAD_EVENTS

    def __init__(self, deps: FlavourDeps, settings: UploadSettings | None = None) -> None:
        self.worker = UploadWorker(deps, settings or UploadSettings())

    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        target = Target(claim.pvc, claim.record, claim.cdi_config)
        seen = await self.worker.step(target, claim.obj)
        view = dataclasses.replace(
            view,
            record=seen.record,
            pod_phase=phase_for(seen.assessment),
            problem=seen.problem or view.problem,
            pod_problem=seen.pod_problem,
        )
        return view, Result(requeue_after=seen.requeue_after)

    async def finish(self, claim: Claim) -> None:
        await self.worker.cleanup(Target(claim.pvc, claim.record, claim.cdi_config))
