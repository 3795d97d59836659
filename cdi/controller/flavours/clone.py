"""The clone flavour: a DataVolume filled from a PVC or a VolumeSnapshot (``source.pvc``,
``source.snapshot``, or ``sourceRef`` to a DataSource naming either), in its namespace or another.

A clone decides its target claim from the source (size, strategy, ``dataSource`` or a moved
volume), so it works mostly before the claim exists, in ``before_claim``, which the reconciler
calls instead of creating the rendered claim; each call takes one step and says what it saw:

1. resolve the source (through the DataSource and one it references); none yet: Bound False
   ``CloneWithoutSource`` "The source pvc|snapshot <x> doesn't exist" (then proceed when it
   appears; a cluster without the snapshot API answers 404, which is the same "doesn't exist");
2. authorize (``clone_auth``): a cross-namespace clone needs a requester record the webhook
   signed and, now, the rights CDI asks for in the source namespace. Nothing of the source is
   read before this;
3. wait until the source is populated (its DataVolume Succeeded; a snapshot ``readyToUse``)
   and no running pod writes a source claim (event ``CloneSourceInUse``, phase CloneScheduled);
4. size: ``storage`` without a size takes the source's (a snapshot's ``restoreSize``); a
   smaller target is ``ErrIncompatiblePVC`` with CDI's message; content types must match;
5. strategy (``cdi.render.clone.plan_strategy``): the target profile's (none: ``snapshot``), or
   ``copy`` with CDI's fallback reason (annotation ``cloneFallbackReason`` and an event);
   ``snapshot`` needs a VolumeSnapshotClass for the provisioner (``clone_snapshot``, event
   ``VolumeSnapshotClassSelected``), else ``NoVolumeSnapshotClass``;
6. ``csi-clone``: same namespace, the claim is created with ``dataSource`` = the source;
   across namespaces, ``clone_transfer.VolumeMove`` clones in the source namespace and moves
   the volume, then the claim is created bound to it (phases CSICloneInProgress,
   NamespaceTransferInProgress). ``snapshot`` (smart clone): ``tmp-snapshot-<dv uid>`` of the
   source (SnapshotForSmartCloneInProgress), then a claim restored from it
   (CloneFromSnapshotSourceInProgress): the target itself in the same namespace, else a
   temporary claim whose volume moves. A snapshot source is restored the same way; when its
   driver, volume mode or size rule out a restore, it is restored as CDI's
   ``tmp-source-pvc-<dv uid>`` on a class of its driver and copied from (host-assisted, with
   CDI's fallback reason), the restored claim deleted once the copy is recorded.
   ``copy`` (host-assisted): the claim is created as rendered (``cloneType: copy``) and filled
   by ``clone_copy.HostAssistedCopy`` (an upload server on it, a source pod beside the
   source), which works across classes, volume modes and sizes.

``sync`` (``fills_unbound``: called while the claim is still Pending) takes a copy's next step,
or waits for the bind, ends a move, grows a restored claim to its size and deletes the
temporary snapshot, and records "Clone Complete" on the PVC: CloneSucceeded, Succeeded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.cloneauth import CloneSource, clone_source
from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_IMMEDIATE_BINDING,
    ANN_SELECTED_NODE,
    CDICONFIG_NAME,
    ContentType,
    Phase,
)
from cdi.api.types import DataVolume
from cdi.controller.flavours import JSON, Claim, FlavourDeps, PhaseEvent
from cdi.controller.flavours.clone_auth import REASON_UNAUTHORIZED, CloneAuthorizer
from cdi.controller.flavours.clone_copy import CopySettings, HostAssistedCopy
from cdi.controller.flavours.clone_snapshot import SnapshotClone, SnapshotRefused
from cdi.controller.flavours.clone_transfer import PERSISTENT_VOLUMES, MoveRefused, VolumeMove
from cdi.controller.flavours.upload import UploadSettings
from cdi.controller.record import OUTCOME_SUCCEEDED, ImportRecord
from cdi.controller.status import ClaimProblem, FlavourPhases, View
from cdi.kube.client import CDI_CONFIGS, DATA_SOURCES, PODS, PVCS, STORAGE_CLASSES, STORAGE_PROFILES
from cdi.kube.events import NORMAL, WARNING
from cdi.kube.workqueue import Result
from cdi.render import clone as plan
from cdi.render.clone import (
    ANN_CLONE_REQUEST,
    ANN_CLONE_TYPE,
    COPY,
    CSI_CLONE,
    REASON_INCOMPATIBLE_PVC,
    SNAPSHOT,
)
from cdi.render.clone_snapshot import (
    REASON_CLASS_SELECTED,
    as_source_claim,
    plan_snapshot_source,
    ready,
    restore_plan,
    snapshot_error,
    temporary_source_name,
)

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
WITHOUT_SOURCE = "CloneWithoutSource"
SOURCE_IN_USE = "CloneSourceInUse"
UNAVAILABLE = "CloneStrategyUnavailable"
CLONE_COMPLETE = ImportRecord(
    outcome=OUTCOME_SUCCEEDED, reason="Completed", message="Clone Complete"
)
POLL = 1.0


def _step(view: View, phase: Phase) -> View:
    return dataclasses.replace(view, step=phase, pvc_phase=view.pvc_phase or "Pending")


def _problem(view: View, reason: str, message: str) -> View:
    return dataclasses.replace(view, problem=ClaimProblem(reason, message))


def writers_of(pods: list[Mapping[str, Any]], claim: str) -> list[str]:
    """Names of the pods not yet finished that mount ``claim`` writable (CDI's in-use rule)."""
    out = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for vol in (pod.get("spec") or {}).get("volumes") or []:
            ref = vol.get("persistentVolumeClaim") or {}
            if ref.get("claimName") == claim and not ref.get("readOnly"):
                out.append(str(pod["metadata"]["name"]))
    return out


def populated(pvc: Mapping[str, Any]) -> bool:
    """Bound, and (when a DataVolume made it) filled: its record says Succeeded."""
    if (pvc.get("status") or {}).get("phase") != "Bound":
        return False
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    made_for_dv = "cdi.kubevirt.io/createdForDataVolume" in ann
    return not made_for_dv or ImportRecord.from_pvc(pvc).outcome == OUTCOME_SUCCEEDED


def content_problem(dv: DataVolume, source: Mapping[str, Any]) -> str | None:
    ann = (source.get("metadata") or {}).get("annotations") or {}
    src = ContentType.ARCHIVE if ann.get(ANN_CONTENT_TYPE) == ContentType.ARCHIVE else "kubevirt"
    tgt = dv.spec.effective_content_type
    if str(src) == str(tgt):
        return None
    return f"Source contentType ({src}) and target contentType ({tgt}) do not match"


class Throttle:
    """Repeat an event about a waiting clone at most once a ``interval`` (the recorder does not
    aggregate, and a clone re-checks its source every 2 s)."""

    def __init__(self, clock: Callable[[], float], interval: float = 60.0) -> None:
        self.clock, self.interval = clock, interval
        self.last: dict[tuple[str, str, str], float] = {}

    def due(self, uid: str, reason: str, message: str) -> bool:
        now = self.clock()
        if len(self.last) > 4096:  # forget everything rather than grow without bound
            self.last.clear()
        key = (uid, reason, message)
        if now - self.last.get(key, -self.interval) < self.interval:
            return False
        self.last[key] = now
        return True


class CloneFlavour:
    phases = CLONE_PHASES
    events = CLONE_EVENTS
    fills_unbound = True

    def __init__(
        self,
        deps: FlavourDeps,
        requester_key: bytes | None,
        upload: UploadSettings | None = None,
        copy: CopySettings | None = None,
    ) -> None:
        self.deps = deps
        self.kube = deps.kube
        self.authorizer = CloneAuthorizer(deps.kube, requester_key, deps.clock)
        self.move = VolumeMove(deps.kube)
        self.snapshots = SnapshotClone(deps.kube)
        self.copy = HostAssistedCopy(deps, upload or UploadSettings(), copy or CopySettings())
        self.throttle = Throttle(deps.clock)

    async def _event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if self.throttle.due(uid, reason, message):
            await self.deps.events.emit(dict(obj), kind, reason, message)

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

    async def _with_source(
        self,
        dv: DataVolume,
        obj: Mapping[str, Any],
        source: CloneSource,
        src: JSON,
        desired: JSON,
        view: View,
    ) -> tuple[JSON | None, View, Result]:
        wait = Result(requeue_after=2.0)
        if not populated(src):
            return None, _step(view, Phase.CLONE_SCHEDULED), wait
        overhead = await self._overhead(desired) if plan.needs_overhead(src, desired) else 0.0
        desired = plan.fill_size(desired, src, overhead)
        problem = content_problem(dv, src) or plan.size_problem(src, desired)
        if problem is not None:
            await self._event(obj, WARNING, REASON_INCOMPATIBLE_PVC, problem)
            return None, _problem(view, REASON_INCOMPATIBLE_PVC, problem), Result(30.0)
        pods = (await self.kube.list(PODS, source.namespace)).get("items") or []
        writers = writers_of(pods, source.name)
        if writers:
            msg = f"pod {', '.join(writers)} using PersistentVolumeClaim {source.name}"
            await self._event(obj, NORMAL, SOURCE_IN_USE, msg)
            return None, _step(view, Phase.CLONE_SCHEDULED), wait
        chosen, snapshot_class = await self._plan(obj, src, desired)
        desired = plan.annotate(desired, chosen, source.namespace, source.name)
        desired = await self._placed(dv, desired, src)
        if chosen.fallback is not None:
            fallback = chosen.fallback
            await self._event(obj, WARNING, fallback.reason, fallback.message)
        if chosen.strategy == COPY:
            return desired, _step(view, Phase.CLONE_SCHEDULED), wait
        if chosen.strategy == SNAPSHOT and snapshot_class:
            return await self._smart_clone(dv, source, desired, snapshot_class, view)
        if chosen.strategy != CSI_CLONE:
            msg = f"clone strategy {chosen.strategy} is not available in this build"
            return None, _problem(view, UNAVAILABLE, msg), Result(requeue_after=60.0)
        if source.namespace == dv.namespace:
            waiting = await self._waits_for_consumer(desired)
            phase = Phase.PENDING_POPULATION if waiting else Phase.CSI_CLONE_IN_PROGRESS
            return plan.csi_target(desired, source.name), _step(view, phase), wait
        key = f"{dv.namespace}/{dv.name}"
        tmp = plan.temporary_claim(desired, dv.uid, source.namespace, source.name, key)
        return await self._move(dv, tmp, desired, view, Phase.CSI_CLONE_IN_PROGRESS)

    async def _smart_clone(
        self, dv: DataVolume, source: CloneSource, desired: JSON, snapshot_class: str, view: View
    ) -> tuple[JSON | None, View, Result]:
        """CDI's smart clone: a snapshot of the source, then a claim restored from it."""
        key = f"{dv.namespace}/{dv.name}"
        try:
            snap = await self.snapshots.snapshot_step(dv.uid, source, snapshot_class, key)
        except SnapshotRefused as exc:
            return None, _problem(view, UNAVAILABLE, str(exc)), Result(requeue_after=30.0)
        if snap is None:
            return None, _step(view, Phase.SNAPSHOT_FOR_SMART_CLONE_IN_PROGRESS), Result(POLL)
        return await self._restore(dv, snap, desired, view)

    async def _restore(
        self, dv: DataVolume, snap: JSON, desired: JSON, view: View
    ) -> tuple[JSON | None, View, Result]:
        """The target restored from a ready snapshot: directly in the snapshot's namespace,
        else through a temporary claim there whose volume moves to the target."""
        key = f"{dv.namespace}/{dv.name}"
        target, tmp = restore_plan(desired, snap, dv.namespace, dv.uid, key)
        if tmp is None:
            waiting = await self._waits_for_consumer(target)
            phase = (
                Phase.PENDING_POPULATION
                if waiting
                else Phase.CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS
            )
            return target, _step(view, phase), Result(requeue_after=POLL)
        return await self._move(dv, tmp, target, view, Phase.CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS)

    async def _move(
        self, dv: DataVolume, tmp: JSON, target: JSON, view: View, cloning: Phase
    ) -> tuple[JSON | None, View, Result]:
        """Fill ``tmp`` in the source namespace, move its volume; then the target binds it.
        On WaitForFirstConsumer storage with no node yet, the target is first created as a
        placeholder (``plan.placeholder_target``) for the consumer to be scheduled with; its
        ``sync`` comes back here once the scheduler has picked the node."""
        if await self._waits_for_consumer(target):
            placeholder = plan.placeholder_target(target, dv.name)
            return placeholder, _step(view, Phase.PENDING_POPULATION), Result(requeue_after=2.0)
        try:
            state = await self.move.step(dv.uid, tmp, dv.namespace, dv.name)
        except MoveRefused as exc:
            return None, _problem(view, UNAVAILABLE, str(exc)), Result(requeue_after=30.0)
        if state.pv is None:
            held = await self.move.held_volume(dv.uid)
            phase = Phase.NAMESPACE_TRANSFER_IN_PROGRESS if held else cloning
            return None, _step(view, phase), Result(requeue_after=POLL)
        moved = plan.moved_target(target, state.pv)
        return moved, _step(view, Phase.NAMESPACE_TRANSFER_IN_PROGRESS), Result(POLL)

    async def _from_snapshot(
        self, dv: DataVolume, obj: Mapping[str, Any], source: CloneSource, desired: JSON,
        view: View,
    ) -> tuple[JSON | None, View, Result]:  # fmt: skip
        """A DataVolume cloned from an existing VolumeSnapshot (its own, or a DataSource's)."""
        snap = await self.snapshots.source_snapshot(source)
        if snap is None:
            msg = f"The source snapshot {source.name} doesn't exist"
            return None, _problem(view, WITHOUT_SOURCE, msg), Result(requeue_after=5.0)
        if not ready(snap):
            detail = snapshot_error(snap)
            view = _step(view, Phase.CLONE_SCHEDULED)
            if detail:
                view = _problem(view, "SnapshotNotReady", detail)
            return None, view, Result(requeue_after=2.0)
        mode = await self.snapshots.source_mode(snap)
        src = as_source_claim(snap, mode or plan.volume_mode(desired))
        desired = plan.fill_size(desired, src)
        problem = content_problem(dv, src) or plan.size_problem(src, desired)
        if problem is not None:
            await self._event(obj, WARNING, REASON_INCOMPATIBLE_PVC, problem)
            return None, _problem(view, REASON_INCOMPATIBLE_PVC, problem), Result(30.0)
        classes = await self._classes({_class_of(desired)})
        driver = await self.snapshots.driver_of(snap)
        chosen = plan_snapshot_source(driver, mode, snap, desired, classes)
        desired = plan.annotate(desired, chosen, source.namespace, source.name)
        if chosen.fallback is None:
            desired = await self._placed(dv, desired, await self._restored_claim(snap))
            return await self._restore(dv, snap, desired, view)
        await self._event(obj, WARNING, chosen.fallback.reason, chosen.fallback.message)
        return await self._copy_from_restore(dv, snap, desired, (mode, driver), view)

    async def _copy_from_restore(
        self, dv: DataVolume, snap: JSON, desired: JSON, taken: tuple[str | None, str], view: View
    ) -> tuple[JSON | None, View, Result]:
        """CDI's host-assisted fallback for a snapshot source: restore it where it can be
        restored (``tmp-source-pvc-<dv uid>``), then copy from that claim. ``taken``: the
        snapshotted volume's mode (None: unknown) and the snapshot's driver."""
        key = f"{dv.namespace}/{dv.name}"
        mode, driver = taken
        try:
            tmp = await self.snapshots.temporary_source_step(
                dv.uid, snap, desired, mode, driver, key
            )
        except SnapshotRefused as exc:
            return None, _problem(view, UNAVAILABLE, str(exc)), Result(requeue_after=60.0)
        if tmp is None:
            return None, _step(view, Phase.CLONE_SCHEDULED), Result(requeue_after=2.0)
        tmp_meta = tmp["metadata"]  # host-assisted copy from the restored claim
        desired["metadata"]["annotations"][ANN_CLONE_REQUEST] = (
            f"{tmp_meta['namespace']}/{tmp_meta['name']}"
        )
        return desired, _step(view, Phase.CLONE_SCHEDULED), Result(requeue_after=2.0)

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
            pv = await self.kube.get_or_none(PERSISTENT_VOLUMES, str(volume))
            node = plan.node_of_volume(pv) if pv else None
        return plan.on_node(desired, node) if node else desired

    async def _restored_claim(self, snap: Mapping[str, Any]) -> JSON | None:
        """The claim a snapshot was taken of, while it exists (its node pins the restore)."""
        spec = snap.get("spec") or {}
        name = (spec.get("source") or {}).get("persistentVolumeClaimName")
        ns = (snap.get("metadata") or {}).get("namespace")
        return await self.kube.get_or_none(PVCS, str(name), str(ns)) if name and ns else None

    async def _resolve(self, dv: DataVolume) -> CloneSource | None:
        found: dict[tuple[str, str], JSON | None] = {}
        ref = dv.spec.source_ref
        if ref is not None:
            ns = ref.namespace or dv.namespace
            outer = await self.kube.get_or_none(DATA_SOURCES, ref.name, ns)
            found[(ns, ref.name)] = outer
            inner = (((outer or {}).get("spec") or {}).get("source") or {}).get("dataSource")
            if inner and inner.get("name"):
                name = str(inner["name"])
                found[(ns, name)] = await self.kube.get_or_none(DATA_SOURCES, name, ns)
        return clone_source(dv.spec, dv.namespace, lambda ns, name: found.get((ns, name)))

    async def _overhead(self, desired: JSON) -> float:
        """The filesystem overhead CDIConfig sets for the target's class."""
        raw = await self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        try:
            config = CDIConfig.from_dict(raw) if raw else CDIConfig()
        except SchemaError:
            config = CDIConfig()
        return float(
            config.filesystem_overhead((desired.get("spec") or {}).get("storageClassName"))
        )

    async def _classes(self, names: set[str]) -> dict[str, JSON]:
        return {n: c for n in names if n and (c := await self.kube.get_or_none(STORAGE_CLASSES, n))}

    async def _plan(
        self, obj: Mapping[str, Any], src: Mapping[str, Any], desired: JSON
    ) -> tuple[plan.StrategyPlan, str | None]:
        """The strategy, and for ``snapshot`` the VolumeSnapshotClass to use."""
        class_name = _class_of(desired)
        classes = await self._classes({class_name, _class_of(src)})
        profile = await self.kube.get_or_none(STORAGE_PROFILES, class_name) if class_name else None
        status = (profile or {}).get("status") or {}
        wanted = status.get("cloneStrategy")
        choice = None
        if (wanted or SNAPSHOT) == SNAPSHOT:
            provisioners = {str((classes.get(n) or {}).get("provisioner") or "") for n in
                            (class_name, _class_of(src))}  # fmt: skip
            driver = provisioners.pop() if len(provisioners) == 1 else ""
            named = status.get("snapshotClass") or ((profile or {}).get("spec") or {}).get(
                "snapshotClass"
            )
            choice = await self.snapshots.choose_class(driver, named)
        chosen = plan.plan_strategy(wanted, src, desired, classes, choice.name if choice else None)
        if choice is not None and chosen.strategy == SNAPSHOT:
            await self._event(obj, NORMAL, REASON_CLASS_SELECTED, choice.message)
        return chosen, choice.name if choice else None

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

    async def _copy_source_denial(self, claim: Claim, copying: tuple[str, str]) -> str | None:
        """Why this DataVolume may not copy from the claim the target claim names, or None.

        The name is read from the claim's ``k8s.io/CloneRequest``, which the claim's namespace
        may write (or set before the claim is adopted), so it is authorized again like any
        source: another namespace needs the webhook-signed requester's rights there now. The
        claim restored from a snapshot source (``tmp-source-pvc-<dv uid>``) stands for that
        snapshot, and is authorized as the DataVolume's own source."""
        ns, name = copying
        source = CloneSource(ns, name)
        if name == temporary_source_name(claim.dv.uid):
            resolved = await self._resolve(claim.dv)
            if resolved is None or not resolved.snapshot or resolved.namespace != ns:
                return f"the clone source {ns}/{name} is not this DataVolume's"
            source = resolved
        return await self.authorizer.denial(claim.obj, source)

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


def _class_of(claim: Mapping[str, Any]) -> str:
    return str((claim.get("spec") or {}).get("storageClassName") or "")


def _copy_source(pvc: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, name) of a host-assisted clone's source, from the target claim."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    if ann.get(ANN_CLONE_TYPE) != COPY:
        return None
    ns, _, name = str(ann.get(ANN_CLONE_REQUEST) or "").partition("/")
    return (ns, name) if ns and name else None
