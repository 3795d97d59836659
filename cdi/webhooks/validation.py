"""Admission rules for DataVolumes: a pure function from (new, old, cluster lookups) to a verdict.

``validate_datavolume`` answers what CDI's ``datavolume-validate.go`` answers, in the same order
and with the same messages (reference §6.5), so a user who knows CDI sees the same rejection:

 1. update that changes the spec (only checkpoint edits of a multi-stage imageio/vddk import
    pass): "Cannot update DataVolume Spec"
 2. name over 253 characters
 3. create over an existing PVC that may not be adopted: "Destination PVC ns/name already
    exists" (``allowClaimAdoption``, ``populatedFor`` and a PVC controlled by a DataVolume pass)
 4. neither or both of ``pvc`` / ``storage``
 5. size missing (allowed for ``storage`` clones), zero or negative, under 1 MiB; storage class
    name over 253 characters
 6. ``pvc`` access modes: none, several, or unknown; ``storage`` access modes: unknown
 7. external population (``dataSource``/``dataSourceRef``) and its required fields
 8. both or neither of ``source`` / ``sourceRef``; ``sourceRef`` kind and name, and on create the
    DataSource must exist
 9. zero or several sources
10. ``contentType`` not kubevirt/archive; blank with archive; registry with archive
11. http/s3/gcs/imageio/vddk URL empty, unparsable or with a bad scheme; http checksum format
12. registry URL XOR imageStream, URL scheme docker/oci-archive, pull method, imageStream rules
13. imageio and vddk required fields
14. pvc/snapshot clone source namespace and name; on create, a source PVC that exists must have
    the same content type and (``pvc`` API) not be larger than the target

Beyond CDI, things a user can get wrong that CDI only discovers later (or never), checked after
CDI's rules so CDI's message wins when both apply:

- a source URL with no host (``http:foo``) and a gs:// URL on a non-GCS source;
- ``extraHeaders`` entries that are not ``Name: value``;
- Secret/ConfigMap/priority class/service account names that are not DNS-1123 subdomains;
- ``volumeMode`` other than Block/Filesystem (and FromStorageProfile for ``storage``);
- contentType archive on a Block volume (CDI fails this only when rendering the PVC);
- checkpoints on a source other than imageio/vddk, or a checkpoint without ``current``.

Warnings (admitted, but told): credentials embedded in a source URL.

Deliberate difference: an UPDATE that leaves the spec unchanged is admitted without re-running
the spec rules. The spec was judged at creation; re-judging it on a label edit or a finalizer
removal could only wedge an object that already exists.

Cluster state comes through ``ClusterLookup`` (a Protocol the webhook server implements over
its informers), so this module stays pure and its table-driven tests need no cluster.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdi.api.codec import SchemaError
from cdi.api.config import claim_adoption_allowed
from cdi.api.constants import (
    ANN_ALLOW_CLAIM_ADOPTION,
    ANN_CONTENT_TYPE,
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_POPULATED_FOR,
    DATAVOLUME_CONTENT_TYPES,
    KIND_DATAVOLUME,
    MAX_NAME_LENGTH,
    MIN_VOLUME_SIZE,
    AccessMode,
    ContentType,
    SourceKind,
)
from cdi.api.types import DataVolume, DataVolumeSpec, ObjectRef
from cdi.render.placement import ANN_POD_NODE_SELECTOR, PlacementError, node_selector_annotation
from cdi.webhooks import sources as src
from cdi.webhooks.syntax import DNS1123_SUBDOMAIN_MSG, is_dns1123_subdomain
from cdi.webhooks.verdict import Cause, Causes, CauseType, ValidationResult

__all__ = [
    "Cause",
    "CauseType",
    "ClusterLookup",
    "StaticLookup",
    "ValidationResult",
    "validate_datavolume",
]


class ClusterLookup(Protocol):
    """Read-only cluster state the rules need; each returns the object as a dict, or None."""

    def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def get_data_source(self, namespace: str, name: str) -> Mapping[str, Any] | None: ...

    def claim_adoption_enabled(self) -> bool:
        """The ``DataVolumeClaimAdoption`` feature gate."""
        ...


@dataclass(frozen=True)
class StaticLookup:
    """A ``ClusterLookup`` over fixed objects keyed by ``(namespace, name)``."""

    pvcs: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    data_sources: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    adoption_enabled: bool = False

    def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pvcs.get((namespace, name))

    def get_data_source(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.data_sources.get((namespace, name))

    def claim_adoption_enabled(self) -> bool:
        return self.adoption_enabled


_ACCESS_MODES = '"ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"'


def validate_datavolume(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    ctx: ClusterLookup,
    *,
    namespace: str | None = None,
) -> ValidationResult:
    """Judge a DataVolume CREATE (``old`` is None) or UPDATE in ``namespace``: the admission
    request's, set by the API server; without one, the object's own."""
    try:
        dv = DataVolume.from_dict(new)
    except SchemaError as exc:
        return _reject([Cause(str(exc), exc.path)])
    ns = namespace or dv.namespace or ""
    if old is not None:
        verdict = _check_update(dv, old)
        if verdict is not None:
            return verdict
    causes = _first(
        lambda: _check_name(dv),
        lambda: [] if old is not None else _check_existing_claim(dv, ns, ctx),
        lambda: _check_spec(dv.spec, ns, ctx, creating=old is None),
        lambda: _check_extras(dv.spec),
        lambda: _check_placement(dv),
    )
    return ValidationResult(tuple(causes), tuple(src.warnings(dv.spec)))


def _check_placement(dv: DataVolume) -> Causes:
    """The per-DataVolume node selector (``cdi.render.placement``) is a JSON object of
    strings: a malformed one would otherwise be ignored by the renderers."""
    try:
        node_selector_annotation(dv.annotations)
    except PlacementError as exc:
        return [Cause(str(exc), f"metadata.annotations[{ANN_POD_NODE_SELECTOR}]")]
    return []


def _reject(causes: Causes) -> ValidationResult:
    return ValidationResult(tuple(causes))


def _first(*checks: Callable[[], Causes]) -> Causes:
    """Run checks in order and stop at the first that finds something (CDI's early return)."""
    for check in checks:
        causes = check()
        if causes:
            return causes
    return []


# --- 1-3: update, name, existing claim -------------------------------------------------------


def _check_update(dv: DataVolume, old: Mapping[str, Any]) -> ValidationResult | None:
    """None means "go on validating"; a result means the verdict is already known."""
    try:
        old_spec = DataVolume.from_dict(old).spec
    except SchemaError:
        old_spec = None
    if old_spec == dv.spec:
        return ValidationResult()
    if old_spec is not None and _only_checkpoints_changed(old_spec, dv.spec):
        return None
    return _reject([Cause("Cannot update DataVolume Spec", "DataVolume.Spec", CauseType.DUPLICATE)])


def _only_checkpoints_changed(old: DataVolumeSpec, new: DataVolumeSpec) -> bool:
    multi_stage = bool(new.checkpoints) and new.source_kind in (SourceKind.VDDK, SourceKind.IMAGEIO)
    strip = {"checkpoints": (), "final_checkpoint": None}
    return multi_stage and _replace(old, strip) == _replace(new, strip)


def _replace(spec: DataVolumeSpec, changes: dict[str, Any]) -> DataVolumeSpec:
    return dataclasses.replace(spec, **changes)


def _check_name(dv: DataVolume) -> Causes:
    if len(dv.name) > MAX_NAME_LENGTH:
        return [Cause(f"Name cannot be longer than {MAX_NAME_LENGTH} characters")]
    return []


def _check_existing_claim(dv: DataVolume, namespace: str, ctx: ClusterLookup) -> Causes:
    if not dv.name:
        return []
    pvc = ctx.get_pvc(namespace, dv.name)
    if pvc is None or _claim_may_exist(dv, pvc, ctx):
        return []
    meta = pvc.get("metadata") or {}
    owner = next((r for r in meta.get("ownerReferences") or () if r.get("controller")), None)
    if owner is not None and owner.get("kind") == KIND_DATAVOLUME:
        return []
    message = f"Destination PVC {meta.get('namespace', namespace)}/{dv.name} already exists"
    return [Cause(message, "DataVolume.Name", CauseType.DUPLICATE)]


def _claim_may_exist(dv: DataVolume, pvc: Mapping[str, Any], ctx: ClusterLookup) -> bool:
    """CDI's ``ClaimMayExistBeforeDataVolume``: populated for this DV, or adoption allowed."""
    annotations = (pvc.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANN_POPULATED_FOR) == dv.name:
        return True
    if dv.uid and annotations.get(ANN_CREATED_FOR_DATAVOLUME) == dv.uid:
        return False
    return claim_adoption_allowed(
        dv.annotations.get(ANN_ALLOW_CLAIM_ADOPTION), ctx.claim_adoption_enabled
    )


# --- 4-7: target claim -----------------------------------------------------------------------


def _check_spec(spec: DataVolumeSpec, ns: str, ctx: ClusterLookup, *, creating: bool) -> Causes:
    return _first(
        lambda: _check_claim_presence(spec),
        lambda: _check_size(spec),
        lambda: _check_storage_class_name(spec),
        lambda: _check_access_modes(spec),
        # An externally populated claim ends the spec rules, admitted or not (as in CDI).
        lambda: (
            _check_external_population(spec)
            if _externally_populated(spec)
            else _check_source_choice(spec, ns, ctx, creating=creating)
        ),
    )


def _externally_populated(spec: DataVolumeSpec) -> bool:
    claim = spec.claim
    return claim is not None and (
        claim.data_source is not None or claim.data_source_ref is not None
    )


def _check_claim_presence(spec: DataVolumeSpec) -> Causes:
    if spec.pvc is None and spec.storage is None:
        return [Cause("Missing Data volume PVC", "spec.PVC")]
    if spec.pvc is not None and spec.storage is not None:
        return [
            Cause(
                "Duplicate storage definition, both target storage and target pvc defined",
                "spec.PVC.Storage",
            )
        ]
    return []


def _check_size(spec: DataVolumeSpec) -> Causes:
    name = "PVC" if spec.pvc is not None else "Storage"
    claim = spec.claim
    size = claim.requested_size if claim else None
    path = f"spec.{name}.resources.requests.size"
    if size is None:
        if spec.storage is not None and spec.is_clone:
            return []  # the clone source tells the size
        return [Cause(f"{name} size is missing", path)]
    if size.is_zero() or size.value() < 0:
        return [Cause(f"{name} size can't be equal or less than zero", path)]
    if size.amount < MIN_VOLUME_SIZE:
        return [Cause(f"{name} size should be at least 1MiB", path)]
    return []


def _check_storage_class_name(spec: DataVolumeSpec) -> Causes:
    claim = spec.claim
    if claim and claim.storage_class_name and len(claim.storage_class_name) > MAX_NAME_LENGTH:
        return [Cause(f"Name cannot be longer than {MAX_NAME_LENGTH} characters")]
    return []


def _check_access_modes(spec: DataVolumeSpec) -> Causes:
    path = "spec.PVC.accessModes"
    if spec.pvc is not None:
        modes = spec.pvc.access_modes
        if not modes:
            return [Cause("Required value: at least 1 access mode is required", path)]
        if len(modes) > 1:
            return [Cause("PVC multiple accessModes", path)]
    else:
        modes = spec.storage.access_modes if spec.storage else ()
    for mode in modes:
        if mode not in tuple(AccessMode):
            return [Cause(f'Unsupported value: "{mode}": supported values: {_ACCESS_MODES}', path)]
    return []


def _check_external_population(spec: DataVolumeSpec) -> Causes:
    claim = spec.claim
    assert claim is not None
    causes: Causes = []
    if spec.source is not None or spec.source_ref is not None:
        causes.append(
            Cause("External population is incompatible with Source and SourceRef", "spec.source")
        )
    ds, ref = claim.data_source, claim.data_source_ref
    if ds is not None and ref is not None and not src.same_reference(ds, ref):
        causes.append(Cause("DataSourceRef and DataSource must match"))
    if ds is not None:
        causes += src.typed_reference_causes(ds, "DataSource", "spec.dataSource")
    if ref is not None:
        causes += src.typed_reference_causes(ref, "DataSourceRef", "spec.dataSourceRef")
    return causes


# --- 8-14: source -----------------------------------------------------------------------------


def _check_source_choice(
    spec: DataVolumeSpec, ns: str, ctx: ClusterLookup, *, creating: bool
) -> Causes:
    if (spec.source is None) == (spec.source_ref is None):
        return [
            Cause(
                "Data volume should have either Source or SourceRef, or be externally populated",
                "spec.source",
            )
        ]
    if spec.source_ref is not None:
        return _check_source_ref(spec, ns, ctx, creating=creating)
    return _first(
        lambda: _check_source_count(spec),
        lambda: _check_content_type(spec),
        lambda: src.import_source_causes(spec),
        lambda: _check_clone_source(spec, ctx, creating=creating),
    )


def _check_source_ref(
    spec: DataVolumeSpec, ns: str, ctx: ClusterLookup, *, creating: bool
) -> Causes:
    ref = spec.source_ref
    assert ref is not None
    if not ref.kind:
        return [Cause("Missing sourceRef kind", "spec.sourceRef.Kind")]
    if ref.kind != "DataSource":
        return [
            Cause(
                f"Unsupported sourceRef kind {ref.kind}, currently only DataSource is supported",
                "spec.sourceRef.Kind",
            )
        ]
    if not ref.name:
        return [Cause("Missing sourceRef name", "spec.sourceRef.Name")]
    if not creating:
        return []
    ref_ns = ref.namespace or ns
    data_source = ctx.get_data_source(ref_ns, ref.name)
    if data_source is None:
        return [
            Cause(
                f"SourceRef {ref.kind}/{ref_ns}/{ref.name} not found",
                "spec.sourceRef",
                CauseType.NOT_FOUND,
            )
        ]
    source = (data_source.get("spec") or {}).get("source") or {}
    inner = source.get("dataSource")
    if isinstance(inner, dict) and inner.get("name"):  # one reference deep, as CDI resolves it
        referenced = ctx.get_data_source(ref_ns, str(inner["name"])) or {}
        source = (referenced.get("spec") or {}).get("source") or {}
    if source.get("pvc"):
        pvc = ObjectRef.from_dict(source["pvc"], "spec.source.pvc")
        return _check_source_pvc(spec, pvc, ctx, "spec.sourceRef")
    if source.get("snapshot"):
        return []
    return [
        Cause(
            f"Empty source field in '{ref.name}'. DataSource may not be ready yet", "spec.sourceRef"
        )
    ]


def _check_source_count(spec: DataVolumeSpec) -> Causes:
    count = len(spec.source.kinds) if spec.source else 0
    if count == 0:
        return [Cause("Missing Data volume source", "spec.source")]
    if count > 1:
        return [Cause("Multiple Data volume sources", "spec.source")]
    return []


def _check_content_type(spec: DataVolumeSpec) -> Causes:
    if spec.content_type not in (None, "", *DATAVOLUME_CONTENT_TYPES):
        return [Cause("ContentType not one of: kubevirt, archive", "spec.contentType")]
    return []


def _check_clone_source(spec: DataVolumeSpec, ctx: ClusterLookup, *, creating: bool) -> Causes:
    source = spec.source
    assert source is not None
    for ref, label, path in (
        (source.pvc, "PVC", "spec.source.PVC"),
        (source.snapshot, "snapshot", "spec.source.Snapshot"),
    ):
        if ref is not None and (not ref.namespace or not ref.name):
            return [Cause(f"{path} source {label} is not valid", path)]
    if creating and source.pvc is not None:
        return _check_source_pvc(spec, source.pvc, ctx, "spec.source.PVC")
    return []


def _check_source_pvc(
    spec: DataVolumeSpec, ref: ObjectRef, ctx: ClusterLookup, path: str
) -> Causes:
    """A clone source that exists must match; one that does not yet exist is fine (CDI waits)."""
    pvc = ctx.get_pvc(ref.namespace, ref.name)
    if pvc is None:
        return []
    annotations = (pvc.get("metadata") or {}).get("annotations") or {}
    source_type = (
        ContentType.ARCHIVE
        if annotations.get(ANN_CONTENT_TYPE) == ContentType.ARCHIVE
        else ContentType.KUBEVIRT
    )
    target_type = spec.effective_content_type
    if source_type != target_type:
        return [
            Cause(
                f"Source contentType ({source_type}) and target contentType "
                f"({target_type}) do not match",
                path,
            )
        ]
    return src.clone_size_causes(spec, pvc, path)


# --- beyond CDI ---------------------------------------------------------------------------------


def _check_extras(spec: DataVolumeSpec) -> Causes:
    causes = src.extra_source_causes(spec)
    causes += src.volume_mode_causes(spec)
    for value, path in (
        (spec.priority_class_name, "spec.priorityClassName"),
        (spec.service_account_name, "spec.serviceAccountName"),
    ):
        if value and not is_dns1123_subdomain(value):
            causes.append(Cause(f'{path}: Invalid value: "{value}": {DNS1123_SUBDOMAIN_MSG}', path))
    return causes
