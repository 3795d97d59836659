"""``CloneFlavour``: the clone's face to the reconciler (the ``Flavour`` protocol); how a clone
goes is told in the package's docstring (``cdi.controller.flavours.clone``).

``before_claim`` resolves the source (``source``), authorizes it (``auth``) and plans the target
claim from a snapshot (``snapshot``) or a PVC (``source``), one step per call.

``sync`` (``fills_unbound``: called while the claim is still Pending) takes a copy's next step,
or waits for the bind, ends a move, grows a restored claim to its size and deletes the
temporary snapshot, and records "Clone Complete" on the PVC: CloneSucceeded, Succeeded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cdi.api.constants import Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours import JSON, Claim, FlavourDefaults, FlavourDeps, PhaseEvent
from cdi.controller.flavours.clone.auth import REASON_UNAUTHORIZED, CloneAuthorizer
from cdi.controller.flavours.clone.common import POLL, WITHOUT_SOURCE, Throttle, _problem, _step
from cdi.controller.flavours.clone.copy import CopySettings, HostAssistedCopy
from cdi.controller.flavours.clone.move import VolumeMove
from cdi.controller.flavours.clone.sizing import SizeDetection, SizeSettings
from cdi.controller.flavours.clone.snapshot import SnapshotClone
from cdi.controller.flavours.clone.source import SourceSteps
from cdi.controller.flavours.upload import UploadSettings
from cdi.controller.record import OUTCOME_SUCCEEDED, ClaimRecord
from cdi.controller.status import FlavourPhases, View
from cdi.kube.client import PVCS
from cdi.kube.events import NORMAL, WARNING
from cdi.kube.workqueue import Result
from cdi.render import clone as plan
from cdi.render.clone import ANN_CLONE_REQUEST, ANN_CLONE_TYPE, COPY, SNAPSHOT
from cdi.render.clone_snapshot import temporary_source_name

CLONE_PHASES = FlavourPhases(
    scheduled=Phase.CLONE_SCHEDULED,
    in_progress=Phase.CLONE_IN_PROGRESS,
    worker="Clone source",
    activity="Clone",
)
CLONE_EVENTS: Mapping[str, PhaseEvent] = {
    Phase.CLONE_SCHEDULED: PhaseEvent(NORMAL, "CloneScheduled", "Cloning into {claim} scheduled"),
    Phase.CLONE_IN_PROGRESS: PhaseEvent(NORMAL, "CloneInProgress", "Cloning into {claim}"),
    Phase.CSI_CLONE_IN_PROGRESS: PhaseEvent(
        NORMAL, "CSICloneInProgress", "CSI Volume clone in progress (for pvc: {claim})"
    ),
    Phase.NAMESPACE_TRANSFER_IN_PROGRESS: PhaseEvent(
        NORMAL, "NamespaceTransferInProgress", "Moving the cloned volume to {claim}"
    ),
    Phase.SNAPSHOT_FOR_SMART_CLONE_IN_PROGRESS: PhaseEvent(
        NORMAL,
        "SnapshotForSmartCloneInProgress",
        "Creating snapshot for smart-clone is in progress (for pvc: {claim})",
    ),
    Phase.CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS: PhaseEvent(
        NORMAL,
        "CloneFromSnapshotSourceInProgress",
        "Creating PVC from snapshot source is in progress (for pvc: {claim})",
    ),
    Phase.EXPANSION_IN_PROGRESS: PhaseEvent(
        NORMAL, "ExpansionInProgress", "Expanding {claim} to the requested size"
    ),
    Phase.SUCCEEDED: PhaseEvent(NORMAL, "CloneSucceeded", "Successfully cloned into {claim}"),
    Phase.FAILED: PhaseEvent(WARNING, "CloneFailed"),
}
CLONE_COMPLETE = ClaimRecord(
    outcome=OUTCOME_SUCCEEDED, reason="Completed", message="Clone Complete"
)


class CloneFlavour(SourceSteps, FlavourDefaults):
    phases = CLONE_PHASES
    events = CLONE_EVENTS
    fills_unbound = True

    def __init__(
        self,
        deps: FlavourDeps,
        requester_key: bytes | None,
        upload: UploadSettings | None = None,
        copy: CopySettings | None = None,
        sizing: SizeSettings | None = None,
    ) -> None:
        self.deps = deps
        self.kube = deps.kube
        self.authorizer = CloneAuthorizer(deps.kube, requester_key, deps.clock)
        self.move = VolumeMove(deps.kube)
        self.snapshots = SnapshotClone(deps.kube)
        self.copy = HostAssistedCopy(deps, upload or UploadSettings(), copy or CopySettings())
        self.sizer = SizeDetection(deps, sizing or SizeSettings())
        self.throttle = Throttle(deps.clock)

    # -- before the target claim exists ----------------------------------------------------
    async def before_claim(
        self, dv: DataVolume, obj: Mapping[str, Any], desired: JSON, view: View
    ) -> tuple[JSON | None, View, Result]:
        source = await self._resolve(dv)
        if source is None:
            msg = "The source pvc doesn't exist"
            return None, _problem(view, WITHOUT_SOURCE, msg), Result(requeue_after=5.0)
        denial = await self.authorizer.denial(obj, source)
        if denial is not None:
            return None, _problem(view, REASON_UNAUTHORIZED, denial), Result(requeue_after=30.0)
        if source.snapshot:
            return await self._from_snapshot(dv, obj, source, desired, view)
        src = await self.kube.get_or_none(PVCS, source.name, source.namespace)
        if src is None:
            msg = f"The source pvc {source.name} doesn't exist"
            return None, _problem(view, WITHOUT_SOURCE, msg), Result(requeue_after=5.0)
        return await self._with_source(dv, obj, source, src, desired, view)

    # -- once the target claim exists ------------------------------------------------------
    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        pvc = claim.pvc
        copying = _copy_source(pvc)
        if copying is not None:
            denial = await self._copy_source_denial(claim, copying)
            if denial is not None:
                return _problem(view, REASON_UNAUTHORIZED, denial), Result(requeue_after=30.0)
            src = await self.kube.get_or_none(PVCS, copying[1], copying[0])
            if src is None:
                msg = f"The source pvc {copying[1]} doesn't exist"
                return _problem(view, WITHOUT_SOURCE, msg), Result(requeue_after=5.0)
            return await self.copy.step(claim, src, view)
        ann = (pvc.get("metadata") or {}).get("annotations") or {}
        smart = ann.get(ANN_CLONE_TYPE) == SNAPSHOT
        if (pvc.get("status") or {}).get("phase") != "Bound":
            if plan.is_placeholder(pvc, claim.dv.name):
                return await self._placeholder_step(claim, view)
            moving = bool((pvc.get("spec") or {}).get("volumeName"))
            if not moving and await self._waits_for_consumer(pvc):
                return _step(view, Phase.PENDING_POPULATION), Result(requeue_after=2.0)
            phase = (
                Phase.CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS
                if smart
                else Phase.CSI_CLONE_IN_PROGRESS
            )
            phase = Phase.NAMESPACE_TRANSFER_IN_PROGRESS if moving else phase
            return _step(view, phase), Result(requeue_after=POLL)
        source_ns = str(ann.get(ANN_CLONE_REQUEST, "")).partition("/")[0]
        if source_ns != claim.dv.namespace:
            if not await self.move.finish(claim.dv.uid, pvc):
                return _step(view, Phase.NAMESPACE_TRANSFER_IN_PROGRESS), Result(POLL)
        if smart:
            settling = await self.snapshots.settle(claim, source_ns)
            if settling is not None:
                return _step(view, settling), Result(requeue_after=POLL)
        record = dataclasses.replace(CLONE_COMPLETE, failed_attempts=claim.record.failed_attempts)
        if record.differs_from(pvc):
            meta = pvc["metadata"]
            patch = {"metadata": {"annotations": record.annotations()}}
            await self.kube.patch(PVCS, meta["name"], patch, meta.get("namespace"))
        return dataclasses.replace(view, record=record), Result()

    async def forget(self, namespace: str, name: str) -> None:
        """The DataVolume ``namespace/name`` is gone: undo a move it left half-way, remove a
        copy's source pod in another namespace."""
        await self.move.abandon(namespace, name)
        await self.copy.abandon(namespace, name)
        await self.snapshots.abandon(namespace, name)

    async def finish(self, claim: Claim) -> None:
        """A CSI clone leaves no worker behind; a move ends in ``sync`` before the record; a
        copy's pods and Secrets go (again: idempotent)."""
        copying = _copy_source(claim.pvc)
        if copying is not None:
            source = {"metadata": {"namespace": copying[0], "name": copying[1]}}
            await self.copy.cleanup(claim, source)
            if copying[1] == temporary_source_name(claim.dv.uid):
                await self.snapshots.remove_temporary_source(claim.dv.uid, copying[0])


def _copy_source(pvc: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of a host-assisted clone's source, from the target claim."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    if ann.get(ANN_CLONE_TYPE) != COPY:
        return None
    ns, _, name = str(ann.get(ANN_CLONE_REQUEST) or "").partition("/")
    return (ns, name) if ns and name else None
