"""Admission rules of the populator sources (CDI ``populators-validate.go``), pure.

A ``VolumeImportSource`` is read by the controller when it creates a prime claim, possibly long
after it was written, so what it says must be checked when it is written: exactly one source,
a content type CDI knows, each source's own rules (the DataVolume's, ``cdi.webhooks.sources``:
URLs and schemes, checksum format, registry rules), a target claim for a multi-stage import.
Its spec never changes after creation ("Cannot update VolumeImportSource Spec"): a claim being
filled from it must not see its source move underneath.

A ``VolumeUploadSource`` says only how to treat the upload: its content type must be one CDI
knows (``""``, ``kubevirt``, ``archive``); its spec is immutable too ("Cannot update
VolumeUploadSource Spec"). A ``VolumeCloneSource`` names a claim (kind
``PersistentVolumeClaim``, a name) in its own namespace; snapshots are refused (this cluster
serves no snapshot API) and so is a change of its spec.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.codec import SchemaError
from cdi.api.constants import (
    DATAVOLUME_CONTENT_TYPES,
    KIND_VOLUME_CLONE_SOURCE,
    KIND_VOLUME_IMPORT_SOURCE,
    KIND_VOLUME_UPLOAD_SOURCE,
)
from cdi.api.types import DataVolumeSource, DataVolumeSpec
from cdi.webhooks.sources import import_source_causes
from cdi.webhooks.verdict import Cause, Causes, ValidationResult

POPULATOR_KINDS = (KIND_VOLUME_IMPORT_SOURCE, KIND_VOLUME_UPLOAD_SOURCE, KIND_VOLUME_CLONE_SOURCE)
CLAIM_KIND = "PersistentVolumeClaim"


def validate_populator(
    new: Mapping[str, Any], old: Mapping[str, Any] | None = None
) -> ValidationResult:
    """The verdict on a populator source being created (``old`` None) or updated."""
    kind = str(new.get("kind") or "")
    if kind not in POPULATOR_KINDS:
        return ValidationResult()
    spec = new.get("spec") or {}
    if old is not None and (old.get("spec") or {}) != spec:
        return ValidationResult((Cause(f"Cannot update {kind} Spec", "spec"),))
    if kind == KIND_VOLUME_UPLOAD_SOURCE:
        return ValidationResult(tuple(content_type_causes(spec)))
    if kind == KIND_VOLUME_CLONE_SOURCE:
        return ValidationResult(tuple(clone_source_spec_causes(spec)))
    return ValidationResult(tuple(import_source_spec_causes(spec)))


def content_type_causes(spec: Mapping[str, Any]) -> Causes:
    if spec.get("contentType") not in (None, "", *DATAVOLUME_CONTENT_TYPES):
        return [Cause("ContentType not one of: kubevirt, archive", "spec.contentType")]
    return []


def clone_source_spec_causes(spec: Mapping[str, Any]) -> Causes:
    source = spec.get("source")
    if not isinstance(source, Mapping) or not source.get("name"):
        return [Cause("Missing clone source", "spec.source")]
    if source.get("kind") != CLAIM_KIND or source.get("apiGroup") not in (None, ""):
        return [Cause(f"Unsupported clone source kind {source.get('kind')!r}", "spec.source.kind")]
    return []


def import_source_spec_causes(spec: Mapping[str, Any]) -> Causes:
    if causes := content_type_causes(spec):
        return causes
    content_type = spec.get("contentType")
    try:
        source = DataVolumeSource.from_dict(spec.get("source") or {})
    except SchemaError as exc:
        return [Cause(f"Invalid import source: {exc}", "spec.source")]
    count = len(source.kinds)
    if count == 0:
        return [Cause("Missing import source", "spec.source")]
    if count > 1:
        return [Cause("Multiple import sources", "spec.source")]
    if source.pvc is not None or source.snapshot is not None or source.upload is not None:
        return [Cause("Unsupported import source", "spec.source")]
    if spec.get("checkpoints") and not spec.get("targetClaim"):
        message = "Unable to do multi-stage import without specifying a target claim"
        return [Cause(message, "spec.targetClaim")]
    return import_source_causes(DataVolumeSpec(source=source, content_type=content_type))
