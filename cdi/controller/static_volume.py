"""Static and pre-populated volumes: DataVolumes whose data is already on a volume (CDI
``controller-base.go`` ``handleStaticVolume``, ``checkStaticProvisionPending``,
``pvcIsPopulated``, ``dvIsPrePopulated``).

- ``cdi.kubevirt.io/storage.prePopulated`` on a DataVolume: its claim is the user's to create.
  Without one the DataVolume waits (``Pending``, Bound ``NotFound`` "No PVC found") and nothing
  is created; the claim, once it appears, is adopted as populated.
- ``cdi.kubevirt.io/storage.populatedFor: <dv>`` on a claim: the claim holds the DataVolume's
  data. The DataVolume adopts it (a controller owner reference, as CDI adds) and succeeds
  without a worker.
- ``cdi.kubevirt.io/storage.checkStaticVolume`` on a DataVolume: before the claim is created,
  the PersistentVolumes pre-bound to it (``claimRef`` the DataVolume's namespace and name),
  ``Available`` and satisfying the rendered claim (CDI's ``CheckVolumeSatisfyClaim``: not being
  deleted, capacity, class, volume mode, access modes) are listed in the claim's
  ``cdi.kubevirt.io/storage.persistentVolumeList`` annotation (a JSON list of names). While
  that annotation is there nothing fills the claim; once the binder bound it to one of them,
  the annotation gives way to ``populatedFor`` and the DataVolume succeeds, keeping the volume's
  data. A claim bound to another volume is deleted, to be made again (CDI). No such volume: an
  ordinary claim and import, as CDI does.

The decisions are pure functions of the objects read; ``cdi.controller.datavolume`` acts on them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any

from cdi.api.constants import ANN_PERSISTENT_VOLUME_LIST, ANN_POPULATED_FOR, ANN_PRE_POPULATED
from cdi.api.quantity import Quantity, QuantityError
from cdi.api.types import DataVolume


def pre_populated(dv: DataVolume) -> bool:
    """The user makes (and fills) this DataVolume's claim."""
    return ANN_PRE_POPULATED in dv.annotations


def populated_for(pvc: Mapping[str, Any], dv: DataVolume) -> bool:
    """The claim says it holds ``dv``'s data."""
    return _annotations(pvc).get(ANN_POPULATED_FOR) == dv.name


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def _bytes(text: object) -> int | None:
    try:
        return Quantity.parse(str(text)).value()
    except (QuantityError, ValueError):
        return None


def satisfies(pv: Mapping[str, Any], claim: Mapping[str, Any]) -> bool:
    """CDI's ``CheckVolumeSatisfyClaim``: ``pv`` could hold ``claim``."""
    if (pv.get("metadata") or {}).get("deletionTimestamp"):
        return False
    spec, want = pv.get("spec") or {}, claim.get("spec") or {}
    requested = _bytes(((want.get("resources") or {}).get("requests") or {}).get("storage", 0))
    capacity = _bytes((spec.get("capacity") or {}).get("storage", 0))
    if requested is None or capacity is None or capacity < requested:
        return False
    if (spec.get("storageClassName") or "") != (want.get("storageClassName") or ""):
        return False
    if (spec.get("volumeMode") or "Filesystem") != (want.get("volumeMode") or "Filesystem"):
        return False
    return set(want.get("accessModes") or ()) <= set(spec.get("accessModes") or ())


def static_volumes(pvs: Iterable[Mapping[str, Any]], claim: Mapping[str, Any]) -> list[str]:
    """The names of the Available volumes pre-bound to ``claim`` (by namespace and name) that
    satisfy it, sorted."""
    meta = claim.get("metadata") or {}
    names = []
    for pv in pvs:
        ref = (pv.get("spec") or {}).get("claimRef") or {}
        if (ref.get("namespace"), ref.get("name")) != (meta.get("namespace"), meta.get("name")):
            continue
        if (pv.get("status") or {}).get("phase") != "Available" or not satisfies(pv, claim):
            continue
        names.append(str((pv.get("metadata") or {}).get("name")))
    return sorted(names)


def listed_volumes(pvc: Mapping[str, Any]) -> list[str] | None:
    """The claim's ``persistentVolumeList`` (a static provision still pending), or None. An
    unreadable list is an empty one: no volume is the expected one."""
    text = _annotations(pvc).get(ANN_PERSISTENT_VOLUME_LIST)
    if text is None:
        return None
    try:
        names = json.loads(str(text))
    except ValueError:
        return []
    return [str(n) for n in names] if isinstance(names, list) else []


class StaticState(Enum):
    WAITING = "waiting"  # not bound yet: the binder will bind it to a listed volume
    BOUND = "bound"  # bound to a listed volume: populated
    WRONG_VOLUME = "wrong-volume"  # bound to another volume: delete the claim, start again


def static_state(pvc: Mapping[str, Any], listed: list[str]) -> StaticState:
    if (pvc.get("status") or {}).get("phase") != "Bound":
        return StaticState.WAITING
    volume = (pvc.get("spec") or {}).get("volumeName")
    return StaticState.BOUND if volume in listed else StaticState.WRONG_VOLUME


def listed_annotation(names: list[str]) -> dict[str, str]:
    return {ANN_PERSISTENT_VOLUME_LIST: json.dumps(names)}
