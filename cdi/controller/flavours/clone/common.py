"""What the clone flavour's step modules share: the views a step returns, the event throttle,
and ``CloneSteps``, the parts of the flavour every step uses.

The flavour is one class (``flavour.CloneFlavour``) built from one mixin per step module, each
on top of the last: ``CloneSteps`` < ``wffc.Placement`` < ``move.MoveSteps`` <
``snapshot.SnapshotSteps`` < ``source.SourceSteps`` < ``CloneFlavour``, so a step calls only
the steps below it (and a placeholder plans again through the flavour's ``before_claim``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import ANN_CONTENT_TYPE, CDICONFIG_NAME, ContentType, Phase
from cdi.api.types import DataVolume
from cdi.controller.flavours import JSON, FlavourDeps
from cdi.controller.status import ClaimProblem, View
from cdi.kube.client import CDI_CONFIGS, STORAGE_CLASSES, AsyncKube
from cdi.kube.workqueue import Result
from cdi.render import clone as plan

if TYPE_CHECKING:  # the flavour's parts, made by CloneFlavour.__init__ (their modules import this)
    from cdi.controller.flavours.clone.auth import CloneAuthorizer
    from cdi.controller.flavours.clone.copy import HostAssistedCopy
    from cdi.controller.flavours.clone.move import VolumeMove
    from cdi.controller.flavours.clone.sizing import SizeDetection
    from cdi.controller.flavours.clone.snapshot import SnapshotClone

WITHOUT_SOURCE = "CloneWithoutSource"
UNAVAILABLE = "CloneStrategyUnavailable"
POLL = 1.0


def _step(view: View, phase: Phase) -> View:
    return dataclasses.replace(view, step=phase, pvc_phase=view.pvc_phase or "Pending")


def _problem(view: View, reason: str, message: str) -> View:
    return dataclasses.replace(view, problem=ClaimProblem(reason, message))


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


class CloneSteps:
    """The parts of ``CloneFlavour`` its step modules use (set in ``CloneFlavour.__init__``)."""

    deps: FlavourDeps
    kube: AsyncKube
    authorizer: CloneAuthorizer
    move: VolumeMove
    snapshots: SnapshotClone
    copy: HostAssistedCopy
    sizer: SizeDetection
    throttle: Throttle

    async def before_claim(
        self, dv: DataVolume, obj: Mapping[str, Any], desired: JSON, view: View
    ) -> tuple[JSON | None, View, Result]:
        raise NotImplementedError  # CloneFlavour's (flavour.py); a placeholder plans through it

    async def _event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        if self.throttle.due(uid, reason, message):
            await self.deps.events.emit(dict(obj), kind, reason, message)

    async def _classes(self, names: set[str]) -> dict[str, JSON]:
        return {n: c for n in names if n and (c := await self.kube.get_or_none(STORAGE_CLASSES, n))}

    async def _sizes(
        self, dv: DataVolume, src: Mapping[str, Any], desired: JSON
    ) -> plan.CloneSizes:
        """What the size rule needs when the modes differ (``cdi.render.clone``): the API the
        DataVolume uses and its classes' filesystem overheads."""
        storage_api = dv.spec.storage is not None
        pair = (plan.volume_mode(src), plan.volume_mode(desired))
        if pair == ("Block", "Filesystem"):
            return plan.CloneSizes(storage_api, target_overhead=await self._overhead(desired))
        if pair != ("Filesystem", "Block") or not storage_api:
            return plan.CloneSizes(storage_api)
        return plan.CloneSizes(storage_api, source_overhead=await self._overhead(src))

    async def _cdi_config(self) -> CDIConfig:
        raw = await self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        try:
            return CDIConfig.from_dict(raw) if raw else CDIConfig()
        except SchemaError:
            return CDIConfig()

    async def _overhead(self, claim: Mapping[str, Any]) -> float:
        """The filesystem overhead CDIConfig sets for the claim's class."""
        config = await self._cdi_config()
        return float(config.filesystem_overhead((claim.get("spec") or {}).get("storageClassName")))


def _class_of(claim: Mapping[str, Any]) -> str:
    return str((claim.get("spec") or {}).get("storageClassName") or "")
