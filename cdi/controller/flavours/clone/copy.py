"""Host-assisted (``copy``) clone: an upload server on the target claim, a source pod beside the
source claim streaming into it over mutual TLS (CDI's clone controller, reference §4.3).

The clone flavour (``cdi.controller.flavours.clone``) creates the target claim annotated
``cloneType: copy``; from then on each reconcile calls ``HostAssistedCopy.step``, which takes one
level-triggered step and says what it saw:

1. the target side is the upload engine itself (``UploadWorker``): server pod, Service and
   serving certificate for the target claim, followed by its recorded UID; the only difference
   from an upload is the client name it demands, ``srcNs/srcName-tgtNs/tgtName``;
2. once that server is ready, the source side: a client certificate Secret
   ``<target uid>-source-pod-tls`` in the source namespace (CN = that client name, signed by
   the ``cdi-uploadserver-client-ca``, with the server CA to verify the server by), then the
   pod ``<target uid>-source-pod`` (``cdi.render.clone_pod``), whose UID is recorded on the
   target claim (``clone.sourcePodUID``); a pod at that name with another UID is deleted unread
   (the worker pod engine, ``cdi.controller.workerpod``, as for every worker pod);
3. the upload server's termination decides the outcome: Succeeded ("Clone Complete") or its
   typed failure; the source pod and its Secret go (and the server's pod, Service and Secret,
   which the worker removes itself).

Phases follow the pods: CloneScheduled until the source pod runs, then CloneInProgress with
the progress scraped from the running source pod (CDI's ``kubevirt_cdi_clone_progress_total``,
served by the cloner on the pod IP, read like the importer's: ``cdi.controller.progress``).
Restarts of the source pod (``restartPolicy: OnFailure``) are counted on the record with the
last termination's reason, as for an upload server.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import GROUP
from cdi.controller.flavours import JSON, Claim, FlavourDeps
from cdi.controller.flavours.upload import Action, Seen, Target, UploadSettings, UploadWorker
from cdi.controller.policy import pod_problem
from cdi.controller.progress import Progress, parse_metrics
from cdi.controller.record import OUTCOME_SUCCEEDED, ClaimRecord
from cdi.controller.refusals import QUOTA_RETRY, refused_pod
from cdi.controller.status import ClaimProblem, View
from cdi.controller.workerpod import Assessment, Trust, assess, create_pod, remove_impostor
from cdi.kube.client import PODS, PVCS, SECRETS, SERVICES
from cdi.kube.errors import Forbidden
from cdi.kube.workqueue import Result
from cdi.pki.certs import issue_client
from cdi.pki.upload import UploadCAs, client_lifetime
from cdi.render.clone_pod import (
    ANN_COPY_TARGET,
    CLONE_SOURCE,
    LABEL_TARGET_UID,
    CloneSourcePod,
    client_name,
    client_secret_name,
    reader_node,
    render_clone_client_secret,
    render_clone_source_pod,
    source_pod_name,
)
from cdi.render.upload_pod import upload_pod_name
from cdi.render.worker_pod import Metrics, WorkerPod

ANN_SOURCE_POD_UID = f"{GROUP}/clone.sourcePodUID"
REASON_UNRECORDED_SOURCE_POD = "UnrecordedCloneSourcePod"
REASON_BAD_CLIENT_NAME = "ErrCloneClientName"
SOURCE_UNSCHEDULABLE = "Clone source pod cannot be scheduled"
CLONE_COMPLETE = ClaimRecord(
    outcome=OUTCOME_SUCCEEDED, reason="Completed", message="Clone Complete"
)


@dataclass(frozen=True)
class CopySettings:
    """How clone source pods are made: the cloner image (in cdi-worker-pod-policy's list)."""

    image: str = "quay.io/cdi-py/cdi-cloner:latest"
    pull_policy: str = "IfNotPresent"
    cert_lifetime: dt.timedelta = dt.timedelta(hours=24)
    # where the source pod serves its progress: CDI's port, on the pod IP (test node: shared
    # network namespace)
    metrics: Metrics = dataclasses.field(default_factory=lambda: Metrics(on_pod_ip=True))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


class HostAssistedCopy:
    """One step of a host-assisted clone of ``source`` into the claim of ``claim``."""

    def __init__(self, deps: FlavourDeps, upload: UploadSettings, settings: CopySettings) -> None:
        self.deps, self.kube, self.settings = deps, deps.kube, settings
        self.worker = UploadWorker(deps, upload)
        self.cas = UploadCAs(deps.kube.sync, upload.namespace)

    async def step(self, claim: Claim, source: JSON, view: View) -> tuple[View, Result]:
        target = Target(claim.pvc, claim.record, claim.cdi_config, client_name(source, claim.pvc))
        seen = await self.worker.step(target, claim.obj)
        action = seen.assessment.action
        if action == Action.SUCCEED:
            await self.cleanup(claim, source)
            record = dataclasses.replace(
                CLONE_COMPLETE,
                failed_attempts=seen.record.failed_attempts,
                pod_uid=seen.record.pod_uid,
                verification=seen.record.verification,
            )
            await self._annotate(claim.pvc, record.annotations())
            return dataclasses.replace(view, record=record), Result()
        if action == Action.FAIL:
            await self.cleanup(claim, source)
            return dataclasses.replace(view, record=seen.record), Result()
        view = dataclasses.replace(
            view,
            record=seen.record,
            problem=seen.problem or view.problem,
            pod_problem=seen.pod_problem,
        )
        if action != Action.READY:
            return dataclasses.replace(view, pod_phase="Pending"), _again(seen)
        return await self._source_side(claim, source, seen, view)

    async def _source_side(
        self, claim: Claim, source: JSON, seen: Seen, view: View
    ) -> tuple[View, Result]:
        ns = str(source["metadata"]["namespace"])
        pod = await self.kube.get_or_none(PODS, source_pod_name(claim.pvc), ns)
        recorded = (claim.pvc["metadata"].get("annotations") or {}).get(ANN_SOURCE_POD_UID)
        verdict = assess(pod, recorded, CLONE_SOURCE)
        if verdict.trust == Trust.ABSENT:
            try:
                problem = await self._create_source(claim, source)
            except Forbidden as exc:  # the source namespace's quota (or admission) refused it
                refused = refused_pod(source_pod_name(claim.pvc), exc)
                view = dataclasses.replace(view, pod_phase="Pending", pod_problem=refused)
                return view, Result(requeue_after=QUOTA_RETRY)
            view = dataclasses.replace(view, pod_phase="Pending", problem=problem or view.problem)
            return view, Result(requeue_after=30.0 if problem else 1.0)
        if verdict.impostor is not None:
            await remove_impostor(
                self.kube,
                verdict.impostor,
                ns,
                events=self.deps.events,
                about=claim.obj,
                reason=REASON_UNRECORDED_SOURCE_POD,
                work="clone",
            )
            return dataclasses.replace(view, pod_phase="Pending"), Result(requeue_after=1.0)
        record = _with_restarts(seen.record, verdict)
        if record != seen.record:
            await self._annotate(claim.pvc, record.annotations())
        phase = verdict.phase
        shown = "Running" if phase in ("Running", "Succeeded") else "Pending"
        ours = verdict.pod or {}
        progress = await self._scrape(claim, ours) if phase == "Running" else None
        view = dataclasses.replace(view, record=record, pod_phase=shown, progress=progress)
        if shown == "Pending":  # e.g. placed where the scheduler finds no node: it waits
            stuck = pod_problem(dict(ours), SOURCE_UNSCHEDULABLE)
            view = dataclasses.replace(view, pod_problem=stuck or view.pod_problem)
        return view, Result(requeue_after=1.0)

    async def _scrape(self, claim: Claim, pod: Mapping[str, Any]) -> Progress | None:
        """The running source pod's progress, None when it cannot say (yet)."""
        ip = (pod.get("status") or {}).get("podIP")
        if not ip:
            return None
        text = await self.deps.scraper(str(ip), self.settings.metrics.port)
        owner = str(claim.pvc["metadata"].get("uid") or "")
        return parse_metrics(text, owner, kind="clone") if text else None

    async def _create_source(self, claim: Claim, source: JSON) -> ClaimProblem | None:
        ns = str(source["metadata"]["namespace"])
        server_ca, client_ca = await self.kube.call(self.cas.load)
        now = dt.datetime.fromtimestamp(self.deps.clock(), dt.UTC)
        try:
            life = client_lifetime(claim.cdi_config, self.settings.cert_lifetime)
            pair = issue_client(client_ca.signer, client_name(source, claim.pvc), now, life)
        except ValueError:  # a CN is at most 64 characters
            msg = f"the clone's client name {client_name(source, claim.pvc)} is too long"
            return ClaimProblem(REASON_BAD_CLIENT_NAME, msg)
        data = {
            "tls.crt": _b64(pair.cert_pem),
            "tls.key": _b64(pair.key_pem),
            "ca.crt": _b64(server_ca.trust),  # every server CA trusted now (two mid-rotation)
        }
        secret = render_clone_client_secret(claim.dv, source, claim.pvc, data)
        await self._replace(secret, ns)
        settings = WorkerPod(
            image=self.settings.image,
            pull_policy=self.settings.pull_policy,
            metrics=self.settings.metrics,
        )
        service = await self.kube.get_or_none(
            SERVICES, upload_pod_name(claim.name), claim.pvc["metadata"]["namespace"]
        )
        cluster_ip = str(((service or {}).get("spec") or {}).get("clusterIP") or "")
        host = cluster_ip if cluster_ip not in ("", "None") else ""
        readers = (await self.kube.list(PODS, ns)).get("items") or []
        config = CloneSourcePod(
            settings,
            client_secret_name(claim.pvc),
            upload_host=host,
            cdi_config=claim.cdi_config,
            source_node=reader_node(readers, source),
        )
        pod = render_clone_source_pod(claim.dv, source, claim.pvc, config)
        uid = await create_pod(self.kube, pod, ns)
        if uid is None:
            return None  # someone's pod: the next step judges it
        # Unguarded: the upload server may have bound the claim meanwhile.
        await self._annotate(claim.pvc, {ANN_SOURCE_POD_UID: uid or None})
        return None

    async def _replace(self, secret: JSON, ns: str) -> None:
        """A fresh client certificate for every source pod: an old Secret goes first."""
        if await self.kube.create_if_absent(SECRETS, secret, ns) is None:
            await self._delete_secret(str(secret["metadata"]["name"]), ns)
            await self.kube.create(SECRETS, secret, ns)

    async def _annotate(self, pvc: JSON, annotations: Mapping[str, str | None]) -> None:
        meta = pvc["metadata"]
        patch = {"metadata": {"annotations": dict(annotations)}}
        await self.kube.patch(PVCS, meta["name"], patch, meta.get("namespace"))

    async def _delete_pod(self, name: str, ns: str, uid: str | None = None) -> None:
        await self.kube.delete_if_present(PODS, name, ns, uid=uid)

    async def _delete_secret(self, name: str, ns: str) -> None:
        await self.kube.delete_if_present(SECRETS, name, ns)

    async def cleanup(self, claim: Claim, source: Mapping[str, Any]) -> None:
        """The source pod (the recorded one) and its Secret go; so do the server's objects."""
        ns = str(source["metadata"]["namespace"])
        recorded = (claim.pvc["metadata"].get("annotations") or {}).get(ANN_SOURCE_POD_UID)
        if recorded:
            await self._delete_pod(source_pod_name(claim.pvc), ns, recorded)
        await self._delete_secret(client_secret_name(claim.pvc), ns)
        await self.worker.cleanup(Target(claim.pvc, claim.record, claim.cdi_config))

    async def abandon(self, target_ns: str, target: str) -> int:
        """The DataVolume of ``target_ns/target`` is gone: source pods (and their Secrets) left
        in other namespaces, which no owner reference collects, go; how many."""
        key = f"{target_ns}/{target}"
        claim = await self.kube.get_or_none(PVCS, target, target_ns)
        alive = "" if claim is None else str(claim["metadata"].get("uid") or "")
        found = await self.kube.list(PODS, label_selector=LABEL_TARGET_UID)
        orphans = [
            pod["metadata"]
            for pod in found.get("items") or []
            if (pod["metadata"].get("annotations") or {}).get(ANN_COPY_TARGET) == key
            and (pod["metadata"].get("labels") or {}).get(LABEL_TARGET_UID) != alive
        ]
        for meta in orphans:
            ns = str(meta.get("namespace"))
            await self._delete_pod(str(meta.get("name")), ns, meta.get("uid"))
            await self._delete_secret(f"{meta.get('name')}-tls", ns)
        return len(orphans)


def _again(seen: Seen) -> Result:
    return Result(requeue_after=seen.requeue_after if seen.requeue_after is not None else 1.0)


def _with_restarts(record: ClaimRecord, source: Assessment) -> ClaimRecord:
    """The record with the source container's restarts and its last termination's reason."""
    if source.restarts <= record.failed_attempts:
        return record
    out = dataclasses.replace(record, failed_attempts=source.restarts)
    last = source.last_restart
    if last is not None:
        out = dataclasses.replace(out, reason=last.reason, message=last.message)
    return out
