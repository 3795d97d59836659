"""What each import source contributes to the importer pod: one function per source kind.

``importer_pod`` lays out the pod; this module answers "for *this* source, which endpoint, which
Secret and CA ConfigMap to mount, which headers and extra variables". Clone, snapshot and upload
sources have no importer and raise ``RenderError``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from urllib.parse import urlsplit

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    IMPORT_SOURCE_GCS,
    IMPORT_SOURCE_HTTP,
    IMPORT_SOURCE_IMAGEIO,
    IMPORT_SOURCE_NONE,
    IMPORT_SOURCE_REGISTRY,
    IMPORT_SOURCE_S3,
    IMPORT_SOURCE_VDDK,
    NODE_PULL_SHARED_DIR,
    ImporterEnv,
    RegistryPullMethod,
)
from cdi.api.types import DataVolume, DataVolumeSource, RegistrySource
from cdi.render import RenderError

EnvPairs = tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class SourceSettings:
    source: str
    endpoint: str | None = None
    insecure_tls: bool = False
    secret_ref: str | None = None  # Secret with accessKeyId / secretKey
    cert_config_map: str | None = None
    headers: tuple[str, ...] = ()
    secret_headers: tuple[str, ...] = ()
    extra_env: EnvPairs = ()
    node_pull_image: str | None = None  # pullMethod node: the image the kubelet runs beside
    node_arch: str | None = None  # pullMethod node: platform.architecture, a nodeSelector


def source_settings(dv: DataVolume, cdi_config: CDIConfig) -> SourceSettings:
    source = dv.spec.source
    if source is None or source.kind is None:
        raise RenderError("DataVolume has no single import source")
    render = _RENDERERS.get(source.kind.value)
    if render is None:
        raise RenderError(f"source {source.kind.value} is not imported by an importer pod")
    settings = render(source, cdi_config)
    return replace(settings, extra_env=settings.extra_env + _policy_env(cdi_config))


def _policy_env(cdi_config: CDIConfig) -> EnvPairs:
    """CDIConfig ``importPolicy`` for the importer's network checks (``cdi.api.netpolicy``)."""
    policy = cdi_config.import_policy
    return (
        (ImporterEnv.ALLOWED_SOURCE_CIDRS, ",".join(policy.allowed_source_cidrs) or None),
        (ImporterEnv.CLUSTER_CIDRS, ",".join(policy.cluster_cidrs) or None),
    )


def _http(source: DataVolumeSource, _: CDIConfig) -> SourceSettings:
    http = source.http
    assert http is not None
    return SourceSettings(
        IMPORT_SOURCE_HTTP,
        http.url,
        bool(http.insecure_skip_verify),
        http.secret_ref,
        http.cert_config_map,
        http.extra_headers,
        http.secret_extra_headers,
        ((ImporterEnv.CHECKSUM, http.checksum),),
    )


def _s3(source: DataVolumeSource, _: CDIConfig) -> SourceSettings:
    s3 = source.s3
    assert s3 is not None
    return SourceSettings(
        IMPORT_SOURCE_S3, s3.url, secret_ref=s3.secret_ref, cert_config_map=s3.cert_config_map
    )


def _gcs(source: DataVolumeSource, _: CDIConfig) -> SourceSettings:
    gcs = source.gcs
    assert gcs is not None
    return SourceSettings(IMPORT_SOURCE_GCS, gcs.url, secret_ref=gcs.secret_ref)


def _registry(source: DataVolumeSource, cdi_config: CDIConfig) -> SourceSettings:
    reg = source.registry
    assert reg is not None
    arch = reg.platform.architecture if reg.platform else None
    if reg.pull_method == RegistryPullMethod.NODE:
        return _node_pull(reg, arch)
    return SourceSettings(
        IMPORT_SOURCE_REGISTRY,
        reg.url or reg.image_stream,
        insecure_tls=_insecure_registry(reg, cdi_config),
        secret_ref=reg.secret_ref,
        cert_config_map=reg.cert_config_map,
        extra_env=(
            (ImporterEnv.PULL_METHOD, reg.pull_method or RegistryPullMethod.POD),
            (ImporterEnv.REGISTRY_IMAGE_ARCHITECTURE, arch),
        ),
    )


def _node_pull(reg: RegistrySource, arch: str | None) -> SourceSettings:
    """The kubelet pulls with the node's registry settings: no Secret, CA or insecure flag
    reaches the pod (admission warns); the platform is the node's, chosen by a nodeSelector."""
    url = reg.url or ""
    if not url.startswith("docker://"):
        raise RenderError("pullMethod node needs a docker:// registry URL")
    return SourceSettings(
        IMPORT_SOURCE_REGISTRY,
        url,
        extra_env=(
            (ImporterEnv.PULL_METHOD, str(RegistryPullMethod.NODE)),
            (ImporterEnv.READY_FILE, f"{NODE_PULL_SHARED_DIR}/ready"),
            (ImporterEnv.DONE_FILE, f"{NODE_PULL_SHARED_DIR}/done"),
        ),
        node_pull_image=url.removeprefix("docker://"),
        node_arch=arch,
    )


def _insecure_registry(reg: RegistrySource, cdi_config: CDIConfig) -> bool:
    """CDIConfig ``insecureRegistries`` lists hosts (with port) that skip TLS verification."""
    if not reg.url:
        return False
    host = urlsplit(reg.url).netloc
    return bool(host) and host in cdi_config.spec.insecure_registries


def _imageio(source: DataVolumeSource, _: CDIConfig) -> SourceSettings:
    io = source.imageio
    assert io is not None
    return SourceSettings(
        IMPORT_SOURCE_IMAGEIO,
        io.url,
        bool(io.insecure_skip_verify),
        io.secret_ref or None,
        io.cert_config_map or None,
        extra_env=((ImporterEnv.DISK_ID, io.disk_id),),
    )


def _vddk(source: DataVolumeSource, _: CDIConfig) -> SourceSettings:
    vddk = source.vddk
    assert vddk is not None
    return SourceSettings(
        IMPORT_SOURCE_VDDK,
        vddk.url,
        insecure_tls=not vddk.cert_config_map,
        secret_ref=vddk.secret_ref or None,
        cert_config_map=vddk.cert_config_map,
        extra_env=(
            (ImporterEnv.UUID, vddk.uuid),
            (ImporterEnv.BACKING_FILE, vddk.backing_file),
            (ImporterEnv.THUMBPRINT, vddk.thumbprint),
        ),
    )


def _blank(_: DataVolumeSource, __: CDIConfig) -> SourceSettings:
    return SourceSettings(IMPORT_SOURCE_NONE)


_RENDERERS = {
    "http": _http,
    "s3": _s3,
    "gcs": _gcs,
    "registry": _registry,
    "imageio": _imageio,
    "vddk": _vddk,
    "blank": _blank,
}
