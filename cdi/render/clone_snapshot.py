"""Pure decisions and objects of a clone through a VolumeSnapshot (CDI's smart clone and the
clone from a snapshot source), kept apart from ``cdi.render.clone`` so each stays one concept.

Given the VolumeSnapshotClasses, the snapshot, the target claim and the storage classes, these
functions say what the clone flavour (``cdi.controller.flavours.clone.snapshot``) creates, so
every rule is tested without a cluster:

- ``choose_snapshot_class``: CDI's ``GetVolumeSnapshotClass``: the StorageProfile's
  ``snapshotClass`` if its ``driver`` is the provisioner, else the class annotated default for
  that driver, else the first by name; None means "no compatible class" (``NoVolumeSnapshotClass``);
- ``render_snapshot``: the temporary snapshot ``tmp-snapshot-<dv uid>`` of the source claim, in
  the source namespace, labelled ``cloneFor`` (nothing in another namespace can own it, so the
  flavour deletes it itself, and ``forget`` finds a stray one by the label);
- ``restore_claim``: a claim restored from a ready snapshot (``dataSource`` kind VolumeSnapshot)
  at the snapshot's ``restoreSize``, as CDI's ``SnapshotClonePhase``; a bigger target records
  its wanted size (``clone.targetSize``) and is expanded once bound (CDI's ``PrepClaim``);
- ``plan_snapshot_source``: CDI's planner for a snapshot source: the snapshot's driver must be
  the target class's provisioner (``NoProvisionerMatch``), the volume modes must match, and a
  bigger target needs volume expansion (``NoVolumeExpansion``); else host-assisted;
- ``temporary_source``: that host-assisted fallback's source, CDI's ``tmp-source-pvc-<dv uid>``
  restored in the snapshot's namespace on a class of the snapshot's driver (``restore_class``:
  Immediate binding first, then by name), at the restore size, in the snapshotted volume's mode
  (the target's when unknown), labelled like every temporary object of a clone.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import GROUP
from cdi.render.clone import (
    COPY,
    INCOMPATIBLE_MODES,
    LABEL_CLONE_FOR,
    NO_EXPANSION,
    SNAPSHOT,
    Fallback,
    StrategyPlan,
    quantity_bytes,
    requested,
    temporary_claim,
    temporary_meta,
    volume_mode,
)

JSON = dict[str, Any]
SNAPSHOT_GROUP = "snapshot.storage.k8s.io"
KIND_VOLUME_SNAPSHOT = "VolumeSnapshot"
ANN_DEFAULT_SNAPSHOT_CLASS = "snapshot.storage.kubernetes.io/is-default-class"
ANN_TARGET_SIZE = f"{GROUP}/clone.targetSize"  # bytes the restored claim grows to once bound
REASON_CLASS_SELECTED = "VolumeSnapshotClassSelected"
BY_PROFILE = "VolumeSnapshotClass selected according to StorageProfile"
BY_DEFAULT = "Default VolumeSnapshotClass selected"
FIRST = "First VolumeSnapshotClass selected"
NO_PROVISIONER_MATCH = Fallback(
    "NoProvisionerMatch",
    "The storageclass provisioner does not match the volumesnapshotcontent driver",
)


@dataclass(frozen=True)
class SnapshotClassChoice:
    """The class chosen and CDI's ``VolumeSnapshotClassSelected`` message."""

    name: str
    message: str


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def choose_snapshot_class(
    driver: str, classes: Sequence[Mapping[str, Any]], wanted: str | None = None
) -> SnapshotClassChoice | None:
    """The VolumeSnapshotClass for volumes of ``driver`` (CDI's ``GetVolumeSnapshotClass``)."""
    if not driver:
        return None
    if wanted:
        named = next((c for c in classes if _meta(c).get("name") == wanted), None)
        if named is not None and named.get("driver") == driver:
            return SnapshotClassChoice(wanted, f"{BY_PROFILE} {wanted}")
        return None
    matching = sorted(str(_meta(c).get("name")) for c in classes if c.get("driver") == driver)
    for cls in classes:
        default = (_meta(cls).get("annotations") or {}).get(ANN_DEFAULT_SNAPSHOT_CLASS) == "true"
        if default and cls.get("driver") == driver:
            name = str(_meta(cls).get("name"))
            return SnapshotClassChoice(name, f"{BY_DEFAULT} {name}")
    if matching:
        return SnapshotClassChoice(matching[0], f"{FIRST} {matching[0]}")
    return None


def tmp_snapshot_name(dv_uid: str) -> str:
    return f"tmp-snapshot-{dv_uid}"


def render_snapshot(
    namespace: str, claim: str, dv_uid: str, snapshot_class: str, target_key: str
) -> JSON:
    """The temporary snapshot of ``namespace/claim`` a smart clone restores from."""
    return {
        "apiVersion": f"{SNAPSHOT_GROUP}/v1",
        "kind": KIND_VOLUME_SNAPSHOT,
        "metadata": temporary_meta(tmp_snapshot_name(dv_uid), namespace, dv_uid, target_key),
        "spec": {
            "source": {"persistentVolumeClaimName": claim},
            "volumeSnapshotClassName": snapshot_class,
        },
    }


def made_for(snapshot: Mapping[str, Any], dv_uid: str) -> bool:
    """Our temporary snapshot for this DataVolume (by its label)."""
    return (_meta(snapshot).get("labels") or {}).get(LABEL_CLONE_FOR) == dv_uid


def ready(snapshot: Mapping[str, Any]) -> bool:
    return bool((snapshot.get("status") or {}).get("readyToUse"))


def snapshot_error(snapshot: Mapping[str, Any]) -> str | None:
    """The snapshot controller's error message, if it reports one."""
    error = (snapshot.get("status") or {}).get("error") or {}
    return str(error["message"]) if error.get("message") else None


def restore_size(snapshot: Mapping[str, Any]) -> int | None:
    return quantity_bytes((snapshot.get("status") or {}).get("restoreSize"))


def as_source_claim(snapshot: Mapping[str, Any], mode: str) -> JSON:
    """The snapshot seen as a source claim (its restore size and volume mode), so the size
    rules of ``cdi.render.clone`` (``fill_size``, ``size_problem``) apply to it unchanged."""
    spec: JSON = {"volumeMode": mode}
    size = restore_size(snapshot)
    if size:
        spec["resources"] = {"requests": {"storage": str(size)}}
    return {"metadata": dict(_meta(snapshot)), "spec": spec}


def restore_claim(target: Mapping[str, Any], snapshot: str, size: int | None) -> JSON:
    """``target`` restored from ``snapshot``: at the snapshot's size when it has one (a zero
    size means the driver restores at any size), growing to the target's size once bound."""
    out = copy.deepcopy(dict(target))
    spec = out["spec"]
    spec["dataSource"] = {
        "apiGroup": SNAPSHOT_GROUP,
        "kind": KIND_VOLUME_SNAPSHOT,
        "name": snapshot,
    }
    spec.pop("dataSourceRef", None)
    wanted = requested(target)
    if size:
        spec.setdefault("resources", {}).setdefault("requests", {})["storage"] = str(size)
        if wanted is not None and wanted > size:
            out["metadata"].setdefault("annotations", {})[ANN_TARGET_SIZE] = str(wanted)
    return out


def restore_plan(
    desired: Mapping[str, Any],
    snapshot: Mapping[str, Any],
    dv_namespace: str,
    dv_uid: str,
    target_key: str,
) -> tuple[JSON, JSON | None]:
    """(the target claim restored from ``snapshot``, the temporary claim to restore in the
    snapshot's namespace first, or None when it is the target's: a claim can only name a
    snapshot of its own namespace, so across namespaces the restored volume moves)."""
    ns, name = str(_meta(snapshot).get("namespace")), str(_meta(snapshot).get("name"))
    target = restore_claim(desired, name, restore_size(snapshot))
    if ns == dv_namespace:
        return target, None
    source = target["spec"]["dataSource"]
    return target, temporary_claim(target, dv_uid, ns, name, target_key, data_source=source)


def growth(claim: Mapping[str, Any]) -> int | None:
    """Bytes a bound restored claim still has to grow to (its recorded target size), or None
    when it is as big as wanted."""
    raw = (_meta(claim).get("annotations") or {}).get(ANN_TARGET_SIZE)
    if not raw or not str(raw).isdigit():
        return None
    wanted = int(raw)
    capacity = ((claim.get("status") or {}).get("capacity") or {}).get("storage")
    have = quantity_bytes(capacity) or 0
    return wanted if have < wanted else None


def snapshot_driver(snapshot_class: Mapping[str, Any] | None) -> str:
    return str((snapshot_class or {}).get("driver") or "")


def plan_snapshot_source(
    driver: str,
    source_mode: str | None,
    snapshot: Mapping[str, Any],
    target: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
) -> StrategyPlan:
    """Restore ``snapshot`` (taken by ``driver``, of a volume in ``source_mode`` when known)
    into ``target``, or host-assisted with CDI's reason."""
    tgt_class = classes.get(str((target.get("spec") or {}).get("storageClassName") or "")) or {}
    if not driver or tgt_class.get("provisioner") != driver:
        return StrategyPlan(COPY, NO_PROVISIONER_MATCH)
    if source_mode is not None and source_mode != volume_mode(target):
        return StrategyPlan(COPY, INCOMPATIBLE_MODES)
    size, wanted = restore_size(snapshot), requested(target)
    if size and wanted is not None and size < wanted and not tgt_class.get("allowVolumeExpansion"):
        return StrategyPlan(COPY, NO_EXPANSION)
    return StrategyPlan(SNAPSHOT)


def temporary_source_name(dv_uid: str) -> str:
    return f"tmp-source-pvc-{dv_uid}"


def restore_class(driver: str, classes: Sequence[Mapping[str, Any]]) -> str | None:
    """A storage class that can restore the snapshots of ``driver``: Immediate ones first (a
    source pod is not its first consumer), then by name (CDI: the first by name)."""
    fitting = [c for c in classes if driver and c.get("provisioner") == driver]
    fitting.sort(key=lambda c: (c.get("volumeBindingMode") == "WaitForFirstConsumer",
                                str(_meta(c).get("name"))))  # fmt: skip
    return str(_meta(fitting[0]).get("name")) if fitting else None


def temporary_source(
    snapshot: Mapping[str, Any], storage_class: str, target: Mapping[str, Any], mode: str | None,
    dv_uid: str, target_key: str,
) -> JSON:  # fmt: skip
    """The claim restored from ``snapshot`` that a host-assisted clone into ``target`` copies
    from (the target's size when the snapshot's is unknown)."""
    size = ((target.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    base: JSON = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": temporary_meta(
            temporary_source_name(dv_uid), str(_meta(snapshot).get("namespace")), dv_uid, target_key
        ),
        "spec": {
            "storageClassName": storage_class,
            "accessModes": ["ReadWriteOnce"],  # CDI: what every CSI driver allows
            "volumeMode": mode or volume_mode(target),
            "resources": {"requests": {"storage": size}},
        },
    }
    out = restore_claim(base, str(_meta(snapshot).get("name")), restore_size(snapshot))
    out["metadata"]["annotations"].pop(ANN_TARGET_SIZE, None)  # it is copied from, not grown
    return out
