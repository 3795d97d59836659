"""The StorageProfile a StorageClass should have, as a pure function of the class and the profile.

One profile per class, same name. ``spec`` is the user's (overrides); ``status`` is ours and is
what ``spec.storage`` claims are completed from (``cdi.render.pvc``). Precedence, per field, as
in CDI's ``storageprofile-controller``:

- ``claimPropertySets``: the spec's when it has any, copied as written, else the provisioner's
  known capabilities (``cdi.render.capabilities``), else none. Unlike CDI, an incomplete spec
  set (no access modes) is copied too rather than refused: the user said so, and the DataVolumes
  on the class then report ``ErrClaimNotValid`` saying the profile has no access mode, which is
  the visible outcome a user who removed them expects;
- ``cloneStrategy``: spec, else the class's ``cdi.kubevirt.io/clone-strategy`` annotation, else
  the provisioner's advised strategy, else ``snapshot`` when a VolumeSnapshotClass serves the
  provisioner (the reconciler finds it), else ``copy``; an advised ``snapshot`` without such a
  class is ``copy`` too (CDI's ``reconcileCloneStrategy``). A spec's ``snapshot`` stays: the
  clone planner then falls back with ``NoVolumeSnapshotClass``, which the user sees;
- ``dataImportCronSourceFormat``: spec, else ``pvc``;
- condition ``Recognized``: True when the provisioner is in the table.

Timestamps are not set here: the reconciler merges conditions with the previous ones so a
``lastTransitionTime`` moves only when a status changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.config import ClaimPropertySet, StorageProfile, StorageProfileSpec
from cdi.api.constants import ANN_MINIMUM_SUPPORTED_PVC_SIZE
from cdi.render import capabilities

ANN_CLONE_STRATEGY = "cdi.kubevirt.io/clone-strategy"
CONDITION_RECOGNIZED = "Recognized"
RECOGNIZED = ("True", "RecognizedProvisioner", "Provisioner is recognized")
UNRECOGNIZED = ("False", "UnrecognizedProvisioner", "Provisioner is not recognized")
UNRECOGNIZED_PARAMETERS = (
    "False",
    "UnrecognizedStorageClassParameters",
    "Storage class parameters are not recognized",
)
CLONE_STRATEGIES = ("copy", "snapshot", "csi-clone")

SC = Mapping[str, Any]


def sc_name(sc: SC) -> str:
    return str((sc.get("metadata") or {}).get("name", ""))


def new_profile(sc: SC) -> dict[str, Any]:
    """The object created for a class that has no profile yet: empty spec, our label."""
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "StorageProfile",
        "metadata": {
            "name": sc_name(sc),
            "labels": {"app.kubernetes.io/managed-by": "cdi-controller"},
        },
        "spec": {},
    }


def claim_property_sets(sc: SC, spec: StorageProfileSpec) -> list[dict[str, Any]]:
    if spec.claim_property_sets:
        return [s.to_dict() for s in spec.claim_property_sets]
    known = capabilities.capabilities(sc)
    return [c.to_dict() for c in known] if known else []


def clone_strategy(sc: SC, spec: StorageProfileSpec, snapshot_class: str | None = None) -> str:
    """``snapshot_class``: the VolumeSnapshotClass for the class's provisioner, if any."""
    annotated = ((sc.get("metadata") or {}).get("annotations") or {}).get(ANN_CLONE_STRATEGY)
    chosen = spec.clone_strategy or (annotated if annotated in CLONE_STRATEGIES else None)
    if chosen:
        return chosen
    strategy = capabilities.clone_strategy(sc) or (
        capabilities.SNAPSHOT if snapshot_class else capabilities.COPY
    )
    if strategy == capabilities.SNAPSHOT and not snapshot_class:
        return capabilities.COPY
    return strategy


def recognized(sc: SC) -> dict[str, str]:
    key = capabilities.provisioner_key(sc)
    if key == capabilities.UNKNOWN:
        status, reason, message = UNRECOGNIZED_PARAMETERS
    elif key in capabilities.KNOWN:
        status, reason, message = RECOGNIZED
    else:
        status, reason, message = UNRECOGNIZED
    return {"type": CONDITION_RECOGNIZED, "status": status, "reason": reason, "message": message}


def desired_status(
    sc: SC, spec: StorageProfileSpec, snapshot_class: str | None = None
) -> dict[str, Any]:
    """``status`` without condition timestamps; ``snapshot_class`` as in ``clone_strategy``."""
    status: dict[str, Any] = {
        "storageClass": sc_name(sc),
        "provisioner": str(sc.get("provisioner") or ""),
        "cloneStrategy": clone_strategy(sc, spec, snapshot_class),
        "dataImportCronSourceFormat": spec.data_import_cron_source_format or "pvc",
        "claimPropertySets": claim_property_sets(sc, spec),
        "conditions": [recognized(sc)],
    }
    if spec.snapshot_class:
        status["snapshotClass"] = spec.snapshot_class
    return status


def missing_annotations(sc: SC, annotations: Mapping[str, str]) -> dict[str, str]:
    """Annotations the profile should gain: the advised minimum claim size, unless one is set."""
    size = capabilities.minimum_pvc_size(sc)
    if size and ANN_MINIMUM_SUPPORTED_PVC_SIZE not in annotations:
        return {ANN_MINIMUM_SUPPORTED_PVC_SIZE: size}
    return {}


def is_complete(sets: tuple[ClaimPropertySet, ...]) -> bool:
    """Every set names access modes and a volume mode, and there is at least one."""
    return bool(sets) and all(s.access_modes and s.volume_mode for s in sets)


def profile_complete(profile: StorageProfile) -> bool:
    return is_complete(profile.status.claim_property_sets if profile.status else ())
