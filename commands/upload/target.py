"""The Kubernetes half of ``cdi upload``: find or make the upload target, wait until its upload
pod is ready, find the proxy, get a token, and wait for the volume to be processed.

virtctl's flow, step for step (``imageupload.go``), with its printed lines, so a user who knows
``virtctl image-upload`` reads the same story. All cluster access goes through one injected
``cdi.kube.client.Kube`` acting with the user's own kubeconfig credentials (the token request
too: the kube-apiserver authenticates the user and forwards to our aggregated token API). The
clock and sleep are injected so waits are testable; polling every 2 s is virtctl's choice and
is cheap for the API server.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from cdi.api.constants import ANN_POD_PHASE, ANN_POD_READY, ANN_UPLOAD_REQUEST, CDICONFIG_NAME
from cdi.kube.client import (
    CDI_CONFIGS,
    DATA_SOURCES,
    DATAVOLUMES,
    EVENTS,
    PVCS,
    STORAGE_CLASSES,
    Kube,
    Resource,
)
from cdi.kube.errors import Conflict, KubeError, NotFound
from commands.upload.options import (
    ClaimNotValid,
    ProcessingFailed,
    ProvisioningFailed,
    TargetNotReady,
    UploadCliError,
    UploadOptions,
    check_existing_pvc,
    no_datavolume,
    populator_prime_name,
    proxy_url_from_config,
    render_datasource,
    render_datavolume,
    render_pvc,
    updated_datasource,
    wffc_refusal,
    with_scheme,
)

JSON = dict[str, Any]
UPLOAD_TOKEN_REQUESTS: Final = Resource(
    "upload.cdi.kubevirt.io", "v1beta1", "uploadtokenrequests", "UploadTokenRequest"
)
TOKEN_NAME_PREFIX: Final = "token-for-virtctl-"
DATASOURCE_ATTEMPTS: Final = 5  # a DataSource's controller also writes it (labels, status)
# The PV controller's own retry of a stale update: not a provisioning failure (virtctl skips it;
# an event carries no other marker of it).
OPTIMISTIC_LOCK_MESSAGE: Final = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


class WaitTimedOut(TargetNotReady):
    """A wait ran out of time (virtctl's ``wait.ErrWaitTimeout`` text)."""


@dataclass(frozen=True)
class Timing:
    poll: float = 2.0  # virtctl's uploadReadyWaitInterval and processingWaitInterval
    processing_total: float = 24 * 3600.0  # virtctl's processingWaitTotal
    final_phase_total: float = 60.0  # for the DataVolume to show the phase after the PVC did


@dataclass
class UploadTarget:
    """One target (``opts.name`` in ``namespace``) and the steps that prepare and follow it."""

    kube: Kube
    namespace: str
    opts: UploadOptions
    say: Callable[[str], None] = print
    timing: Timing = field(default_factory=Timing)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    proxy_ca: str | None = None  # PEM, when CDIConfig publishes the proxy's CA

    # -- prepare -------------------------------------------------------------------------
    def prepare(self) -> None:
        """Use the existing PVC if it may take the upload, else create the DV/PVC."""
        o, ns = self.opts, self.namespace
        try:
            pvc = self.existing_pvc()
        except NotFound:
            if o.no_create:
                raise
            created = self.create()
            self.say(f"{o.kind} {ns}/{created['metadata']['name']} created")
            return
        pvc = self.ensure_upload_annotation(pvc)
        self.say(f"Using existing PVC {ns}/{pvc['metadata']['name']}")

    def existing_pvc(self) -> JSON:
        o, ns = self.opts, self.namespace
        try:
            pvc = self.kube.get(PVCS, o.name, ns)
        except NotFound:
            self.say(f"PVC {ns}/{o.name} not found ")
            raise
        if not o.create_pvc:
            pvc = self._datavolume_pvc(pvc)
        check_existing_pvc(o, pvc)
        return pvc

    def _datavolume_pvc(self, pvc: JSON) -> JSON:
        """``dv NAME``: the PVC must belong to a DataVolume; with populators, PVC prime."""
        o, ns = self.opts, self.namespace
        dv = self.kube.get_or_none(DATAVOLUMES, o.name, ns)
        if dv is None:
            raise no_datavolume(pvc, ns, o.name)
        prime = populator_prime_name(dv, pvc, ns, o.name)
        if prime is None:
            return pvc
        try:
            return self.kube.get(PVCS, prime, ns)
        except NotFound as exc:
            raise UploadCliError(f"Unable to get PVC Prime {ns}/{o.name}") from exc

    def ensure_upload_annotation(self, pvc: JSON) -> JSON:
        """``--no-create`` on a PVC without the annotation makes it an upload target."""
        annotations = (pvc.get("metadata") or {}).get("annotations") or {}
        if ANN_UPLOAD_REQUEST in annotations:
            return pvc
        patch = {"metadata": {"annotations": {ANN_UPLOAD_REQUEST: ""}}}
        return self.kube.patch(PVCS, pvc["metadata"]["name"], patch, self.namespace)

    def create(self) -> JSON:
        o, ns = self.opts, self.namespace
        obj = render_pvc(o, ns) if o.create_pvc else render_datavolume(o, ns)
        if o.storage_class:  # virtctl checks the class exists before creating
            self.kube.get(STORAGE_CLASSES, o.storage_class)
        return self.kube.create(PVCS if o.create_pvc else DATAVOLUMES, obj, ns)

    def ensure_datasource(self) -> JSON:
        """``--datasource``: DataSource NAME pointing at the uploaded volume, created, or (it
        exists) repointed and relabelled in place, as virtctl does."""
        o, ns = self.opts, self.namespace
        for attempt in range(DATASOURCE_ATTEMPTS):
            existing = self.kube.get_or_none(DATA_SOURCES, o.name, ns)
            try:
                if existing is None:
                    written = self.kube.create(DATA_SOURCES, render_datasource(o, ns), ns)
                    self.say(f"DataSource {ns}/{o.name} created")
                else:
                    written = self.kube.replace(DATA_SOURCES, updated_datasource(existing, o, ns))
                    self.say(f"DataSource {ns}/{o.name} updated")
                return written
            except Conflict:  # the DataSource controller wrote it meanwhile: read it again
                if attempt == DATASOURCE_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    # -- wait until the upload pod takes bytes ---------------------------------------------
    def wait_ready(self) -> None:
        logged = False

        def ready() -> bool:
            nonlocal logged
            done = self._pvc_ready() if self.opts.create_pvc else self._dv_ready()
            if not done and not logged:
                self.say(f"Waiting for PVC {self.opts.name} upload pod to be ready...")
                logged = True
            if done and logged:
                self.say("Pod now ready")
            return done

        self._poll(ready, self.opts.wait_secs)

    def _pvc_ready(self) -> bool:
        pvc = self.kube.get_or_none(PVCS, self.opts.name, self.namespace)
        if pvc is None:
            return False
        ready = (pvc["metadata"].get("annotations") or {}).get(ANN_POD_READY, "")
        if ready.lower() in ("true", "1", "t"):
            return True
        self.raise_event_errors(self.opts.name, self.opts.name)
        return False

    def _dv_ready(self) -> bool:
        dv = self.kube.get_or_none(DATAVOLUMES, self.opts.name, self.namespace)
        if dv is None:
            self.say(f"DV {self.opts.name} not found... ")
            return False
        status = dv.get("status") or {}
        phase = str(status.get("phase") or "")
        if refusal := wffc_refusal(phase, self.opts.force_bind):
            raise refusal
        if phase == "UploadReady":
            return True
        claim = str(status.get("claimName") or self.opts.name)  # CDI names it after the DV
        self.raise_event_errors(claim, self.opts.name)
        return False

    def raise_event_errors(self, pvc_name: str, dv_name: str) -> None:
        """virtctl's ``handleEventErrors``: a provisioner or the controller already said why
        the volume cannot come up; say it now rather than at the timeout."""
        pvc_uid = self._uid(PVCS, pvc_name)
        dv_uid = self._uid(DATAVOLUMES, dv_name)
        for event in self.kube.list(EVENTS, self.namespace).get("items") or []:
            involved = event.get("involvedObject") or {}
            reason, message = event.get("reason"), str(event.get("message") or "")
            kind, uid = involved.get("kind"), involved.get("uid")
            if kind == "PersistentVolumeClaim" and pvc_uid and uid == pvc_uid:
                if reason == "ProvisioningFailed" and OPTIMISTIC_LOCK_MESSAGE not in message:
                    raise ProvisioningFailed(f"Provisioning failed: {message}")
            if kind == "DataVolume" and dv_uid and uid == dv_uid:
                if reason == "ErrClaimNotValid":
                    raise ClaimNotValid(f"Claim not valid: {message}")

    def _uid(self, res: Resource, name: str) -> str:
        obj = self.kube.get_or_none(res, name, self.namespace) if name else None
        return str((obj or {}).get("metadata", {}).get("uid") or "")

    def _poll(self, done: Callable[[], bool], timeout: float) -> None:
        """``wait.PollImmediate``: check now, then every ``poll`` seconds until ``timeout``."""
        deadline = self.clock() + timeout
        while not done():
            left = deadline - self.clock()
            if left <= 0:
                raise WaitTimedOut("timed out waiting for the condition")
            self.sleep(min(self.timing.poll, left))

    # -- proxy and token -------------------------------------------------------------------
    def proxy_url(self) -> str:
        """``--uploadproxy-url``, else CDIConfig's; CDIConfig may also name the proxy's CA
        (``status.uploadProxyCA``), which is then trusted besides the system's."""
        if self.opts.proxy_url:
            return with_scheme(self.opts.proxy_url)
        config = self.kube.get(CDI_CONFIGS, CDICONFIG_NAME)
        self.proxy_ca = (config.get("status") or {}).get("uploadProxyCA") or None
        return with_scheme(proxy_url_from_config(config))

    def request_token(self) -> str:
        """A fresh upload token from ``UploadTokenRequest``, with the user's credentials."""
        request = {
            "apiVersion": UPLOAD_TOKEN_REQUESTS.api_version,
            "kind": UPLOAD_TOKEN_REQUESTS.kind,
            "metadata": {"generateName": TOKEN_NAME_PREFIX, "namespace": self.namespace},
            "spec": {"pvcName": self.opts.name},
        }
        try:
            answer = self.kube.create(UPLOAD_TOKEN_REQUESTS, request, self.namespace)
        except KubeError as exc:  # same type and reason, but say which request it was
            message = f"UploadTokenRequest for PVC {self.opts.name}: {exc.message.strip()}"
            raise type(exc)(message, status=exc.status, reason=exc.reason, body=exc.body) from exc
        token = (answer.get("status") or {}).get("token")
        if not token:
            raise UploadCliError("the UploadTokenRequest was answered without a token")
        return str(token)

    # -- after the bytes -------------------------------------------------------------------
    def wait_processed(self) -> None:
        """Until the PVC says the upload pod Succeeded (virtctl), or the DataVolume Failed."""

        def done() -> bool:
            pvc = self.kube.get(PVCS, self.opts.name, self.namespace)
            if (pvc["metadata"].get("annotations") or {}).get(ANN_POD_PHASE) == "Succeeded":
                self.say("Processing completed successfully")
                return True
            self._raise_if_failed()
            return False

        self._poll(done, self.timing.processing_total)

    def _raise_if_failed(self) -> None:
        if self.opts.create_pvc:
            return
        dv = self.kube.get_or_none(DATAVOLUMES, self.opts.name, self.namespace) or {}
        status = dv.get("status") or {}
        if status.get("phase") == "Failed":
            conditions = status.get("conditions") or []
            ready: JSON = next((c for c in conditions if c.get("type") == "Ready"), {})
            raise ProcessingFailed(
                f"DataVolume {self.namespace}/{self.opts.name} Failed: "
                f"{ready.get('reason', '')}: {ready.get('message', '')}"
            )

    def final_phase(self) -> str:
        """The DataVolume's phase once it settles (the PVC annotation may come first)."""
        if self.opts.create_pvc:
            return "Succeeded"
        phase = ""

        def settled() -> bool:
            nonlocal phase
            dv = self.kube.get_or_none(DATAVOLUMES, self.opts.name, self.namespace)
            if dv is None:  # garbage-collected after it succeeded (dataVolumeTTLSeconds)
                phase = "Succeeded"
                return True
            phase = str((dv.get("status") or {}).get("phase") or "")
            return phase in ("Succeeded", "Failed")

        try:
            self._poll(settled, self.timing.final_phase_total)
        except WaitTimedOut:
            pass
        return phase or "Unknown"
