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

from cdi.api.config import CDIConfig
from cdi.api.constants import KIND_VOLUME_IMPORT_SOURCE
from cdi.controller.datavolume import Store
from cdi.controller.flavours import JSON, Claim
from cdi.controller.flavours.import_ import IMPORT_PHASES, ImportFlavour
from cdi.controller.pods import owned_pods
from cdi.controller.populators.handover import PrimePopulator
from cdi.controller.record import ClaimRecord
from cdi.controller.seal import Seal
from cdi.controller.status import View
from cdi.kube.client import VOLUME_IMPORT_SOURCES, AsyncKube
from cdi.kube.events import WARNING, EventRecorder
from cdi.kube.workqueue import Result
from cdi.render import RenderError
from cdi.render.prime import import_request, render_prime, source_name

log = logging.getLogger(__name__)

# CDI's event reasons on the target claim (the shared ones are in ``handover``).
REASON_POPULATED = "ImportSucceeded"
REASON_FAILED = "ImportFailed"


class ImportPopulator(PrimePopulator):
    """Populate claims whose ``dataSourceRef`` names a ``VolumeImportSource``."""

    kinds = (KIND_VOLUME_IMPORT_SOURCE,)
    activity = "Import"
    succeeded = REASON_POPULATED
    failed = REASON_FAILED

    def __init__(
        self,
        kube: AsyncKube,
        pods: Store,
        storage_classes: Store,
        cdi_config: Callable[[], CDIConfig],
        events: EventRecorder,
        seal: Seal,
        flavour: ImportFlavour,
    ) -> None:
        super().__init__(kube, storage_classes, cdi_config, events, seal)
        self.pods = pods
        self.flavour = flavour

    async def read_source(self, target: JSON) -> JSON | None:
        namespace = target["metadata"]["namespace"]
        return await self.kube.get_or_none(VOLUME_IMPORT_SOURCES, source_name(target), namespace)

    def render(self, target: JSON, source: JSON) -> JSON:
        return render_prime(target, source)

    async def work(self, target: JSON, prime: JSON, record: ClaimRecord) -> Result:
        try:
            request = import_request(target, prime)
        except RenderError as exc:
            log.warning("%s: %s", target["metadata"]["name"], exc.message)
            await self.event_once(target, WARNING, exc.reason, exc.message)
            return Result()
        pods = owned_pods(self.pods.items(), target["metadata"]["uid"])
        claim = Claim(request, target, prime, record, pods, self.cdi_config(), sealed=True)
        view = View(claim_name=target["metadata"]["name"], phases=IMPORT_PHASES)
        view, result = await self.flavour.sync(claim, view)
        await self.mirror(target, view.record, view.pod_phase, view.progress)
        return result
