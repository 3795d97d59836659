"""The scratch claim an import stages its source on: CDI's ``<pvc>-scratch`` (§2.10).

Why and when. Most sources stream straight into the target (raw, qcow2, vmdk, vdi, registry
layers); vhd/vhdx go through ``qemu-img convert`` from a file, and an image too disordered to
stream spills out-of-order data (or all of it) to a file. A Filesystem target stages beside
``disk.img`` on its own volume; a Block target has no folder and the importer's root is
read-only. So the first importer pod of a Block target has no scratch space at all; when the
source needs some, it ends with ``scratchSpaceRequired`` (reason ``Scratch space required``),
the controller records CDI's ``storage.import.requiresScratch`` on the target claim and the next
pod mounts this claim at ``/scratch``. A streamable image never causes one.

Shape, as CDI's ``createScratchPersistentVolumeClaim``:

- named ``<pvc>-scratch`` (``cdi.render.naming.scratch_pvc_name``), in the target's namespace,
  owned like the importer pod (by the DataVolume, ``cdi.render.owner``: CDI's owner is the
  pod, which our per-attempt pods would make wrong after a retry) and deleted by the
  controller when the import ends, succeeded or failed for good (CDI's cleanup: its pod is
  deleted, the garbage collector takes the claim);
- ``ReadWriteOnce``, ``Filesystem`` (CDI always stages on a filesystem), labelled
  ``app: containerized-data-importer`` and ``velero.io/exclude-from-backup: "true"``;
- size: what the target holds (its usable space after its own class's overhead) plus the
  scratch class's filesystem overhead, rounded up to 1 MiB;
- class (``scratch_storage_class``, CDI's ``GetScratchPvcStorageClass``): CDIConfig's
  ``status.scratchSpaceStorageClass`` (the config reconciler sets it only to a spec class that
  exists; before it has written a status, the spec's), else the target claim's class;
- the target's ``volume.kubernetes.io/selected-node`` copied when the target is a populator's
  prime (CDI does the same: the scheduler must put both on one node).

When neither CDIConfig nor the target names a class (a static volume bound by hand, a cluster
without a default class), no provisioner would ever bind a scratch claim and the import would
wait forever; the importer pod then gets an ``emptyDir`` at ``/scratch`` instead, bounded by
the same ``sizeLimit`` the importer enforces (``cdi.render.worker_pod.block_scratch_empty_dir``):
node ephemeral storage, which is why it is only the fallback.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_POPULATOR_KIND,
    ANN_SELECTED_NODE,
    LABEL_APP,
    LABEL_APP_VALUE,
    LABEL_EXCLUDE_FROM_BACKUP,
    VolumeMode,
)
from cdi.api.quantity import QuantityError, parse_quantity
from cdi.api.types import resolve_volume_mode
from cdi.render import RenderError
from cdi.render.clone import usable_space
from cdi.render.naming import scratch_pvc_name
from cdi.render.pvc import required_space

MIB = 1024 * 1024


def scratch_storage_class(cdi: CDIConfig, target: Mapping[str, Any]) -> str | None:
    """CDI's choice of class for the scratch claim of ``target``; None: no class anywhere."""
    if cdi.status is not None:
        chosen = cdi.status.scratch_space_storage_class
    else:  # the config reconciler has not written a status yet
        chosen = cdi.spec.scratch_space_storage_class
    if chosen:
        return chosen
    own = (target.get("spec") or {}).get("storageClassName")
    return str(own) if own else None


def _overhead(cdi: CDIConfig, storage_class: str | None) -> float:
    try:
        return float(cdi.filesystem_overhead(storage_class))
    except ValueError as exc:
        raise RenderError(f"filesystem overhead of class {storage_class!r}: {exc}") from exc


def scratch_size(cdi: CDIConfig, target: Mapping[str, Any], storage_class: str | None) -> int:
    """Bytes the scratch claim requests: the target's usable space plus the scratch class's
    overhead, rounded up to 1 MiB (CDI's ``GetUsableSpace`` then ``GetRequiredSpace``)."""
    spec = target.get("spec") or {}
    text = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    try:
        capacity = math.ceil(parse_quantity(str(text))) if text else 0
    except QuantityError as exc:
        raise RenderError(f"target claim size {text!r}: {exc}") from exc
    if capacity <= 0:
        raise RenderError("target claim has no storage request")
    block = resolve_volume_mode(spec.get("volumeMode")) == VolumeMode.BLOCK
    own_overhead = 0.0 if block else _overhead(cdi, spec.get("storageClassName"))
    content = usable_space(own_overhead, capacity) if own_overhead else capacity
    size = required_space(_overhead(cdi, storage_class), content)
    return -(-size // MIB) * MIB


def render_scratch_pvc(
    target: Mapping[str, Any],
    owner: Mapping[str, Any],
    cdi: CDIConfig,
    storage_class: str,
) -> dict[str, Any]:
    """The scratch claim of ``target``, owned by ``owner`` (an owner reference)."""
    meta = target.get("metadata") or {}
    ann = meta.get("annotations") or {}
    annotations: dict[str, str] = {}
    if ann.get(ANN_POPULATOR_KIND) and ann.get(ANN_SELECTED_NODE):
        annotations[ANN_SELECTED_NODE] = str(ann[ANN_SELECTED_NODE])
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": scratch_pvc_name(str(meta.get("name"))),
            "namespace": meta.get("namespace"),
            "labels": {LABEL_APP: LABEL_APP_VALUE, LABEL_EXCLUDE_FROM_BACKUP: "true"},
            "annotations": annotations,
            "ownerReferences": [dict(owner)],
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": str(VolumeMode.FILESYSTEM),
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": str(scratch_size(cdi, target, storage_class))}},
        },
    }
