"""Pure decisions and objects of a clone: strategy, size, the claims a clone creates.

Given the source PVC, the target claim the DataVolume renders to, the storage classes and the
target's StorageProfile, these functions say what the clone flavour
(``cdi.controller.flavours.clone``) should create, so every rule is tested without a cluster:

- ``plan_strategy``: the profile's ``cloneStrategy`` (CDI's planner, reference §4.1: none
  means ``snapshot``), and the fallback to host-assisted ``copy`` with CDI's reason when the
  storage cannot do it: a snapshot strategy without a compatible VolumeSnapshotClass (none
  for the provisioner, or no snapshot API at all), different provisioners, different volume
  modes, a bigger target on a class without volume expansion;
- ``fill_size`` / ``size_problem``: ``storage`` without a size takes the source's request; a
  target smaller than the source is CDI's ``ErrIncompatiblePVC`` (the size rule below);
- ``csi_target``: a same-namespace CSI clone is the target claim with ``dataSource`` = source;
- ``temporary_claim`` / ``moved_target``: a cross-namespace CSI clone is made in the source
  namespace (the CSI driver clones only within a namespace) as ``tmp-pvc-<dv uid>``, whose
  volume then moves to the target claim (``cdi.controller.flavours.clone.move``).

The size rule (issue 29). Within one volume mode, and for every ``pvc``-API clone but block to
filesystem, CDI's: the source claim's request must not exceed the target's
(``ValidateRequestedCloneSize``). Across modes, the claims' requests do not measure the same
thing: a filesystem claim written by the ``storage`` API is inflated for the filesystem's
overhead, and what a clone moves is ``disk.img`` or the whole device. CDI skips the check for a
``storage``-API filesystem source ("needs a better more complex check ... to account for
fsOverhead") and lets the copy fail later; we compare what moves with the room it lands in:

- filesystem -> block (``storage`` API): ``disk.img`` must fit in the target device. Its size
  is what the source claim holds after its class's overhead (``usable_space``) at most: an
  import or upload grows ``disk.img`` to the volume's usable size (CDI's resize, and a VM may
  since have grown its partitions into it), so the original image's virtual size is not what a
  clone moves; the claim's inflated request is not either;
- block -> filesystem (both APIs): the device's size must fit in the target claim after the
  target class's overhead (CDI checks only the raw requests, and the copy then runs out of
  room).
The message is CDI's, with the two numbers compared. ``permissiveClone`` skips it (CDI's
``cdi.kubevirt.io/permissiveClone: "true"``, on the DataVolume or set by the sizing below).

Sizing a host-assisted clone of a filesystem source holding a ``kubevirt`` image when the
DataVolume gives no size (issue 27; CDI ``detectCloneSize``): CDI runs a size-detection pod
(``qemu-img info`` of the source's ``disk.img``) and caches its answer on the source claim
(``cdi.Kubervirt.io/virtualSize`` with ``cdi.Kubervirt.io/sourceCapacity``, CDI's spelling),
then asks for that size, inflated by the *target* class's overhead for a filesystem target
(``InflateSizeWithOverhead``), and marks the clone permissive when the source's claim is the
bigger one (different overheads, or a block target). So do we: the size-detection pod
(``cdi.render.size_detection``, run by ``cdi.controller.flavours.clone.sizing``) measures the
image unless the claim carries the cache for its current capacity; ``content_size`` is that
answer, capped at the source's usable space (what the importer and the upload server grow
``disk.img`` to, and what the size rule above measures). A measurement that failed falls back
to that usable space. Other strategies (CSI clone, snapshot: the copy must be at least the source's
size) and other sources (block, archive) keep the source's request, as CDI takes the source's
capacity.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_PERMISSIVE_CLONE,
    ANN_SELECTED_NODE,
    GROUP,
    MIB,
    ContentType,
)
from cdi.api.quantity import Quantity, QuantityError
from cdi.render.pvc import required_space

JSON = dict[str, Any]
COPY, SNAPSHOT, CSI_CLONE = "copy", "snapshot", "csi-clone"
ANN_CLONE_TYPE = f"{GROUP}/cloneType"
ANN_FALLBACK_REASON = f"{GROUP}/cloneFallbackReason"
ANN_CLONE_REQUEST = "k8s.io/CloneRequest"
ANN_CLONE_OF = "k8s.io/CloneOf"
LABEL_CLONE_FOR = f"{GROUP}/cloneFor"  # on the temporary claim and the moving PV: the DV's UID
ANN_MOVE_TARGET = f"{GROUP}/clone.moveTarget"  # on both too: "namespace/name" of the target
REASON_INCOMPATIBLE_PVC = "ErrIncompatiblePVC"
HOSTNAME = "kubernetes.io/hostname"
SMALLER = "target resources requests storage size is smaller than the source"


@dataclass(frozen=True)
class Fallback:
    """Why the profile's strategy cannot be used: the event reason and CDI's message."""

    reason: str
    message: str


@dataclass(frozen=True)
class StrategyPlan:
    strategy: str
    fallback: Fallback | None = None


# CDI's messages, word for word (pkg/controller/clone/planner.go)
INCOMPATIBLE_PROVISIONERS = Fallback("IncompatibleProvisioners", "Provisioners are incompatible")
INCOMPATIBLE_MODES = Fallback(
    "IncompatibleVolumeModes", "The volume modes of source and target are incompatible"
)
NO_EXPANSION = Fallback("NoVolumeExpansion", "No volume expansion is possible")
NO_SNAPSHOT_CLASS = Fallback("NoVolumeSnapshotClass", "No compatible volumesnapshotclass found")


def quantity_bytes(raw: Any) -> int | None:
    """A quantity as written in an object (``64Mi``, ``67108864``) in bytes; None if absent
    or unparsable."""
    if raw is None:
        return None
    try:
        return Quantity.parse(str(raw)).value()
    except QuantityError:
        return None


def requested(claim: Mapping[str, Any]) -> int | None:
    raw = (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    return quantity_bytes(raw)


def volume_mode(claim: Mapping[str, Any]) -> str:
    return str((claim.get("spec") or {}).get("volumeMode") or "Filesystem")


def plan_strategy(
    wanted: str | None,
    source: Mapping[str, Any],
    target: Mapping[str, Any],
    classes: Mapping[str, Mapping[str, Any]],
    snapshot_class: str | None = None,
) -> StrategyPlan:
    """The strategy to use for cloning ``source`` into ``target`` (both claims; ``classes``
    by name), from the profile's ``wanted`` strategy (None: CDI's default, ``snapshot``);
    ``snapshot_class`` is the compatible VolumeSnapshotClass, if any."""
    strategy = wanted or SNAPSHOT
    if strategy == COPY:
        return StrategyPlan(COPY)
    src_class = classes.get(str((source.get("spec") or {}).get("storageClassName") or ""))
    tgt_class = classes.get(str((target.get("spec") or {}).get("storageClassName") or ""))
    if strategy == SNAPSHOT and not snapshot_class:
        return StrategyPlan(COPY, NO_SNAPSHOT_CLASS)
    if (
        not src_class
        or not tgt_class
        or src_class.get("provisioner") != tgt_class.get("provisioner")
    ):
        return StrategyPlan(COPY, INCOMPATIBLE_PROVISIONERS)
    if volume_mode(source) != volume_mode(target):
        return StrategyPlan(COPY, INCOMPATIBLE_MODES)
    bigger = (requested(target) or 0) > (requested(source) or 0)
    if bigger and not tgt_class.get("allowVolumeExpansion"):
        return StrategyPlan(COPY, NO_EXPANSION)
    return StrategyPlan(strategy)


def needs_overhead(source: Mapping[str, Any], target: Mapping[str, Any]) -> bool:
    """A block source into a filesystem target without a size: the target must hold the
    device's bytes as ``disk.img`` plus the filesystem's overhead."""
    block_to_fs = volume_mode(source) == "Block" and volume_mode(target) == "Filesystem"
    return block_to_fs and requested(target) is None


def fill_size(target: JSON, source: Mapping[str, Any], overhead: float = 0.0) -> JSON:
    """``storage`` without a size takes the source's request (CDI: the source decides); a
    block source into a filesystem claim adds ``overhead`` as CDI's ``GetRequiredSpace``."""
    if requested(target) is not None:
        return target
    raw = (((source.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")
    src = requested(source)
    if needs_overhead(source, target) and src is not None:
        raw = str(required_space(overhead, src))
    out = copy.deepcopy(target)
    resources = out["spec"].setdefault("resources", {})
    resources.setdefault("requests", {})["storage"] = raw
    return out


ANN_VIRTUAL_SIZE = "cdi.Kubervirt.io/virtualSize"  # CDI's annotation keys, typo included
ANN_SOURCE_CAPACITY = "cdi.Kubervirt.io/sourceCapacity"


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return (obj.get("metadata") or {}).get("annotations") or {}


def permissive(*objs: Mapping[str, Any]) -> bool:
    """``cdi.kubevirt.io/permissiveClone: "true"`` on any of ``objs`` (the DataVolume, the
    target claim): the size rule is skipped, as CDI skips it."""
    return any(_annotations(o).get(ANN_PERMISSIVE_CLONE) == "true" for o in objs)


def detects_size(source: Mapping[str, Any]) -> bool:
    """CDI measures the image (host-assisted clones only) of a filesystem source holding a
    ``kubevirt`` image; a block or archive source is measured by its claim."""
    archive = _annotations(source).get(ANN_CONTENT_TYPE) == ContentType.ARCHIVE
    return volume_mode(source) == "Filesystem" and not archive


def content_size(source: Mapping[str, Any], source_overhead: float) -> int | None:
    """What the source's ``disk.img`` is at most: its usable space (the importer and the upload
    server grow it to that), or CDI's cached measurement for the claim's current capacity,
    never more than the usable space. None without a request."""
    src = requested(source)
    if src is None:
        return None
    bound = usable_space(source_overhead, src)
    measured = cached_virtual_size(source)
    return bound if measured is None else min(measured, bound)


def cached_virtual_size(source: Mapping[str, Any]) -> int | None:
    """CDI's cached size-detection answer on the source claim, if it was measured at the
    claim's current capacity (``getSizeFromAnnotations``); None: measure (again)."""
    ann = _annotations(source)
    capacity = ((source.get("status") or {}).get("capacity") or {}).get("storage")
    measured = quantity_bytes(ann.get(ANN_VIRTUAL_SIZE))
    same_capacity = capacity is not None and ann.get(ANN_SOURCE_CAPACITY) == str(capacity)
    return measured if measured is not None and measured > 0 and same_capacity else None


def sized_from_content(
    target: JSON, source: Mapping[str, Any], content: int, target_overhead: float
) -> JSON:
    """The target claim asking for ``content`` bytes (a filesystem target: plus its class's
    overhead, CDI's ``InflateSizeWithOverhead``), permissive when the source's claim asks for
    more (CDI: overhead differences would fail the size rule otherwise)."""
    out = copy.deepcopy(target)
    fs = volume_mode(target) == "Filesystem"
    size = required_space(target_overhead, content) if fs else content
    out["spec"].setdefault("resources", {}).setdefault("requests", {})["storage"] = str(size)
    if (requested(source) or 0) > size:
        out["metadata"].setdefault("annotations", {})[ANN_PERMISSIVE_CLONE] = "true"
    return out


def usable_space(overhead: float, capacity: int) -> int:
    """CDI ``GetUsableSpace``: what a filesystem claim of ``capacity`` bytes holds as
    ``disk.img`` once the overhead is off, rounded down to 1 MiB (qemu-img rounds sizes up).
    The inverse of ``required_space`` for whole MiB."""
    return math.ceil((1 - overhead) * capacity) // MIB * MIB


@dataclass(frozen=True)
class CloneSizes:
    """What the size rule needs beside the two claims."""

    storage_api: bool = False  # the DataVolume says ``storage`` (else ``pvc``)
    source_overhead: float = 0.0  # CDIConfig's filesystem overhead for the source's class
    target_overhead: float = 0.0  # ... and for the target's


def size_problem(
    source: Mapping[str, Any], target: Mapping[str, Any], sizes: CloneSizes | None = None
) -> str | None:
    """CDI's ``ValidateRequestedCloneSize`` message, or None when the target is big enough
    (the size rule in the module docstring)."""
    sizes = sizes or CloneSizes()
    src, tgt = requested(source), requested(target)
    if src is None or tgt is None:
        return None
    pair = (volume_mode(source), volume_mode(target))
    if pair == ("Block", "Filesystem"):
        room = usable_space(sizes.target_overhead, tgt)
        if not sizes.storage_api and tgt < src:
            return f"{SMALLER} {tgt} < {src}"
        return f"{SMALLER} {room} < {src}" if room < src else None
    if pair == ("Filesystem", "Block") and sizes.storage_api:
        content = usable_space(sizes.source_overhead, src)
        return f"{SMALLER} {tgt} < {content}" if tgt < content else None
    return f"{SMALLER} {tgt} < {src}" if tgt < src else None


def annotate(target: JSON, plan: StrategyPlan, source_ns: str, source_name: str) -> JSON:
    """The target claim with CDI's clone bookkeeping: ``cloneType``, the fallback reason,
    ``k8s.io/CloneRequest``."""
    out = copy.deepcopy(target)
    ann = out["metadata"].setdefault("annotations", {})
    ann[ANN_CLONE_TYPE] = plan.strategy
    ann[ANN_CLONE_REQUEST] = f"{source_ns}/{source_name}"
    if plan.fallback is not None:
        ann[ANN_FALLBACK_REASON] = plan.fallback.message
    return out


def csi_target(target: JSON, source_name: str) -> JSON:
    """A same-namespace CSI clone: the provisioner fills the claim from ``dataSource``."""
    out = copy.deepcopy(target)
    out["spec"]["dataSource"] = {"kind": "PersistentVolumeClaim", "name": source_name}
    out["spec"].pop("dataSourceRef", None)
    return out


def temporary_meta(name: str, namespace: str, dv_uid: str, target_key: str) -> JSON:
    """Metadata of an object a clone makes in the source namespace (temporary claim, snapshot):
    nothing there can own it, so it carries the DataVolume's UID (``cloneFor``) and the target
    it serves (``clone.moveTarget``), by which strays are found."""
    return {
        "name": name,
        "namespace": namespace,
        "labels": {LABEL_CLONE_FOR: dv_uid, "app": "containerized-data-importer"},
        "annotations": {ANN_MOVE_TARGET: target_key},
    }


def temporary_claim_name(dv_uid: str) -> str:
    return f"tmp-pvc-{dv_uid}"


def temporary_claim(
    target: Mapping[str, Any],
    dv_uid: str,
    source_ns: str,
    source: str,
    target_key: str = "",
    data_source: Mapping[str, Any] | None = None,
) -> JSON:
    """The claim cloned in the source namespace whose volume becomes the target's: the
    target's class, modes and size, ``dataSource`` = the source claim (or ``data_source``, a
    snapshot to restore), labelled with the DV's UID."""
    spec = target.get("spec") or {}
    source_ref = data_source or {"kind": "PersistentVolumeClaim", "name": source}
    keep = ("accessModes", "resources", "storageClassName", "volumeMode")
    meta = temporary_meta(temporary_claim_name(dv_uid), source_ns, dv_uid, target_key)
    node = selected_node(target)
    if node is not None:  # WaitForFirstConsumer storage: provisioned where the target is used
        meta["annotations"][ANN_SELECTED_NODE] = node
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta,
        "spec": {
            **{k: copy.deepcopy(spec[k]) for k in keep if k in spec},
            "dataSource": copy.deepcopy(source_ref),
        },
    }


# A cross-namespace clone into WaitForFirstConsumer storage creates its target claim first, as a
# placeholder a consumer can be scheduled with: its ``dataSourceRef`` names the DataVolume (a
# kind no provisioner fills, so only the scheduler's ``selected-node`` lands on it), and the
# cloned volume later binds it through the PV's ``claimRef``.
PLACEHOLDER_REF = {"apiGroup": GROUP, "kind": "DataVolume"}


def placeholder_target(target: JSON, dv_name: str) -> JSON:
    """The target claim waiting for its consumer's node (no volume, no data source)."""
    out = copy.deepcopy(target)
    out["spec"].pop("dataSource", None)
    out["spec"].pop("volumeName", None)
    out["spec"]["dataSourceRef"] = {**PLACEHOLDER_REF, "name": dv_name}
    return out


def is_placeholder(claim: Mapping[str, Any], dv_name: str) -> bool:
    ref = (claim.get("spec") or {}).get("dataSourceRef") or {}
    return {k: ref.get(k) for k in ("apiGroup", "kind", "name")} == {
        **PLACEHOLDER_REF,
        "name": dv_name,
    }


def selected_node(claim: Mapping[str, Any]) -> str | None:
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    return str(ann[ANN_SELECTED_NODE]) if ann.get(ANN_SELECTED_NODE) else None


def on_node(claim: JSON, node: str) -> JSON:
    """``claim`` provisioned on ``node`` (WaitForFirstConsumer storage without a consumer)."""
    out = copy.deepcopy(claim)
    out["metadata"].setdefault("annotations", {})[ANN_SELECTED_NODE] = node
    return out


def node_of_volume(pv: Mapping[str, Any]) -> str | None:
    """The one node a local PersistentVolume is pinned to (``kubernetes.io/hostname In [n]``)."""
    affinity = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required")) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            values = expr.get("values") or []
            if expr.get("key") == HOSTNAME and expr.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


def moved_target(target: JSON, pv_name: str) -> JSON:
    """The target claim that binds to the moved volume and nothing else."""
    out = copy.deepcopy(target)
    out["spec"]["volumeName"] = pv_name
    out["spec"].pop("dataSource", None)
    out["spec"].pop("dataSourceRef", None)
    return out
