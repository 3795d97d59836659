"""The DataVolume kind (``cdi.kubevirt.io/v1beta1``) as frozen dataclasses.

Field for field this is CDI's ``API/types.go``: a manifest written for CDI parses here, and
``to_dict`` gives back the same JSON (minus empty lists/maps). The types only describe shape;
rules such as "exactly one source" or "size at least 1 MiB" live in ``cdi.webhooks.validation``
so the webhook can report them with CDI's messages, and derived facts (which source kind, which
claim spec) are small properties here so every layer asks the same question the same way.

``pvc`` and ``storage`` share one type, ``ClaimSpec``: CDI's ``StorageSpec`` is the PVC spec
with different defaulting, which is the renderer's business (``cdi.render.pvc``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cdi.api.codec import ApiObject, api_field
from cdi.api.constants import (
    API_VERSION,
    KIND_DATASOURCE,
    KIND_DATAVOLUME,
    ConditionStatus,
    ContentType,
    SourceKind,
    VolumeMode,
)
from cdi.api.quantity import Quantity

# --- metadata --------------------------------------------------------------------------------


@dataclass(frozen=True)
class OwnerReference(ApiObject):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = api_field(json="uid", default="")
    controller: bool | None = None
    block_owner_deletion: bool | None = None


@dataclass(frozen=True)
class ObjectMeta(ApiObject):
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    annotations: dict[str, str] = dataclasses.field(default_factory=dict)
    finalizers: tuple[str, ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()

    def controller_ref(self) -> OwnerReference | None:
        return next((ref for ref in self.owner_references if ref.controller), None)


# --- sources ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HTTPSource(ApiObject):
    url: str = ""
    secret_ref: str | None = None  # Secret with accessKeyId / secretKey (basic auth)
    cert_config_map: str | None = None  # ConfigMap of CA certificates
    extra_headers: tuple[str, ...] = ()  # "Name: value"
    secret_extra_headers: tuple[str, ...] = ()  # Secret names, each value one header
    checksum: str | None = None  # "algorithm:hex"
    insecure_skip_verify: bool | None = None


@dataclass(frozen=True)
class S3Source(ApiObject):
    url: str = ""
    secret_ref: str | None = None
    cert_config_map: str | None = None


@dataclass(frozen=True)
class GCSSource(ApiObject):
    url: str = ""
    secret_ref: str | None = None


@dataclass(frozen=True)
class Platform(ApiObject):
    architecture: str | None = None


@dataclass(frozen=True)
class RegistrySource(ApiObject):
    url: str | None = None  # docker:// or oci-archive://
    image_stream: str | None = None
    pull_method: str | None = None  # pod | node
    secret_ref: str | None = None
    cert_config_map: str | None = None
    platform: Platform | None = None


@dataclass(frozen=True)
class ObjectRef(ApiObject):
    """``{namespace, name}``: the PVC or VolumeSnapshot a clone reads from."""

    namespace: str = ""
    name: str = ""


@dataclass(frozen=True)
class EmptySource(ApiObject):
    """``upload: {}`` and ``blank: {}`` carry no fields; presence is the meaning."""


@dataclass(frozen=True)
class ImageIOSource(ApiObject):
    url: str = ""
    disk_id: str = ""
    secret_ref: str = ""
    cert_config_map: str = ""
    insecure_skip_verify: bool | None = None


@dataclass(frozen=True)
class VDDKSource(ApiObject):
    url: str = ""
    uuid: str = ""
    backing_file: str = ""
    thumbprint: str = ""
    secret_ref: str = ""
    cert_config_map: str | None = None
    init_image_url: str | None = api_field(json="initImageURL")
    extra_args: str | None = None


@dataclass(frozen=True)
class DataVolumeSource(ApiObject):
    """``spec.source``: exactly one member should be set (the webhook enforces it)."""

    http: HTTPSource | None = None
    s3: S3Source | None = None
    gcs: GCSSource | None = None
    registry: RegistrySource | None = None
    pvc: ObjectRef | None = None
    upload: EmptySource | None = None
    blank: EmptySource | None = None
    imageio: ImageIOSource | None = None
    vddk: VDDKSource | None = None
    snapshot: ObjectRef | None = None

    @property
    def kinds(self) -> tuple[SourceKind, ...]:
        """Which members are present, in declaration order."""
        return tuple(
            SourceKind(f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) is not None
        )

    @property
    def kind(self) -> SourceKind | None:
        """The single member present, or None when there are zero or several."""
        kinds = self.kinds
        return kinds[0] if len(kinds) == 1 else None


@dataclass(frozen=True)
class SourceRef(ApiObject):
    """``spec.sourceRef``: only ``kind: DataSource`` is supported (as in CDI)."""

    kind: str = ""
    name: str = ""
    namespace: str | None = None


# --- claim spec (pvc / storage) --------------------------------------------------------------


@dataclass(frozen=True)
class ResourceRequirements(ApiObject):
    requests: dict[str, Quantity] = dataclasses.field(default_factory=dict)
    limits: dict[str, Quantity] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class TypedObjectReference(ApiObject):
    """``dataSource`` (namespace unused) and ``dataSourceRef`` of a claim spec."""

    kind: str = ""
    name: str = ""
    api_group: str | None = None
    namespace: str | None = None


@dataclass(frozen=True)
class ClaimSpec(ApiObject):
    """``spec.pvc`` (used verbatim) or ``spec.storage`` (completed from the StorageProfile)."""

    access_modes: tuple[str, ...] = ()
    resources: ResourceRequirements | None = None
    storage_class_name: str | None = None
    volume_mode: str | None = None
    volume_name: str | None = None
    selector: dict[str, Any] | None = None
    data_source: TypedObjectReference | None = None
    data_source_ref: TypedObjectReference | None = None
    volume_attributes_class_name: str | None = None

    @property
    def requested_size(self) -> Quantity | None:
        return self.resources.requests.get("storage") if self.resources else None


@dataclass(frozen=True)
class Checkpoint(ApiObject):
    previous: str = api_field(default="", keep_empty=True)  # "" for the first checkpoint
    current: str = api_field(default="", keep_empty=True)


# --- spec / status / object ------------------------------------------------------------------


@dataclass(frozen=True)
class DataVolumeSpec(ApiObject):
    source: DataVolumeSource | None = None
    source_ref: SourceRef | None = None
    pvc: ClaimSpec | None = None
    storage: ClaimSpec | None = None
    priority_class_name: str | None = None
    service_account_name: str | None = None
    content_type: str | None = None  # kubevirt (default) | archive
    checkpoints: tuple[Checkpoint, ...] = ()
    final_checkpoint: bool | None = None
    preallocation: bool | None = None

    @property
    def claim(self) -> ClaimSpec | None:
        """The claim spec in use, ``pvc`` first (both set is a validation error)."""
        return self.pvc if self.pvc is not None else self.storage

    @property
    def effective_content_type(self) -> ContentType:
        return (
            ContentType.ARCHIVE
            if self.content_type == ContentType.ARCHIVE
            else (ContentType.KUBEVIRT)
        )

    @property
    def source_kind(self) -> SourceKind | None:
        return self.source.kind if self.source else None

    @property
    def is_clone(self) -> bool:
        kind = self.source_kind
        return self.source_ref is not None or kind in (SourceKind.PVC, SourceKind.SNAPSHOT)


@dataclass(frozen=True)
class Condition(ApiObject):
    type: str
    status: str = ConditionStatus.UNKNOWN
    reason: str | None = None
    message: str | None = None
    last_transition_time: str | None = None
    last_heartbeat_time: str | None = None


@dataclass(frozen=True)
class DataVolumeStatus(ApiObject):
    claim_name: str | None = None
    phase: str | None = None
    progress: str | None = None
    restart_count: int | None = None
    conditions: tuple[Condition, ...] = ()

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


@dataclass(frozen=True)
class DataVolume(ApiObject):
    metadata: ObjectMeta = dataclasses.field(default_factory=ObjectMeta)
    spec: DataVolumeSpec = dataclasses.field(default_factory=DataVolumeSpec)
    status: DataVolumeStatus | None = None
    api_version: str = API_VERSION
    kind: str = KIND_DATAVOLUME

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def namespace(self) -> str:
        return self.metadata.namespace

    @property
    def uid(self) -> str:
        return self.metadata.uid

    @property
    def annotations(self) -> dict[str, str]:
        return self.metadata.annotations


def resolve_volume_mode(mode: str | None) -> VolumeMode:
    """Kubernetes' default: anything but Block is a filesystem volume."""
    return VolumeMode.BLOCK if mode == VolumeMode.BLOCK else VolumeMode.FILESYSTEM


# --- DataSource ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSourceSource(ApiObject):
    """``spec.source`` of a DataSource: at most one of a PVC, a VolumeSnapshot or another
    DataSource (CDI allows one level of indirection), each ``{namespace, name}``."""

    pvc: ObjectRef | None = None
    snapshot: ObjectRef | None = None
    data_source: ObjectRef | None = None

    @property
    def empty(self) -> bool:
        return self.pvc is None and self.snapshot is None and self.data_source is None


@dataclass(frozen=True)
class DataSourceSpec(ApiObject):
    source: DataSourceSource = dataclasses.field(default_factory=DataSourceSource)


@dataclass(frozen=True)
class DataSourceStatus(ApiObject):
    """The resolved source (through a referenced DataSource) and the ``Ready`` condition."""

    source: DataSourceSource | None = None
    conditions: tuple[Condition, ...] = ()

    def condition(self, type_: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == type_), None)


@dataclass(frozen=True)
class DataSource(ApiObject):
    """A named pointer to a golden image (``cdi.kubevirt.io/v1beta1`` ``DataSource``)."""

    metadata: ObjectMeta = dataclasses.field(default_factory=ObjectMeta)
    spec: DataSourceSpec = dataclasses.field(default_factory=DataSourceSpec)
    status: DataSourceStatus | None = None
    api_version: str = API_VERSION
    kind: str = KIND_DATASOURCE
