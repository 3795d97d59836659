"""The VolumeCloneSource populator: the CSI driver clones the source into ``prime-<uid>``,
then the prime's PV is handed over to the target.

A claim whose ``dataSourceRef`` names a ``VolumeCloneSource`` (``spec.source {kind:
PersistentVolumeClaim, name}``, in the claim's namespace, as in CDI) stays unbound until its
clone is complete. The steps around the prime are every populator's
(``cdi.controller.populators.handover``); what is this module's:

- before the prime exists, the source claim must exist and be populated (bound, and when a
  DataVolume made it, filled: ``cdi.controller.flavours.clone.source.populated``), else a Warning
  ``CloneWithoutSource`` (once) and a poll: a source created after the target still
  completes. Source and target must have the same volume mode (a CSI clone cannot change it;
  the host-assisted fallback is not offered here): else ``IncompatibleVolumeModes``, waiting;
- the prime (``cdi.render.prime.render_clone_prime``) is the target's claim with
  ``dataSource`` = the source claim, so the provisioner
  (the CSI external-provisioner, or the test cluster's) makes the volume as a clone: CDI's
  ``csi-clone`` plan without the temporary claim, which a same-namespace clone does not need;
- once the prime is bound the data is there: the target gets the record of a finished clone
  ("Clone Complete"), ``cdi.kubevirt.io/clonePhase: Succeeded`` and progress ``100.0%``, and
  the PV is handed over.
"""

from __future__ import annotations

from cdi.api.constants import GROUP, KIND_VOLUME_CLONE_SOURCE
from cdi.controller.flavours import JSON
from cdi.controller.flavours.clone.flavour import CLONE_COMPLETE
from cdi.controller.flavours.clone.source import populated
from cdi.controller.populators.handover import SOURCE_RECHECK, PrimePopulator
from cdi.kube.client import PVCS, VOLUME_CLONE_SOURCES
from cdi.kube.events import WARNING
from cdi.kube.workqueue import Result
from cdi.render.clone import volume_mode
from cdi.render.prime import clone_source_claim, render_clone_prime, source_name

ANN_CLONE_PHASE = f"{GROUP}/clonePhase"
REASON_POPULATED = "CloneSucceeded"
REASON_WITHOUT_SOURCE = "CloneWithoutSource"
REASON_INCOMPATIBLE_MODES = "IncompatibleVolumeModes"


class ClonePopulator(PrimePopulator):
    """Populate claims whose ``dataSourceRef`` names a ``VolumeCloneSource``."""

    kinds = (KIND_VOLUME_CLONE_SOURCE,)
    activity = "Clone"
    succeeded = REASON_POPULATED

    async def read_source(self, target: JSON) -> JSON | None:
        namespace = target["metadata"]["namespace"]
        return await self.kube.get_or_none(VOLUME_CLONE_SOURCES, source_name(target), namespace)

    async def create_prime(self, target: JSON) -> Result:
        source = await self.read_source(target)
        if source is not None and not await self._source_ready(target, source):
            return Result(requeue_after=SOURCE_RECHECK)
        return await super().create_prime(target)

    async def _source_ready(self, target: JSON, source: JSON) -> bool:
        name = clone_source_claim(source)
        claim = await self.kube.get_or_none(PVCS, name, target["metadata"]["namespace"])
        if claim is None or not populated(claim):
            message = f"The source pvc {name} doesn't exist or is not populated yet"
            await self.event_once(target, WARNING, REASON_WITHOUT_SOURCE, message)
            return False
        if volume_mode(claim) != volume_mode(target):
            message = "The volume modes of source and target are incompatible"
            await self.event_once(target, WARNING, REASON_INCOMPATIBLE_MODES, message)
            return False
        return True

    def render(self, target: JSON, source: JSON) -> JSON:
        return render_clone_prime(target, source)

    async def populate(self, target: JSON, prime: JSON) -> Result:
        if (prime.get("status") or {}).get("phase") != "Bound":
            return Result()  # the provisioner's bind re-queues us
        await self.mirror(target, CLONE_COMPLETE, None, None, {ANN_CLONE_PHASE: "Succeeded"})
        return await self.handover(target, prime)
