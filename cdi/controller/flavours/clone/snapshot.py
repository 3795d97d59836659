"""The snapshot side of the clone flavour: VolumeSnapshotClasses, the smart clone's temporary
snapshot, the snapshot a DataVolume clones from, and what a restored claim needs once bound.

The flavour's snapshot steps (``SnapshotSteps``: smart clone, restore, a snapshot source and
its host-assisted fallback) decide; ``SnapshotClone`` reads and writes the snapshot API for
them, one level-triggered step per call (pure parts: ``cdi.render.clone_snapshot``):

- ``choose_class``: the VolumeSnapshotClass for a driver (the StorageProfile's
  ``snapshotClass``, the default-annotated one, the first by name). A cluster that serves no
  snapshot API answers 404, which is "no class": the clone falls back to host-assisted copy
  with ``NoVolumeSnapshotClass``, nothing crashes or waits;
- ``snapshot_step`` (smart clone of a PVC): ``tmp-snapshot-<dv uid>`` of the source, in the
  source namespace (phase SnapshotForSmartCloneInProgress) until it is ``readyToUse``; the
  snapshot is labelled ``cloneFor=<dv uid>``, never owned (an owner in another namespace is
  not allowed), so ``settle`` deletes it once the target is bound and ``abandon`` deletes a
  stray one whose DataVolume is gone. A snapshot at that name without our label is refused;
- ``source_snapshot`` / ``source_mode`` / ``driver_of``: the VolumeSnapshot a DataVolume names
  (``source.snapshot``, or a DataSource's ``spec.source.snapshot``), the volume mode of the
  claim it was taken of (when that claim still exists; else unknown, as CDI) and its driver;
- ``temporary_source_step``: when a snapshot source cannot be restored into the target (CDI's
  fallback reasons), CDI's ``tmp-source-pvc-<dv uid>`` restored in the snapshot's namespace on a
  class of its driver, for the host-assisted copy to read; ``remove_temporary_source`` once
  the copy is recorded (a stray one goes with ``VolumeMove.abandon``: same label);
- ``settle``: a bound restored claim grows to its recorded size (CDI's PrepClaim expansion;
  phase ExpansionInProgress), then the temporary snapshot goes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.cloneauth import CloneSource
from cdi.api.constants import Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours import JSON, Claim
from cdi.controller.flavours.clone.common import (
    POLL,
    UNAVAILABLE,
    WITHOUT_SOURCE,
    _class_of,
    _problem,
    _step,
    content_problem,
)
from cdi.controller.flavours.clone.move import MoveSteps
from cdi.controller.status import View
from cdi.kube.client import (
    DATAVOLUMES,
    PVCS,
    STORAGE_CLASSES,
    VOLUME_SNAPSHOT_CLASSES,
    VOLUME_SNAPSHOTS,
    AsyncKube,
)
from cdi.kube.errors import KubeError, NotFound
from cdi.kube.events import WARNING
from cdi.kube.workqueue import Result
from cdi.render import clone as plan
from cdi.render.clone import (
    ANN_CLONE_REQUEST,
    ANN_MOVE_TARGET,
    LABEL_CLONE_FOR,
    REASON_INCOMPATIBLE_PVC,
    requested,
)
from cdi.render.clone_snapshot import (
    SnapshotClassChoice,
    as_source_claim,
    choose_snapshot_class,
    growth,
    made_for,
    plan_snapshot_source,
    ready,
    render_snapshot,
    restore_class,
    restore_plan,
    snapshot_driver,
    snapshot_error,
    temporary_source,
    temporary_source_name,
    tmp_snapshot_name,
)


class SnapshotRefused(Exception):
    """The temporary snapshot's name is taken by a snapshot this controller did not make."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


class SnapshotClone:
    def __init__(self, kube: AsyncKube) -> None:
        self.kube = kube

    # -- classes ---------------------------------------------------------------------------
    async def choose_class(self, driver: str, wanted: str | None) -> SnapshotClassChoice | None:
        """The class for ``driver``'s volumes, or None (none fits, or no snapshot API)."""
        if not driver:
            return None
        try:
            if wanted:
                named = await self.kube.get_or_none(VOLUME_SNAPSHOT_CLASSES, wanted)
                return choose_snapshot_class(driver, [named] if named else [], wanted)
            found = await self.kube.list(VOLUME_SNAPSHOT_CLASSES)
        except NotFound:
            return None  # the snapshot API is not served here
        return choose_snapshot_class(driver, found.get("items") or [])

    async def driver_of(self, snapshot: Mapping[str, Any]) -> str:
        """The driver of the class that took ``snapshot`` ("" when unknown)."""
        name = str((snapshot.get("spec") or {}).get("volumeSnapshotClassName") or "")
        if not name:
            return ""
        return snapshot_driver(await self.kube.get_or_none(VOLUME_SNAPSHOT_CLASSES, name))

    # -- the smart clone's temporary snapshot ----------------------------------------------
    async def snapshot_step(
        self, dv_uid: str, source: CloneSource, snapshot_class: str, target_key: str
    ) -> JSON | None:
        """The ready temporary snapshot of ``source``, or None while it is being made."""
        name = tmp_snapshot_name(dv_uid)
        snap = await self.kube.get_or_none(VOLUME_SNAPSHOTS, name, source.namespace)
        if snap is None:
            body = render_snapshot(
                source.namespace, source.name, dv_uid, snapshot_class, target_key
            )
            # None: made meanwhile, judged next time
            await self.kube.create_if_absent(VOLUME_SNAPSHOTS, body, source.namespace)
            return None
        if not made_for(snap, dv_uid):
            msg = f"snapshot {source.namespace}/{name} exists and was not made for this clone"
            raise SnapshotRefused(msg)
        return snap if ready(snap) else None

    # -- a snapshot source -----------------------------------------------------------------
    async def source_snapshot(self, source: CloneSource) -> JSON | None:
        """The VolumeSnapshot a DataVolume clones from (None: absent, or no snapshot API)."""
        return await self.kube.get_or_none(VOLUME_SNAPSHOTS, source.name, source.namespace)

    async def source_mode(self, snapshot: Mapping[str, Any]) -> str | None:
        """The volume mode of the claim the snapshot was taken of, while that claim exists."""
        claim = ((snapshot.get("spec") or {}).get("source") or {}).get("persistentVolumeClaimName")
        if not claim:
            return None
        pvc = await self.kube.get_or_none(PVCS, str(claim), str(_meta(snapshot).get("namespace")))
        if pvc is None:
            return None
        return str((pvc.get("spec") or {}).get("volumeMode") or "Filesystem")

    async def temporary_source_step(
        self, dv_uid: str, snapshot: JSON, target: JSON, mode: str | None, driver: str, key: str
    ) -> JSON | None:
        """The bound claim restored from ``snapshot`` for a host-assisted copy, or None while
        it is being made."""
        name, ns = temporary_source_name(dv_uid), str(_meta(snapshot).get("namespace"))
        tmp = await self.kube.get_or_none(PVCS, name, ns)
        if tmp is None:
            classes = (await self.kube.list(STORAGE_CLASSES)).get("items") or []
            storage_class = restore_class(driver, classes)
            if storage_class is None:
                raise SnapshotRefused(
                    f"no storage class restores snapshots of driver {driver or '(unknown)'}"
                )
            body = temporary_source(snapshot, storage_class, target, mode, dv_uid, key)
            await self.kube.create_if_absent(PVCS, body, ns)
            return None
        if (_meta(tmp).get("labels") or {}).get(LABEL_CLONE_FOR) != dv_uid:
            raise SnapshotRefused(f"claim {ns}/{name} exists and was not made for this clone")
        return tmp if (tmp.get("status") or {}).get("phase") == "Bound" else None

    async def remove_temporary_source(self, dv_uid: str, namespace: str) -> None:
        tmp = await self.kube.get_or_none(PVCS, temporary_source_name(dv_uid), namespace)
        meta = _meta(tmp or {})
        if tmp is None or (meta.get("labels") or {}).get(LABEL_CLONE_FOR) != dv_uid:
            return
        if meta.get("deletionTimestamp"):
            return
        await self.kube.delete_if_present(PVCS, str(meta["name"]), namespace, uid=str(meta["uid"]))

    # -- after the bind --------------------------------------------------------------------
    async def settle(self, claim: Claim, snapshot_ns: str) -> Phase | None:
        """Grow the bound claim to its recorded size, then delete the temporary snapshot;
        the phase to show while that is under way, None once done."""
        pvc = claim.pvc
        wanted = growth(pvc)
        if wanted is not None:
            if (requested(pvc) or 0) < wanted:
                patch = {"spec": {"resources": {"requests": {"storage": str(wanted)}}}}
                meta = _meta(pvc)
                await self.kube.patch(PVCS, str(meta["name"]), patch, meta.get("namespace"))
            return Phase.EXPANSION_IN_PROGRESS
        await self._delete_temporary(claim.dv.uid, snapshot_ns)
        return None

    async def _delete_temporary(self, dv_uid: str, namespace: str) -> None:
        snap = await self.kube.get_or_none(VOLUME_SNAPSHOTS, tmp_snapshot_name(dv_uid), namespace)
        if snap is not None and made_for(snap, dv_uid):
            await self._delete(snap)

    async def _delete(self, snap: Mapping[str, Any]) -> None:
        meta = _meta(snap)
        if meta.get("deletionTimestamp"):
            return
        await self.kube.delete_if_present(
            VOLUME_SNAPSHOTS, str(meta["name"]), str(meta["namespace"]), uid=str(meta["uid"])
        )

    async def abandon(self, target_ns: str, target: str) -> int:
        """Delete the temporary snapshots for ``target_ns/target`` whose DataVolume is gone."""
        key = f"{target_ns}/{target}"
        alive = await self.kube.get_or_none(DATAVOLUMES, target, target_ns)
        alive_uid = str(_meta(alive).get("uid") or "") if alive else ""
        try:
            found = await self.kube.list(VOLUME_SNAPSHOTS, label_selector=LABEL_CLONE_FOR)
        except KubeError:
            return 0  # no snapshot API: nothing of ours can exist
        strays = [
            snap
            for snap in found.get("items") or []
            if (_meta(snap).get("annotations") or {}).get(ANN_MOVE_TARGET) == key
            and (_meta(snap).get("labels") or {}).get(LABEL_CLONE_FOR) != alive_uid
        ]
        for snap in strays:
            await self._delete(snap)
        return len(strays)


class SnapshotSteps(MoveSteps):
    """The flavour's snapshot steps: smart clone, restore, a snapshot source and its
    host-assisted fallback through a restored temporary claim."""

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
        sizes = await self._sizes(dv, src, desired)
        problem = content_problem(dv, src)
        if problem is None and not plan.permissive(obj, desired):
            problem = plan.size_problem(src, desired, sizes)
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

    async def _restored_claim(self, snap: Mapping[str, Any]) -> JSON | None:
        """The claim a snapshot was taken of, while it exists (its node pins the restore)."""
        spec = snap.get("spec") or {}
        name = (spec.get("source") or {}).get("persistentVolumeClaimName")
        ns = (snap.get("metadata") or {}).get("namespace")
        return await self.kube.get_or_none(PVCS, str(name), str(ns)) if name and ns else None
