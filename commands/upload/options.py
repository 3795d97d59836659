"""What ``cdi upload`` was asked to do, checked as ``virtctl image-upload`` checks it: pure.

Users and scripts move between ``virtctl image-upload`` and ``cdi upload``, and match on the
error text, so every refusal here is virtctl's sentence verbatim (``imageupload.go``), raised
as a typed ``WorkerError`` whose ``reason`` says what kind of failure it was. Everything here
is a function of the command line and of objects already read (a PVC, a DataVolume, the
CDIConfig): no I/O, so each message is unit-tested without a cluster. ``target`` does the
reads and writes; ``cli`` wires the two to the transfer.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_DELETE_AFTER_COMPLETION,
    ANN_IMMEDIATE_BINDING,
    ANN_POD_PHASE,
    ANN_PVC_PRIME_NAME,
    ANN_UPLOAD_REQUEST,
    ANN_USE_POPULATOR,
    API_VERSION,
    KIND_DATAVOLUME,
    ContentType,
)
from cdi.api.errors import WorkerError
from cdi.api.quantity import Quantity, QuantityError

JSON = dict[str, Any]
LABEL_APPLY_STORAGE_PROFILE: Final = "cdi.kubevirt.io/applyStorageProfile"
UPLOAD_PATHS: Final = tuple(
    f"/{version}/upload{kind}"
    for version in ("v1beta1", "v1alpha1")
    for kind in ("-form-async", "-async", "-form", "")
)
READ_ONLY_MANY: Final = "ReadOnlyMany"
# virtctl's labels (KubeVirt's instancetype API): what a VM booted from the volume defaults to
LABEL_DEFAULT_INSTANCETYPE: Final = "instancetype.kubevirt.io/default-instancetype"
LABEL_DEFAULT_INSTANCETYPE_KIND: Final = "instancetype.kubevirt.io/default-instancetype-kind"
LABEL_DEFAULT_PREFERENCE: Final = "instancetype.kubevirt.io/default-preference"
LABEL_DEFAULT_PREFERENCE_KIND: Final = "instancetype.kubevirt.io/default-preference-kind"


# -- typed failures: the reason a script branches on, the message virtctl prints ------------


class UploadCliError(WorkerError):
    reason = "UploadFailed"


class UsageError(UploadCliError):
    """The command line itself is wrong (exit status 2)."""

    reason = "InvalidArgument"


class TargetRefused(UploadCliError):
    """The existing PVC or DataVolume cannot take an upload."""

    reason = "TargetNotUsable"


class TargetNotReady(UploadCliError):
    """The upload pod did not become ready, or the volume waits for its first consumer."""

    reason = "UploadNotReady"


class ProvisioningFailed(UploadCliError):
    reason = "ProvisioningFailed"


class ClaimNotValid(UploadCliError):
    reason = "ErrClaimNotValid"


class ProxyUrlNotFound(UploadCliError):
    reason = "UploadProxyURLNotFound"


class ProcessingFailed(UploadCliError):
    """The bytes arrived but the volume did not reach Succeeded."""

    reason = "ProcessingFailed"


# -- the command line -----------------------------------------------------------------------


@dataclass(frozen=True)
class UploadOptions:
    """One ``cdi upload`` invocation, validated. ``path`` is the image or the archive."""

    create_pvc: bool  # ``pvc NAME`` (or the deprecated ``--pvc-name``); else ``dv NAME``
    name: str
    path: str
    archive: bool = False
    size: str = ""
    storage_class: str = ""
    access_mode: str = ""
    volume_mode: str = ""  # "", "block" or "filesystem"
    proxy_url: str = ""
    insecure: bool = False
    wait_secs: float = 300.0
    retry: int = 5
    no_create: bool = False
    force_bind: bool = False
    datasource: bool = False  # create or update DataSource NAME pointing at the volume
    default_instancetype: str = ""
    default_instancetype_kind: str = ""
    default_preference: str = ""
    default_preference_kind: str = ""

    @property
    def kind(self) -> str:
        return "PersistentVolumeClaim" if self.create_pvc else KIND_DATAVOLUME

    @property
    def content_type(self) -> str:
        return ContentType.ARCHIVE if self.archive else ContentType.KUBEVIRT


def _size(a: argparse.Namespace) -> str:
    if a.size and a.pvc_size and a.size != a.pvc_size:
        raise UsageError("--pvc-size and --size can not be specified at the same time")
    return str(a.pvc_size or a.size or "")


def _volume_mode(a: argparse.Namespace) -> str:
    mode = str(a.volume_mode or "")
    if a.block_volume:
        if mode and mode != "block":
            raise UsageError(f"incompatible --volume-mode '{mode}' and --block-volume")
        mode = "block"
    if mode not in ("", "block", "filesystem"):
        raise UsageError(
            f"Invalid volume mode '{mode}'. Valid values are 'block' and 'filesystem'."
        )
    return mode


def _path(a: argparse.Namespace, volume_mode: str) -> tuple[str, bool]:
    if not a.image_path and not a.archive_path:
        raise UsageError("either image-path or archive-path must be provided")
    if a.image_path and a.archive_path:
        raise UsageError("cannot handle both image-path and archive-path, provide only one")
    if a.archive_path and volume_mode == "block":
        raise UsageError("In archive upload the volume mode should always be filesystem")
    return (str(a.archive_path), True) if a.archive_path else (str(a.image_path), False)


def _target(a: argparse.Namespace) -> tuple[bool, str]:
    args = list(a.args)
    if a.pvc_name:
        if args:
            raise UsageError("cannot use --pvc-name and args")
        return True, str(a.pvc_name)
    if len(args) != 2:
        raise UsageError("expecting two args")
    kind = args[0].lower()
    if kind not in ("dv", "pvc"):
        raise UsageError(f"invalid resource type {args[0]}")
    return kind == "pvc", str(args[1])


def _defaults(a: argparse.Namespace) -> None:
    """virtctl's checks of the default instance type and preference flags."""
    given = (
        a.default_instancetype,
        a.default_instancetype_kind,
        a.default_preference,
        a.default_preference_kind,
    )
    if a.no_create and any(given):
        raise UsageError(
            "--default-instancetype, --default-instancetype-kind, --default-preference and "
            "--default-preference-kind cannot be used with --no-create"
        )
    if a.default_instancetype_kind and not a.default_instancetype:
        raise UsageError("--default-instancetype must be provided with --default-instancetype-kind")
    if a.default_preference_kind and not a.default_preference:
        raise UsageError("--default-preference must be provided with --default-preference-kind")


def options_from_args(a: argparse.Namespace) -> UploadOptions:
    """virtctl's ``parseArgs``, in virtctl's order, so the first complaint is the same one."""
    size = _size(a)
    volume_mode = _volume_mode(a)
    path, archive = _path(a, volume_mode)
    create_pvc, name = _target(a)
    _defaults(a)
    if a.wait_secs < 0:
        raise UsageError(f"--wait-secs must not be negative: {a.wait_secs}")
    if a.retry < 1:
        raise UsageError(f"--retry must be at least 1: {a.retry}")
    return UploadOptions(
        create_pvc=create_pvc,
        name=name,
        path=path,
        archive=archive,
        size=size,
        storage_class=a.storage_class or "",
        access_mode=a.access_mode or "",
        volume_mode=volume_mode,
        proxy_url=a.uploadproxy_url or "",
        insecure=a.insecure,
        wait_secs=float(a.wait_secs),
        retry=int(a.retry),
        no_create=a.no_create,
        force_bind=a.force_bind,
        datasource=a.datasource,
        default_instancetype=a.default_instancetype or "",
        default_instancetype_kind=a.default_instancetype_kind or "",
        default_preference=a.default_preference or "",
        default_preference_kind=a.default_preference_kind or "",
    )


# -- what gets created ------------------------------------------------------------------------


def _quantity(size: str) -> str:
    if not size:
        raise UsageError("when creating a resource, the size must be specified")
    try:
        Quantity.parse(size)
    except QuantityError as exc:
        raise UsageError(f"validation failed for size={size}: {exc}") from exc
    return size


def _access_modes(o: UploadOptions) -> list[str]:
    if o.access_mode == READ_ONLY_MANY:
        raise UsageError(
            "cannot upload to a readonly volume, use either ReadWriteOnce or ReadWriteMany "
            "if supported"
        )
    return [o.access_mode] if o.access_mode else []


def _storage(o: UploadOptions) -> JSON:
    spec: JSON = {"resources": {"requests": {"storage": _quantity(o.size)}}}
    if o.storage_class:
        spec["storageClassName"] = o.storage_class
    if modes := _access_modes(o):
        spec["accessModes"] = modes
    if o.volume_mode:
        spec["volumeMode"] = "Block" if o.volume_mode == "block" else "Filesystem"
    return spec


def _annotations(o: UploadOptions) -> dict[str, str]:
    return {ANN_IMMEDIATE_BINDING: ""} if o.force_bind else {}


def instancetype_labels(o: UploadOptions) -> dict[str, str]:
    """virtctl's labels for the VM that boots the volume: its default instance type and
    preference (and their kinds), on the volume and on the DataSource."""
    pairs = (
        (LABEL_DEFAULT_INSTANCETYPE, o.default_instancetype),
        (LABEL_DEFAULT_INSTANCETYPE_KIND, o.default_instancetype_kind),
        (LABEL_DEFAULT_PREFERENCE, o.default_preference),
        (LABEL_DEFAULT_PREFERENCE_KIND, o.default_preference_kind),
    )
    return {key: value for key, value in pairs if value}


def render_datavolume(o: UploadOptions, namespace: str) -> JSON:
    """virtctl's upload DataVolume: ``source.upload``, the ``storage`` API (so the
    StorageProfile fills what the user left out), the content type, force-bind."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND_DATAVOLUME,
        "metadata": {
            "name": o.name,
            "namespace": namespace,
            "annotations": _annotations(o),
            **({"labels": labels} if (labels := instancetype_labels(o)) else {}),
        },
        "spec": {
            "source": {"upload": {}},
            "contentType": o.content_type,
            "storage": _storage(o),
        },
    }


def render_pvc(o: UploadOptions, namespace: str) -> JSON:
    """virtctl's upload PVC: annotated as an upload target with its content type. A PVC
    needs an access mode, so ReadWriteOnce when none is given (virtctl's ``RenderPVC``)."""
    spec = _storage(o)
    spec.setdefault("accessModes", ["ReadWriteOnce"])
    annotations = {ANN_UPLOAD_REQUEST: "", ANN_CONTENT_TYPE: o.content_type, **_annotations(o)}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": o.name,
            "namespace": namespace,
            "annotations": annotations,
            "labels": {LABEL_APPLY_STORAGE_PROFILE: "true", **instancetype_labels(o)},
        },
        "spec": spec,
    }


def render_datasource(o: UploadOptions, namespace: str) -> JSON:
    """virtctl's ``--datasource``: DataSource NAME pointing at the uploaded volume, with the
    default instance type and preference labels."""
    meta: JSON = {"name": o.name, "namespace": namespace}
    if labels := instancetype_labels(o):
        meta["labels"] = labels
    return {
        "apiVersion": API_VERSION,
        "kind": "DataSource",
        "metadata": meta,
        "spec": {"source": {"pvc": {"name": o.name, "namespace": namespace}}},
    }


def updated_datasource(existing: JSON, o: UploadOptions, namespace: str) -> JSON:
    """An existing DataSource NAME repointed at the uploaded volume: its source replaced, the
    labels given merged into its own (virtctl updates it in place)."""
    out = dict(existing)
    meta = dict(out.get("metadata") or {})
    labels = {**(meta.get("labels") or {}), **instancetype_labels(o)}
    if labels:
        meta["labels"] = labels
    out["metadata"] = meta
    out["spec"] = {**(out.get("spec") or {}), **render_datasource(o, namespace)["spec"]}
    return out


# -- what an existing target must look like ---------------------------------------------------


def _ann(obj: JSON) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def no_datavolume(pvc: JSON, namespace: str, name: str) -> TargetRefused:
    """``dv NAME`` names a PVC with no DataVolume: virtctl's two explanations."""
    ann = _ann(pvc)
    if ann.get(ANN_DELETE_AFTER_COMPLETION) == "true" and ann.get(ANN_POD_PHASE) == "Succeeded":
        return TargetRefused(
            "DataVolume already garbage-collected: Assuming PVC "
            f"{namespace}/{name} is successfully populated"
        )
    return TargetRefused(f"No DataVolume is associated with the existing PVC {namespace}/{name}")


def populator_prime_name(dv: JSON, pvc: JSON, namespace: str, name: str) -> str | None:
    """With populators the bytes go to PVC prime: its name, or ``None`` for a plain DataVolume."""
    if _ann(dv).get(ANN_USE_POPULATOR) != "true":
        return None
    if (pvc.get("status") or {}).get("phase") == "Bound":
        raise TargetRefused(f"PVC {name} already successfully populated")
    prime = _ann(pvc).get(ANN_PVC_PRIME_NAME)
    if not prime:
        raise TargetRefused(f"Unable to get PVC Prime name from PVC {namespace}/{name}")
    return prime


def check_existing_pvc(o: UploadOptions, pvc: JSON) -> None:
    """virtctl's checks of an existing PVC, in its order."""
    ann = _ann(pvc)
    if ann.get(ANN_POD_PHASE) == "Succeeded":
        raise TargetRefused(f"PVC {o.name} already successfully imported/cloned/updated")
    if not o.no_create and ANN_UPLOAD_REQUEST not in ann:
        raise TargetRefused(f"PVC {o.name} not available for upload")
    if o.archive and ann.get(ANN_CONTENT_TYPE) != ContentType.ARCHIVE:
        raise TargetRefused(f"PVC {o.name} doesn't have archive contentType annotation")


def wffc_refusal(phase: str, force_bind: bool) -> TargetNotReady | None:
    if phase in ("WaitForFirstConsumer", "PendingPopulation") and not force_bind:
        return TargetNotReady(
            f"cannot upload to DataVolume in {phase} phase, make sure the PVC is Bound, "
            "or use force-bind flag"
        )
    return None


# -- where the bytes go ------------------------------------------------------------------------


def proxy_url_from_config(cdiconfig: JSON) -> str:
    """CDIConfig ``spec.uploadProxyURLOverride``, else ``status.uploadProxyURL``."""
    override = (cdiconfig.get("spec") or {}).get("uploadProxyURLOverride")
    if override:
        return str(override)
    found = (cdiconfig.get("status") or {}).get("uploadProxyURL")
    if not found:
        raise ProxyUrlNotFound("uploadproxy URL not found")
    return str(found)


def with_scheme(url: str) -> str:
    """virtctl: a proxy address without a scheme is ``https://`` (``host:port`` too, which
    a URL parser would read as a scheme)."""
    return url if "://" in url else f"https://{url}"


def proxy_base(url: str) -> str:
    """The proxy's base URL: virtctl accepts a URL that already ends in an upload path (it
    appends one only when missing); the transfer client appends its own, so strip it."""
    parts = urlsplit(url)
    path = parts.path.rstrip("/")
    for known in UPLOAD_PATHS:
        if path.endswith(known):
            path = path[: -len(known)]
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", "")).rstrip("/")
