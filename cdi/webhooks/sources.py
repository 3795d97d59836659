"""Per-source admission rules (steps 10-13 of ``validation``) and the checks CDI lacks.

One function per source kind, called in CDI's order (http, s3, gcs, blank, registry, imageio,
vddk), each returning CDI's message for the first thing wrong. The "beyond CDI" checks live here
too because they are about the same fields; ``validation`` runs them after all of CDI's rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.checksum import Checksum, ChecksumFormatError
from cdi.api.constants import (
    REGISTRY_SCHEMES,
    ContentType,
    RegistryPullMethod,
    SourceKind,
    VolumeMode,
)
from cdi.api.quantity import Quantity, QuantityError
from cdi.api.types import (
    DataVolumeSource,
    DataVolumeSpec,
    HTTPSource,
    ImageIOSource,
    RegistrySource,
    TypedObjectReference,
    VDDKSource,
)
from cdi.webhooks.syntax import (
    DNS1123_SUBDOMAIN_MSG,
    URLError,
    is_dns1123_subdomain,
    is_header_line,
    parse_request_uri,
    parse_url,
)
from cdi.webhooks.verdict import Cause, Causes

_WEB_SCHEMES = ("http", "https")
_GCS_SCHEMES = ("gs", "http", "https")


def import_source_causes(spec: DataVolumeSpec) -> Causes:
    source = spec.source
    assert source is not None
    if source.http is not None:
        return _http_causes(source.http)
    if source.s3 is not None:
        return source_url_causes(source.s3.url, "S3")
    if source.gcs is not None:
        return source_url_causes(source.gcs.url, "GCS", _GCS_SCHEMES)
    if source.blank is not None and spec.content_type == ContentType.ARCHIVE:
        return [
            Cause("SourceType cannot be blank and the contentType be archive", "spec.contentType")
        ]
    if source.registry is not None:
        return _registry_causes(source.registry, spec.content_type)
    if source.imageio is not None:
        return _imageio_causes(source.imageio)
    if source.vddk is not None:
        return _vddk_causes(source.vddk)
    return []


def source_url_causes(url: str, kind: str, schemes: tuple[str, ...] = _WEB_SCHEMES) -> Causes:
    """CDI's ``validateSourceURL``, plus: a host is required and gs:// only for GCS."""
    field = f"spec.source.{kind}.url"
    if not url:
        return [Cause("spec.source source URL is empty", field)]
    try:
        parsed = parse_request_uri(url)
    except URLError:
        return [Cause(f"spec.source Invalid source URL: {url}", field)]
    if parsed.scheme not in schemes:
        return [Cause(f"spec.source Invalid source URL scheme: {url}", field)]
    if not parsed.host:
        return [Cause(f"spec.source Invalid source URL: {url}", field)]
    return []


def _http_causes(http: HTTPSource) -> Causes:
    causes = source_url_causes(http.url, "HTTP")
    if causes or not http.checksum:
        return causes  # CDI: an empty checksum means "none" (its docs write `checksum: ""`)
    try:
        Checksum.parse(http.checksum)
    except ChecksumFormatError as exc:
        return [Cause(f"Invalid checksum format: {exc}", "spec.source.HTTP.checksum")]
    return []


def _registry_causes(registry: RegistrySource, content_type: str | None) -> Causes:
    if content_type not in (None, "", ContentType.KUBEVIRT):
        return [Cause("ContentType must be kubevirt when Source is Registry", "spec.contentType")]
    field = "spec.source.Registry"
    if (registry.url is None) == (registry.image_stream is None):
        return [Cause("Source registry should have either URL or ImageStream", field)]
    if registry.url is not None:
        try:
            scheme = parse_url(registry.url).scheme
        except URLError:
            return [Cause(f"Illegal registry source URL {registry.url}", f"{field}.URL")]
        if scheme not in REGISTRY_SCHEMES:
            return [Cause(f"Illegal registry source URL scheme {registry.url}", f"{field}.URL")]
    method = registry.pull_method
    if method not in (None, "", *tuple(RegistryPullMethod)):
        return [Cause(f'ImportMethod {method} is neither pod, node or ""', f"{field}.importMethod")]
    if registry.image_stream == "":
        return [Cause("Source registry ImageStream is not valid", f"{field}.importMethod")]
    if registry.image_stream is not None and method != RegistryPullMethod.NODE:
        return [
            Cause(
                "Source registry ImageStream is supported only with node pull import method",
                f"{field}.importMethod",
            )
        ]
    if method == RegistryPullMethod.NODE:
        return _node_pull_causes(registry, f"{field}.pullMethod")
    return []


# Not CDI: an OpenShift ImageStream is resolved to an image by OpenShift's image lookup
# (CDI annotates the pod for it); plain Kubernetes has none, so the kubelet could not pull it.
IMAGE_STREAM_UNSUPPORTED = (
    "Source registry ImageStream is not supported: it needs OpenShift's image lookup; "
    "use a docker:// URL"
)
NODE_PULL_NEEDS_DOCKER = "pullMethod node needs a docker:// registry URL: the kubelet pulls it"
NODE_PULL_IGNORES = (
    "spec.source.registry: with pullMethod node the kubelet pulls the image with the node's "
    "registry configuration; secretRef and certConfigMap are not used"
)


def _node_pull_causes(registry: RegistrySource, field: str) -> Causes:
    """Node pull: the kubelet pulls ``url`` as a container image, so only docker:// works."""
    if registry.image_stream is not None:
        return [Cause(IMAGE_STREAM_UNSUPPORTED, field)]
    if not (registry.url or "").startswith("docker://"):
        return [Cause(NODE_PULL_NEEDS_DOCKER, field)]
    return []


def _imageio_causes(imageio: ImageIOSource) -> Causes:
    field = "spec.source.Imageio"
    if not imageio.secret_ref or not imageio.disk_id:
        return [Cause(f"{field} source Imageio is not valid", field)]
    if not imageio.cert_config_map and not imageio.insecure_skip_verify:
        return [
            Cause(f"{field} source Imageio requires CertConfigMap or InsecureSkipVerify", field)
        ]
    return source_url_causes(imageio.url, "ImageIO")


def _vddk_causes(vddk: VDDKSource) -> Causes:
    field = "spec.source.VDDK"
    if not (vddk.secret_ref and vddk.uuid and vddk.backing_file and vddk.thumbprint):
        return [Cause(f"{field} source VDDK is not valid", field)]
    return source_url_causes(vddk.url, "VDDK")


def same_reference(a: TypedObjectReference, b: TypedObjectReference) -> bool:
    return (a.api_group or "", a.kind, a.name) == (b.api_group or "", b.kind, b.name) and (
        not b.namespace
    )


def typed_reference_causes(ref: TypedObjectReference, label: str, path: str) -> Causes:
    """CDI's ``validateDataSource`` / ``validateDataSourceRef``: every problem, not the first."""
    causes: Causes = []
    if label == "DataSourceRef" and ref.namespace:
        causes.append(
            Cause("Invalid value: DataSourceRef namespace not supported", f"{path}.namespace")
        )
    if not ref.name:
        causes.append(Cause(f"Required value: {label} name", f"{path}.name"))
    if not ref.kind:
        causes.append(Cause(f"Required value: {label} kind", f"{path}.kind"))
    if not ref.api_group and ref.kind != "PersistentVolumeClaim":
        causes.append(
            Cause(
                f"Required value: {label} apiGroup when kind is not 'PersistentVolumeClaim'",
                f"{path}.apiGroup",
            )
        )
    return causes


def clone_size_causes(spec: DataVolumeSpec, source_pvc: Mapping[str, Any], path: str) -> Causes:
    """With the ``pvc`` API the target must be at least as large as the source's request."""
    target = spec.pvc.requested_size if spec.pvc else None
    raw = ((source_pvc.get("spec") or {}).get("resources") or {}).get("requests", {}).get("storage")
    if target is None or raw is None:
        return []
    try:
        source = Quantity.parse(raw)
    except QuantityError:
        return []
    if source.value() > target.value():
        return [
            Cause(
                "target resources requests storage size is smaller than the source "
                f"{target.value()} < {source.value()}",
                path,
            )
        ]
    return []


# --- beyond CDI -------------------------------------------------------------------------------


def extra_source_causes(spec: DataVolumeSpec) -> Causes:
    causes: Causes = []
    if spec.source is not None:
        causes += _reference_name_causes(spec.source)
        if spec.source.http is not None:
            causes += _header_causes(spec.source.http)
    causes += _checkpoint_causes(spec)
    return causes


def _reference_name_causes(source: DataVolumeSource) -> Causes:
    causes: Causes = []
    for kind in source.kinds:
        member = getattr(source, kind.value)
        for attr, key in (("secret_ref", "secretRef"), ("cert_config_map", "certConfigMap")):
            causes += name_causes(getattr(member, attr, None), f"spec.source.{kind}.{key}")
    if source.http is not None:
        for i, name in enumerate(source.http.secret_extra_headers):
            causes += name_causes(name, f"spec.source.http.secretExtraHeaders[{i}]")
    return causes


def name_causes(name: str | None, path: str) -> Causes:
    if name and not is_dns1123_subdomain(name):
        return [Cause(f'{path}: Invalid value: "{name}": {DNS1123_SUBDOMAIN_MSG}', path)]
    return []


def _header_causes(http: HTTPSource) -> Causes:
    return [
        Cause(
            f'spec.source.http.extraHeaders[{i}]: Invalid value: "{line}": must be "Name: value"',
            f"spec.source.http.extraHeaders[{i}]",
        )
        for i, line in enumerate(http.extra_headers)
        if not is_header_line(line)
    ]


def _checkpoint_causes(spec: DataVolumeSpec) -> Causes:
    if not spec.checkpoints:
        return []
    if spec.source_kind not in (SourceKind.IMAGEIO, SourceKind.VDDK):
        return [
            Cause(
                "Checkpoints are only supported with imageio and vddk sources", "spec.checkpoints"
            )
        ]
    return [
        Cause(f"spec.checkpoints[{i}].current: Required value", f"spec.checkpoints[{i}]")
        for i, cp in enumerate(spec.checkpoints)
        if not cp.current
    ]


def volume_mode_causes(spec: DataVolumeSpec) -> Causes:
    claim, name = (spec.pvc, "pvc") if spec.pvc is not None else (spec.storage, "storage")
    if claim is None or claim.volume_mode is None:
        return []
    allowed = [VolumeMode.BLOCK, VolumeMode.FILESYSTEM]
    if name == "storage":
        allowed.append(VolumeMode.FROM_STORAGE_PROFILE)
    path = f"spec.{name}.volumeMode"
    if claim.volume_mode not in allowed:
        values = ", ".join(f'"{v}"' for v in allowed)
        return [
            Cause(
                f'{path}: Unsupported value: "{claim.volume_mode}": supported values: {values}',
                path,
            )
        ]
    if claim.volume_mode == VolumeMode.BLOCK and spec.content_type == ContentType.ARCHIVE:
        return [Cause("DataVolume with ContentType Archive cannot have block volumeMode", path)]
    return []


def warnings(spec: DataVolumeSpec) -> list[str]:
    """Admitted but worth saying: credentials written into a URL end up in the object; a node
    pull does not use the registry Secret and CA the DataVolume names."""
    out: list[str] = []
    source = spec.source
    reg = source.registry if source else None
    if (
        reg
        and reg.pull_method == RegistryPullMethod.NODE
        and (reg.secret_ref or reg.cert_config_map)
    ):
        out.append(NODE_PULL_IGNORES)
    for kind in source.kinds if source else ():
        url = getattr(getattr(source, kind.value), "url", None)
        if not url:
            continue
        try:
            parsed = parse_url(url)
        except URLError:
            continue
        if parsed.userinfo:
            out.append(
                f"spec.source.{kind}.url contains credentials; store them in a Secret and "
                "reference it with secretRef"
            )
    return out
