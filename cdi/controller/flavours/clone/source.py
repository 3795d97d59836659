"""A clone's source: where it is, whether it may be read, and the plan for a PVC source.

- ``_resolve``: the DataVolume's source, through ``sourceRef`` (a DataSource, and one it
  references; ``cdi.api.cloneauth.clone_source``);
- authorization is ``auth.CloneAuthorizer``, asked before anything of the source is read
  (``CloneFlavour.before_claim``) and again for the copy source a target claim names
  (``_copy_source_denial``);
- ``_with_source``: a PVC source populated (``populated``) and not written by a running pod
  (``writers_of``), sized (``_overhead``), its content type and size checked, then the strategy
  (``_plan``: the CDI resource's ``cloneStrategyOverride``, else the profile's, or ``copy``
  with CDI's fallback reason; a VolumeSnapshotClass for ``snapshot``) and its first step:
  csi-clone here, a smart clone in ``snapshot``, a move in ``move``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.cloneauth import CloneSource, clone_source
from cdi.api.constants import Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours import JSON, Claim
from cdi.controller.flavours.clone.common import (
    UNAVAILABLE,
    _class_of,
    _problem,
    _step,
    content_problem,
)
from cdi.controller.flavours.clone.snapshot import SnapshotSteps
from cdi.controller.record import OUTCOME_SUCCEEDED, ClaimRecord
from cdi.controller.status import View
from cdi.kube.client import DATA_SOURCES, PODS, STORAGE_PROFILES
from cdi.kube.events import NORMAL, WARNING
from cdi.kube.workqueue import Result
from cdi.render import clone as plan
from cdi.render.clone import COPY, CSI_CLONE, REASON_INCOMPATIBLE_PVC, SNAPSHOT
from cdi.render.clone_snapshot import REASON_CLASS_SELECTED, temporary_source_name

SOURCE_IN_USE = "CloneSourceInUse"


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
    return not made_for_dv or ClaimRecord.from_pvc(pvc).outcome == OUTCOME_SUCCEEDED


class SourceSteps(SnapshotSteps):
    """Resolve the source, authorize a copy source, plan a PVC source's clone."""

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
        unsized = plan.requested(desired) is None
        overhead = await self._overhead(desired) if plan.needs_overhead(src, desired) else 0.0
        desired = plan.fill_size(desired, src, overhead)
        chosen, snapshot_class = await self._plan(obj, src, desired)
        if unsized and chosen.strategy == COPY and plan.detects_size(src):
            sized = await self._sized_from_content(dv, obj, src, desired)
            if sized is None:  # the size-detection pod is measuring the image
                return None, _step(view, Phase.CLONE_SCHEDULED), wait
            desired = sized
        sizes = await self._sizes(dv, src, desired)
        problem = content_problem(dv, src)
        if problem is None and not plan.permissive(obj, desired):
            problem = plan.size_problem(src, desired, sizes)
        if problem is not None:
            await self._event(obj, WARNING, REASON_INCOMPATIBLE_PVC, problem)
            return None, _problem(view, REASON_INCOMPATIBLE_PVC, problem), Result(30.0)
        pods = (await self.kube.list(PODS, source.namespace)).get("items") or []
        writers = writers_of(pods, source.name)
        if writers:
            msg = f"pod {', '.join(writers)} using PersistentVolumeClaim {source.name}"
            await self._event(obj, NORMAL, SOURCE_IN_USE, msg)
            return None, _step(view, Phase.CLONE_SCHEDULED), wait
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

    async def _sized_from_content(
        self, dv: DataVolume, obj: Mapping[str, Any], src: Mapping[str, Any], desired: JSON
    ) -> JSON | None:
        """A host-assisted clone without a size, of a filesystem source holding an image: the
        target asks for the image's size plus its own class's overhead (CDI's size detection,
        ``cdi.render.clone``); None while the size-detection pod measures it
        (``cdi.controller.flavours.clone.sizing``)."""
        if plan.cached_virtual_size(src) is None:
            measured = await self.sizer.measure(dv, obj, src, await self._cdi_config())
            if measured is None:
                return None
            src = measured.source
        content = plan.content_size(src, await self._overhead(src))
        if content is None:
            return desired
        fs = plan.volume_mode(desired) == "Filesystem"
        target_overhead = await self._overhead(desired) if fs else 0.0
        return plan.sized_from_content(desired, src, content, target_overhead)

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

    async def _plan(
        self, obj: Mapping[str, Any], src: Mapping[str, Any], desired: JSON
    ) -> tuple[plan.StrategyPlan, str | None]:
        """The strategy, and for ``snapshot`` the VolumeSnapshotClass to use."""
        class_name = _class_of(desired)
        classes = await self._classes({class_name, _class_of(src)})
        profile = await self.kube.get_or_none(STORAGE_PROFILES, class_name) if class_name else None
        status = (profile or {}).get("status") or {}
        # the CDI resource's cloneStrategyOverride beats every profile (CDI's planner)
        wanted = (await self._cdi_config()).clone_strategy_override or status.get("cloneStrategy")
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
