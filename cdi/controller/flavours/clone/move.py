"""Moving a cloned volume from the source namespace to the target claim, crash-safe.

A CSI driver clones only within a namespace, so a cross-namespace clone is made as a temporary
claim ``tmp-pvc-<dv uid>`` in the source namespace, and its PersistentVolume then changes hands
(CDI's namespace transfer, reference §4.2/§4.6). Each ``VolumeMove.step`` reads the cluster and
takes the next step; every step is idempotent and the PV's label says how far the move got, so
a controller killed at any point finishes the move on restart and never loses the volume:

1. create the temporary claim (``dataSource`` = the source PVC); wait until it is bound;
2. hold the volume: reclaim policy ``Retain`` (the original kept in an annotation) and the
   label ``cdi.kubevirt.io/cloneFor=<dv uid>`` in one patch. From here the PV is found by its
   label (only cluster admins and this controller may write PVs, so the label is trustworthy);
3. delete the temporary claim; the volume is Released, and kept, as it is held;
4. point ``spec.claimRef`` at the target namespace/name without a UID (a pre-bound volume);
5. the target claim is created with ``spec.volumeName`` = the PV, and the PV binder binds them;
6. once the target is Bound to it, ``finish`` restores the reclaim policy and drops the label.

``abandon`` undoes a move whose DataVolume was deleted (called when its key is gone): the
temporary claim is deleted and a held volume gets its reclaim policy back, and, if it waited
for a target that will never come, a claim reference that no claim has, so it is Released and
reclaimed as its class says. A DataVolume deleted while the controller was down is not seen;
its leftovers carry the label ``cdi.kubevirt.io/cloneFor``.

Nothing here decides whether the clone is allowed: the flavour authorizes before step 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import GROUP, Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours.clone.common import POLL, UNAVAILABLE, _problem, _step
from cdi.controller.flavours.clone.wffc import Placement
from cdi.controller.status import View
from cdi.kube.client import DATAVOLUMES, PVCS, AsyncKube, Resource
from cdi.kube.workqueue import Result
from cdi.render import clone as plan
from cdi.render.clone import ANN_MOVE_TARGET, LABEL_CLONE_FOR

JSON = dict[str, Any]
PERSISTENT_VOLUMES = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
ANN_RECLAIM_POLICY = f"{GROUP}/clone.originalReclaimPolicy"
RETAIN = "Retain"


class MoveRefused(Exception):
    """The temporary claim's name is taken by a claim this controller did not make."""


@dataclass(frozen=True)
class MoveState:
    """How far the move got: ``pv`` is the volume's name once it waits for the target."""

    pv: str | None = None
    detail: str = ""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _made_for(tmp: Mapping[str, Any], wanted: Mapping[str, Any], dv_uid: str) -> bool:
    """Our temporary claim: labelled with the DataVolume's UID and cloned from the source."""
    labelled = (_meta(tmp).get("labels") or {}).get(LABEL_CLONE_FOR) == dv_uid
    source = ((tmp.get("spec") or {}).get("dataSource") or {}).get("name")
    return labelled and source == wanted["spec"]["dataSource"]["name"]


class VolumeMove:
    def __init__(self, kube: AsyncKube) -> None:
        self.kube = kube

    async def held_volume(self, dv_uid: str) -> JSON | None:
        """The PV held for this DataVolume's clone (step 2 done), if any."""
        found = await self.kube.list(
            PERSISTENT_VOLUMES, label_selector=f"{LABEL_CLONE_FOR}={dv_uid}"
        )
        items = found.get("items") or []
        return dict(items[0]) if items else None

    async def step(self, dv_uid: str, temporary: JSON, target_ns: str, target: str) -> MoveState:
        """One step of 1-4 above; ``MoveState.pv`` set when the target claim may be created."""
        src_ns, tmp_name = temporary["metadata"]["namespace"], temporary["metadata"]["name"]
        tmp = await self.kube.get_or_none(PVCS, tmp_name, src_ns)
        if tmp is not None and not _made_for(tmp, temporary, dv_uid):
            raise MoveRefused(f"claim {src_ns}/{tmp_name} exists and was not made for this clone")
        pv = await self.held_volume(dv_uid)
        if pv is None:
            return await self._clone_and_hold(dv_uid, temporary, tmp, target_ns, target)
        if tmp is not None:
            if (tmp.get("spec") or {}).get("volumeName") == _meta(pv).get("name"):
                await self._delete_claim(tmp)
            return MoveState(detail="releasing the temporary claim")
        await self._point(pv, target_ns, target)
        return MoveState(pv=str(_meta(pv)["name"]))

    async def _clone_and_hold(
        self, dv_uid: str, temporary: JSON, tmp: JSON | None, target_ns: str, target: str
    ) -> MoveState:
        if tmp is None:
            await self.kube.create_if_absent(PVCS, temporary, temporary["metadata"]["namespace"])
            return MoveState(detail="cloning in the source namespace")
        volume = (tmp.get("spec") or {}).get("volumeName")
        if (tmp.get("status") or {}).get("phase") != "Bound" or not volume:
            return MoveState(detail="cloning in the source namespace")
        pv = await self.kube.get(PERSISTENT_VOLUMES, str(volume))
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if ref.get("uid") != _meta(tmp).get("uid"):
            return MoveState(detail="waiting for the temporary claim's volume")
        await self._hold(pv, dv_uid, f"{target_ns}/{target}")
        return MoveState(detail="volume held")

    async def _hold(self, pv: JSON, dv_uid: str, target: str) -> None:
        meta, spec = _meta(pv), pv.get("spec") or {}
        original = (meta.get("annotations") or {}).get(ANN_RECLAIM_POLICY) or spec.get(
            "persistentVolumeReclaimPolicy", "Delete"
        )
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "labels": {LABEL_CLONE_FOR: dv_uid},
                "annotations": {ANN_RECLAIM_POLICY: original, ANN_MOVE_TARGET: target},
            },
            "spec": {"persistentVolumeReclaimPolicy": RETAIN},
        }
        await self.kube.patch(PERSISTENT_VOLUMES, str(meta["name"]), patch)

    async def _delete_claim(self, tmp: JSON) -> None:
        meta = _meta(tmp)
        if meta.get("deletionTimestamp"):
            return
        await self.kube.delete_if_present(
            PVCS, str(meta["name"]), str(meta["namespace"]), uid=str(meta.get("uid"))
        )

    async def _point(self, pv: JSON, target_ns: str, target: str) -> None:
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if (ref.get("namespace"), ref.get("name")) == (target_ns, target):
            return
        claim_ref = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": target_ns,
            "name": target,
            "uid": None,
            "resourceVersion": None,
        }
        meta = _meta(pv)
        patch = {
            "metadata": {"resourceVersion": meta.get("resourceVersion")},
            "spec": {"claimRef": claim_ref},
        }
        await self.kube.patch(PERSISTENT_VOLUMES, str(meta["name"]), patch)

    async def finish(self, dv_uid: str, claim: Mapping[str, Any]) -> bool:
        """Step 6 once ``claim`` is Bound to the held volume; True when nothing is held."""
        pv = await self.held_volume(dv_uid)
        if pv is None:
            return True
        meta = _meta(pv)
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if ref.get("uid") != _meta(claim).get("uid"):
            return False
        original = (meta.get("annotations") or {}).get(ANN_RECLAIM_POLICY) or "Delete"
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "labels": {LABEL_CLONE_FOR: None},
                "annotations": {ANN_RECLAIM_POLICY: None, ANN_MOVE_TARGET: None},
            },
            "spec": {"persistentVolumeReclaimPolicy": original},
        }
        await self.kube.patch(PERSISTENT_VOLUMES, str(meta["name"]), patch)
        return True

    async def abandon(self, target_ns: str, target: str) -> int:
        """Undo the moves toward ``target_ns/target`` whose DataVolume is gone; how many."""
        key = f"{target_ns}/{target}"
        alive = await self.kube.get_or_none(DATAVOLUMES, target, target_ns)
        alive_uid = (_meta(alive).get("uid") if alive else None) or ""

        def orphans(found: JSON) -> list[JSON]:
            """Moves toward ``key`` whose DataVolume (by UID) no longer exists."""
            return [
                obj
                for obj in found.get("items") or []
                if (_meta(obj).get("annotations") or {}).get(ANN_MOVE_TARGET) == key
                and (_meta(obj).get("labels") or {}).get(LABEL_CLONE_FOR) != alive_uid
            ]

        volumes = orphans(await self.kube.list(PERSISTENT_VOLUMES, label_selector=LABEL_CLONE_FOR))
        claims = orphans(await self.kube.list(PVCS, label_selector=LABEL_CLONE_FOR))
        for pv in volumes:
            await self._release(pv)
        for tmp in claims:
            await self._delete_claim(tmp)
        return len(volumes) + len(claims)

    async def _release(self, pv: JSON) -> None:
        meta, spec = _meta(pv), pv.get("spec") or {}
        original = (meta.get("annotations") or {}).get(ANN_RECLAIM_POLICY) or "Delete"
        patch: JSON = {
            "metadata": {
                "labels": {LABEL_CLONE_FOR: None},
                "annotations": {ANN_RECLAIM_POLICY: None, ANN_MOVE_TARGET: None},
            },
            "spec": {"persistentVolumeReclaimPolicy": original},
        }
        if not (spec.get("claimRef") or {}).get("uid"):  # pre-bound to a claim never made
            patch["spec"]["claimRef"] = {"uid": f"abandoned-{meta.get('uid')}"}
        await self.kube.patch(PERSISTENT_VOLUMES, str(meta["name"]), patch)


class MoveSteps(Placement):
    """The flavour's side of a move: a placeholder first on WaitForFirstConsumer storage."""

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
