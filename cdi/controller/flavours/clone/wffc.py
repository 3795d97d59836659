"""WaitForFirstConsumer targets: waiting for the consumer, placeholder claims, immediate binding.

A clone target on WaitForFirstConsumer storage with no node picked waits in PendingPopulation
for its consumer (``_waits_for_consumer``; the class from the reconciler's cache). A target a
move fills (a csi-clone or a restore in another namespace) is first created as a placeholder
claim (``cdi.render.clone.placeholder_target``, in ``move.MoveSteps._move``) for the consumer
to be scheduled with; once the scheduler has picked the node, ``_placeholder_step`` plans the
clone again with the temporary claim on that node, and the moved volume binds the placeholder.
A DataVolume asking for immediate binding (CDI's ``storage.bind.immediate.requested``) is
pinned to its source's node instead (``_placed``): a local volume clones only beside its source.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.constants import ANN_IMMEDIATE_BINDING, ANN_SELECTED_NODE, Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours import JSON, Claim
from cdi.controller.flavours.clone.common import CloneSteps, _class_of, _step
from cdi.controller.status import View
from cdi.kube.client import PVS
from cdi.kube.workqueue import Result
from cdi.render import clone as plan


class Placement(CloneSteps):
    """The steps of a target on WaitForFirstConsumer storage."""

    async def _waits_for_consumer(self, claim: Mapping[str, Any]) -> bool:
        """``claim`` is on WaitForFirstConsumer storage and no node has been picked for it.
        The class comes from the reconciler's cache (a class's binding mode never changes),
        read from the API server only when the cache has not got it."""
        if plan.selected_node(claim) is not None:
            return False
        name = _class_of(claim)
        cls = self.deps.storage_class(name) if name else None
        if cls is None:
            cls = (await self._classes({name})).get(name) or {}
        return cls.get("volumeBindingMode") == "WaitForFirstConsumer"

    async def _placed(self, dv: DataVolume, desired: JSON, src: Mapping[str, Any] | None) -> JSON:
        """``desired`` pinned to its source's node when its storage waits for a consumer but
        the DataVolume asks for immediate binding (CDI's ``storage.bind.immediate.requested``):
        a local volume clones only beside its source. A source whose node is not known (not
        local storage) leaves the clone waiting for a consumer."""
        if ANN_IMMEDIATE_BINDING not in dv.annotations or src is None:
            return desired
        if not await self._waits_for_consumer(desired):
            return desired
        node = plan.selected_node(src)
        volume = (src.get("spec") or {}).get("volumeName")
        if node is None and volume:
            pv = await self.kube.get_or_none(PVS, str(volume))
            node = plan.node_of_volume(pv) if pv else None
        return plan.on_node(desired, node) if node else desired

    async def _placeholder_step(self, claim: Claim, view: View) -> tuple[View, Result]:
        """A placeholder target: PendingPopulation until the scheduler picks its consumer's
        node, then the clone's next step, planned again from the DataVolume (source, rights,
        strategy: nothing is taken from the claim but its size, class, modes and node), with
        the temporary claim on that node. The moved volume binds the placeholder itself."""
        node = plan.selected_node(claim.pvc)
        if node is None:
            return _step(view, Phase.PENDING_POPULATION), Result(requeue_after=2.0)
        meta = claim.pvc.get("metadata") or {}
        desired = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "annotations": {ANN_SELECTED_NODE: node},
            },
            "spec": {
                k: v
                for k, v in (claim.pvc.get("spec") or {}).items()
                if k not in ("dataSource", "dataSourceRef", "volumeName")
            },
        }
        _, seen, result = await self.before_claim(claim.dv, claim.obj, desired, view)
        return seen, result
