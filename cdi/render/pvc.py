"""Render the PersistentVolumeClaim a DataVolume asks for (CDI ``renderPvcSpec``, reference §1.3).

``spec.pvc`` is copied as written. ``spec.storage`` is completed the way CDI completes it:

- contentType archive forces Filesystem (Block is an error);
- the storage class is the one named, else the class of the StorageProfile passed in (the
  caller resolves the default class; we set it explicitly so the overhead below is the one
  that applies);
- missing access modes / volume mode come from the profile's ``claimPropertySets``: with a
  volume mode, the first set of that mode; with access modes, the first set holding them all;
  with neither, the first set;
- the size must be at least 1 MiB; a Filesystem claim is inflated for filesystem overhead as
  CDI's ``GetRequiredSpace`` does: ``ceil(RoundUp(size, 1MiB) / (1 - overhead))``. (The
  reference's "* (1 + overhead)" is not what CDI computes; we match CDI's bytes.) Then it is
  raised to the profile's ``cdi.kubevirt.io/minimumSupportedPvcSize``;
- a clone may omit the size (the source decides later); an import may not.

The claim is named after the DataVolume, owned by it (``cdi.render.owner``), labelled
``app: containerized-data-importer`` and annotated with CDI's bookkeeping annotations
(``storage.import.*`` describe the source, as ``kubectl describe pvc`` users expect).

The PVC's annotations are the controller's durable record (``cdi.controller.record``), so a
DataVolume's own annotations reach it through an allow-list, not a deny-list: annotations
outside CDI's domain (``*cdi.kubevirt.io/``) and the CDI annotations its documentation calls
user-settable (``USER_SETTABLE``). Anything else in CDI's domain a tenant writes on a DataVolume
(``storage.pod.phase``, ``storage.import.*``, ``storage.requester.*``, clone tokens, a new
internal key added tomorrow) is dropped, so it can never be read back as state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cdi.api.config import CDIConfig, StorageProfile
from cdi.api.constants import (
    ANN_ALLOW_CLAIM_ADOPTION,
    ANN_CERT_CONFIG_MAP,
    ANN_CHECK_STATIC_VOLUME,
    ANN_CHECKSUM,
    ANN_CONTENT_TYPE,
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_DELETE_AFTER_COMPLETION,
    ANN_ENDPOINT,
    ANN_IMMEDIATE_BINDING,
    ANN_INSECURE_SKIP_VERIFY,
    ANN_PERMISSIVE_CLONE,
    ANN_POD_RESTARTS,
    ANN_PRE_POPULATED,
    ANN_PREALLOCATION_REQUESTED,
    ANN_PRIORITY_CLASS,
    ANN_REGISTRY_ARCHITECTURE,
    ANN_REGISTRY_IMPORT_METHOD,
    ANN_RETAIN_AFTER_COMPLETION,
    ANN_SECRET,
    ANN_SERVICE_ACCOUNT,
    ANN_SOURCE,
    ANN_UPLOAD_REQUEST,
    ANN_USE_POPULATOR,
    ANN_VERIFY,
    GROUP,
    IMPORT_SOURCE_NONE,
    LABEL_APP,
    LABEL_APP_VALUE,
    LABEL_KUBE_PV_FILLING_UP,
    MIB,
    ContentType,
    VolumeMode,
)
from cdi.api.types import ClaimSpec, DataVolume, DataVolumeSource, resolve_volume_mode
from cdi.render import RenderError
from cdi.render.naming import pvc_name
from cdi.render.owner import datavolume_reference

SKIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
# The CDI annotations CDI documents as set by users on a DataVolume (reference "DataVolume
# annotations"); every other key in CDI's domain is the controller's to write.
USER_SETTABLE: frozenset[str] = frozenset(
    {
        ANN_IMMEDIATE_BINDING,
        ANN_USE_POPULATOR,
        ANN_RETAIN_AFTER_COMPLETION,
        ANN_DELETE_AFTER_COMPLETION,
        ANN_PREALLOCATION_REQUESTED,
        ANN_CHECK_STATIC_VOLUME,
        ANN_ALLOW_CLAIM_ADOPTION,
        ANN_PRE_POPULATED,
        ANN_PERMISSIVE_CLONE,
        ANN_VERIFY,  # read the volume back once filled: the upload server reads it here
        f"{GROUP}/storage.pod.vddk.extraargs",
        f"{GROUP}/storage.pod.vddk.initimageurl",
        f"{GROUP}/storage.pod.nodeSelector",  # cdi.render.placement: where its pods may run
    }
)
# CDI's messages (pkg/controller/datavolume/util.go) for a claim that cannot be completed.
NO_STORAGE_CLASS = "PVC spec is missing accessMode and no storageClass to choose profile"


def render_pvc(
    dv: DataVolume, storage_profile: StorageProfile | None, cdi_config: CDIConfig
) -> dict[str, Any]:
    """The desired PVC for ``dv``; raises ``RenderError`` when it cannot be rendered yet."""
    if dv.spec.pvc is not None:
        spec = dv.spec.pvc.to_dict()
    elif dv.spec.storage is not None:
        spec = render_storage_spec(dv, storage_profile, cdi_config)
    else:
        raise RenderError("DataVolume has neither spec.pvc nor spec.storage")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": pvc_name(dv.name),
            "namespace": dv.namespace,
            "labels": {
                **dv.metadata.labels,
                LABEL_APP: LABEL_APP_VALUE,
                LABEL_KUBE_PV_FILLING_UP: "disabled",
            },
            "annotations": pvc_annotations(dv, cdi_config),
            "ownerReferences": [datavolume_reference(dv)],
        },
        "spec": spec,
    }


def render_storage_spec(
    dv: DataVolume, profile: StorageProfile | None, cdi_config: CDIConfig
) -> dict[str, Any]:
    storage = dv.spec.storage
    assert storage is not None
    storage_class = storage.storage_class_name or (profile.storage_class if profile else None)
    access_modes, volume_mode = _modes(dv, storage, profile)
    spec = storage.to_dict()
    spec["accessModes"] = list(access_modes)
    spec["volumeMode"] = str(volume_mode)
    if storage_class:
        spec["storageClassName"] = storage_class
    size = _size(dv, storage, volume_mode, profile, cdi_config.filesystem_overhead(storage_class))
    if size is not None:
        spec.setdefault("resources", {}).setdefault("requests", {})["storage"] = str(size)
    return spec


def _modes(
    dv: DataVolume, storage: ClaimSpec, profile: StorageProfile | None
) -> tuple[tuple[str, ...], VolumeMode]:
    requested = (
        storage.volume_mode if storage.volume_mode != VolumeMode.FROM_STORAGE_PROFILE else None
    )
    if dv.spec.effective_content_type == ContentType.ARCHIVE:
        if requested == VolumeMode.BLOCK:
            raise RenderError("DataVolume with ContentType Archive cannot have block volumeMode")
        requested = VolumeMode.FILESYSTEM
    access = storage.access_modes
    if access and requested is not None:
        return access, resolve_volume_mode(requested)
    if profile is None or not profile.claim_property_sets:
        if access:
            return access, resolve_volume_mode(requested)
        name = profile.storage_class if profile else storage.storage_class_name
        raise RenderError(
            f"no accessMode specified in StorageProfile {name}" if name else NO_STORAGE_CLASS
        )
    return _from_profile(profile, access, requested)


def _from_profile(
    profile: StorageProfile, access: tuple[str, ...], mode: str | None
) -> tuple[tuple[str, ...], VolumeMode]:
    sets = profile.claim_property_sets
    if mode is not None:
        match = next((s for s in sets if s.volume_mode == mode and s.access_modes), None)
        if match is None:
            raise RenderError(
                f"no accessMode specified in StorageProfile {profile.storage_class} "
                f"for volume mode {mode}"
            )
        return match.access_modes, resolve_volume_mode(mode)
    if access:
        found = next((s for s in sets if set(access) <= set(s.access_modes)), None)
        if found is None:
            raise RenderError(
                f"no volumeMode specified in StorageProfile "
                f"{profile.storage_class} for access modes {list(access)}"
            )
        return access, resolve_volume_mode(found.volume_mode)
    first = sets[0]
    if not first.access_modes:
        raise RenderError(f"no accessMode specified in StorageProfile {profile.storage_class}")
    return first.access_modes, resolve_volume_mode(first.volume_mode)


def _size(
    dv: DataVolume,
    storage: ClaimSpec,
    mode: VolumeMode,
    profile: StorageProfile | None,
    overhead: str,
) -> int | None:
    requested = storage.requested_size
    if requested is None:
        if dv.spec.is_clone:
            return None
        raise RenderError("PVC Spec is not valid - missing storage size")
    if requested.value() < MIB:
        raise RenderError("PVC Spec is not valid - storage size should be at least 1MiB")
    size = requested.value()
    if mode == VolumeMode.FILESYSTEM:
        size = required_space(float(overhead), size)
    minimum = profile.minimum_supported_pvc_size if profile else None
    return max(size, minimum.value()) if minimum is not None else size


def required_space(overhead: float, requested: int) -> int:
    """CDI ``GetRequiredSpace``: align to 1 MiB, then add overhead as a share of the total."""
    aligned = -(-requested // MIB) * MIB
    if not 0 <= overhead < 1:
        raise RenderError(f"filesystem overhead {overhead} leaves no room for data")
    return math.ceil(aligned / (1 - overhead))


# --- annotations -----------------------------------------------------------------------------


def pvc_annotations(dv: DataVolume, cdi_config: CDIConfig) -> dict[str, str]:
    spec = dv.spec
    out = user_annotations(dv.annotations)
    out[ANN_POD_RESTARTS] = "0"
    out[ANN_CONTENT_TYPE] = str(spec.effective_content_type)
    out[ANN_CREATED_FOR_DATAVOLUME] = dv.uid
    preallocation = (
        spec.preallocation if spec.preallocation is not None else (cdi_config.preallocation)
    )
    out[ANN_PREALLOCATION_REQUESTED] = str(preallocation).lower()
    if spec.priority_class_name:
        out[ANN_PRIORITY_CLASS] = spec.priority_class_name
    if spec.service_account_name:
        out[ANN_SERVICE_ACCOUNT] = spec.service_account_name
    if spec.source is not None:
        out.update(source_annotations(spec.source))
    return out


def is_internal(key: str) -> bool:
    """Whether ``key`` is in CDI's annotation domain (``cdi.kubevirt.io/`` or a subdomain of it,
    e.g. ``upload.cdi.kubevirt.io/``) and not one CDI lets users set."""
    prefix, slash, _ = key.rpartition("/")
    in_domain = bool(slash) and (prefix == GROUP or prefix.endswith("." + GROUP))
    return in_domain and key not in USER_SETTABLE


def user_annotations(annotations: Mapping[str, str]) -> dict[str, str]:
    """The DataVolume annotations the PVC may carry: never an internal CDI key."""
    return {
        k: v for k, v in annotations.items() if k not in SKIPPED_ANNOTATIONS and not is_internal(k)
    }


def source_annotations(source: DataVolumeSource) -> dict[str, str]:
    """``storage.import.*`` for import sources, ``storage.upload.target`` for upload; nothing
    for clone sources."""
    pairs: dict[str, str | None] = {}
    if source.http is not None:
        http = source.http
        pairs = {
            ANN_SOURCE: "http",
            ANN_ENDPOINT: http.url,
            ANN_SECRET: http.secret_ref,
            ANN_CERT_CONFIG_MAP: http.cert_config_map,
            ANN_CHECKSUM: http.checksum,
            ANN_INSECURE_SKIP_VERIFY: _flag(http.insecure_skip_verify),
        }
    elif source.s3 is not None:
        pairs = {
            ANN_SOURCE: "s3",
            ANN_ENDPOINT: source.s3.url,
            ANN_SECRET: source.s3.secret_ref,
            ANN_CERT_CONFIG_MAP: source.s3.cert_config_map,
        }
    elif source.gcs is not None:
        pairs = {ANN_SOURCE: "gcs", ANN_ENDPOINT: source.gcs.url, ANN_SECRET: source.gcs.secret_ref}
    elif source.registry is not None:
        reg = source.registry
        pairs = {
            ANN_SOURCE: "registry",
            ANN_ENDPOINT: reg.url or reg.image_stream,
            ANN_SECRET: reg.secret_ref,
            ANN_CERT_CONFIG_MAP: reg.cert_config_map,
            ANN_REGISTRY_IMPORT_METHOD: reg.pull_method,
            ANN_REGISTRY_ARCHITECTURE: reg.platform.architecture if reg.platform else None,
        }
    elif source.blank is not None:
        pairs = {ANN_SOURCE: IMPORT_SOURCE_NONE}
    out = {k: v for k, v in pairs.items() if v}
    if source.upload is not None:
        out[ANN_UPLOAD_REQUEST] = ""  # CDI's marker: the upload flavour and the proxy read it
    return out


def _flag(value: bool | None) -> str | None:
    return None if value is None else str(value).lower()
