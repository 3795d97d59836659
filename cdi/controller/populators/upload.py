"""The VolumeUploadSource populator: an upload server on ``prime-<uid>``, then the handover.

A claim whose ``dataSourceRef`` names a ``VolumeUploadSource`` (CDI: ``spec.contentType``,
``spec.preallocation``) stays unbound while its data is uploaded into a prime claim, so a pod
that mounts it starts only with the upload complete. The steps around the prime are every
populator's (``cdi.controller.populators.handover``); what is this module's:

- the prime (``cdi.render.prime.render_upload_prime``) is an upload target: it carries
  ``storage.upload.target`` and the source's content type and preallocation, which is what the
  upload server pod is rendered from and what the upload proxy checks on PVC';
- ``populate`` runs one step of the upload engine (``UploadWorker``, the one the upload flavour
  and plain upload PVCs use) on the prime, with the target as the object its events are about:
  certificate Secret, Service and server pod ``cdi-upload-prime-<uid>``, ``storage.pod.ready``
  on the prime, restarts, deadline renewals, cleanup after success;
- the target gets what the proxy and a DataVolume read: ``storage.populator.pvcPrime`` (the
  proxy relays a token issued for the *target* to the prime's server), ``storage.pod.ready``, and
  ``storage.pod.phase`` Pending / Running (= ready, so a DataVolume says UploadReady) /
  Succeeded / Failed;
- upload succeeded: hand the PV over; failed for good: Warning ``UploadFailed``, the target
  stays unbound.

The prime's server is owned by the prime (its Service name is what the proxy dials), so the
controller maps a server pod's events through its prime to the target
(``cdi.controller.populators.watches``); the plain-PVC upload reconciler leaves primes alone
(``cdi.render.prime.is_prime``).
"""

from __future__ import annotations

from collections.abc import Callable

from cdi.api.config import CDIConfig
from cdi.api.constants import ANN_POD_READY, KIND_VOLUME_UPLOAD_SOURCE
from cdi.controller.flavours import JSON
from cdi.controller.flavours.upload import Target, UploadWorker, phase_for
from cdi.controller.populators.datavolume import Store
from cdi.controller.populators.handover import PrimePopulator
from cdi.controller.record import ClaimRecord
from cdi.controller.seal import Seal
from cdi.kube.client import VOLUME_UPLOAD_SOURCES, AsyncKube
from cdi.kube.events import NORMAL, EventRecorder
from cdi.kube.workqueue import Result
from cdi.render.prime import render_upload_prime, source_name

REASON_READY = "UploadReady"
REASON_POPULATED = "UploadSucceeded"
REASON_FAILED = "UploadFailed"


class UploadPopulator(PrimePopulator):
    """Populate claims whose ``dataSourceRef`` names a ``VolumeUploadSource``."""

    kinds = (KIND_VOLUME_UPLOAD_SOURCE,)
    activity = "Upload"
    succeeded = REASON_POPULATED
    failed = REASON_FAILED
    done_extra = {ANN_POD_READY: "false"}

    def __init__(
        self,
        kube: AsyncKube,
        storage_classes: Store,
        cdi_config: Callable[[], CDIConfig],
        events: EventRecorder,
        seal: Seal,
        worker: UploadWorker,
    ) -> None:
        super().__init__(kube, storage_classes, cdi_config, events, seal)
        self.worker = worker

    async def read_source(self, target: JSON) -> JSON | None:
        namespace = target["metadata"]["namespace"]
        return await self.kube.get_or_none(VOLUME_UPLOAD_SOURCES, source_name(target), namespace)

    def render(self, target: JSON, source: JSON) -> JSON:
        return render_upload_prime(target, source)

    async def work(self, target: JSON, prime: JSON, record: ClaimRecord) -> Result:
        seen = await self.worker.step(Target(prime, record, self.cdi_config()), target)
        ready = phase_for(seen.assessment) == "Running"
        was_ready = (target["metadata"].get("annotations") or {}).get(ANN_POD_READY) == "true"
        pod_phase = "Running" if ready else "Pending"
        await self.mirror(target, seen.record, pod_phase, None, {ANN_POD_READY: str(ready).lower()})
        if ready and not was_ready:
            name = target["metadata"]["name"]
            await self.events.emit(target, NORMAL, REASON_READY, f"Upload into {name} ready")
        if seen.record.done:
            return Result(requeue_after=0.5)  # hand over (or report the failure) next
        return Result(requeue_after=seen.requeue_after)
