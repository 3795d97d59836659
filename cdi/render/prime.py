"""Pure renderers of the volume-populator flow: the prime PVC, the import it runs, the rebind.

A PVC whose ``spec.dataSourceRef`` names a ``VolumeImportSource`` (apiGroup
``cdi.kubevirt.io``) is the *target*: Kubernetes leaves it unbound, so any pod that mounts it
(a VM's launcher among them) stays Pending. CDI fills a second claim, the *prime*
``prime-<target uid>``, with the same storage, then moves the prime's PV to the target by
rewriting the PV's ``claimRef`` and deletes the prime. These functions turn (target, source)
into the objects of that flow; ``cdi.controller.populators`` applies them.

- ``render_prime``: the prime claim, owned by the target (so deleting the target takes the
  prime, and with it the PV, along), with the target's modes, size and class, the scheduler's
  ``selected-node`` copied (WaitForFirstConsumer storage binds where the consumer runs), and
  the source's spec copied into an annotation: the import reads it from there, so deleting the
  ``VolumeImportSource`` mid-population changes nothing.
- ``import_request``: the import as the DataVolume-shaped value the importer pod renderer and
  the import flavour take. Its identity (apiVersion, kind, name, uid) is the *target claim's*,
  so the one owner-reference helper makes the importer pod a child of the target claim, and
  the metrics label (``OWNER_UID``) is the target's UID.
- ``rebind_patch``: the merge patch that points the prime's PV at the target.

DataVolumes take the same road (CDI's default on CSI storage, ``uses_populator``): the
DataVolume reconciler creates a ``VolumeImportSource`` (an upload: ``VolumeUploadSource``) it
owns (``render_import_source``) and its PVC names it (``with_data_source_ref``), so a
DataVolume's claim is gated the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cdi.api.codec import SchemaError
from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_POPULATOR_KIND,
    ANN_POPULATOR_SOURCE,
    ANN_PREALLOCATION_REQUESTED,
    ANN_SELECTED_NODE,
    ANN_UPLOAD_REQUEST,
    ANN_USE_POPULATOR,
    ANN_VERIFY,
    GROUP,
    KIND_VOLUME_IMPORT_SOURCE,
    KIND_VOLUME_UPLOAD_SOURCE,
    LABEL_APP,
    LABEL_APP_VALUE,
    LABEL_EXCLUDE_FROM_BACKUP,
    SourceKind,
)
from cdi.api.types import DataVolume, DataVolumeSource, DataVolumeSpec, ObjectMeta
from cdi.render import RenderError
from cdi.render.naming import resource_name
from cdi.render.owner import controller_reference, datavolume_reference
from cdi.render.placement import ANN_POD_NODE_SELECTOR

JSON = dict[str, Any]
PVC_KIND = "PersistentVolumeClaim"


def prime_name(target_uid: str) -> str:
    """CDI's ``prime-<target uid>``: a function of the target, found again after a restart."""
    return resource_name("prime", target_uid)


def populator_kind(pvc: Mapping[str, Any]) -> str | None:
    """The kind of CDI populator source the claim's ``dataSourceRef`` names, or None."""
    ref = (pvc.get("spec") or {}).get("dataSourceRef") or {}
    if ref.get("apiGroup") != GROUP or not ref.get("name"):
        return None
    return str(ref.get("kind") or "") or None


def is_prime(pvc: Mapping[str, Any]) -> bool:
    """A prime claim (it records the kind of source that fills it)."""
    return ANN_POPULATOR_KIND in ((pvc.get("metadata") or {}).get("annotations") or {})


def source_name(pvc: Mapping[str, Any]) -> str:
    return str(((pvc.get("spec") or {}).get("dataSourceRef") or {}).get("name") or "")


def target_reference(target: Mapping[str, Any]) -> JSON:
    meta = target["metadata"]
    return controller_reference("v1", PVC_KIND, str(meta["name"]), str(meta["uid"]))


def render_prime(
    target: Mapping[str, Any],
    source: Mapping[str, Any],
    extra: Mapping[str, str] | None = None,
    data_source: Mapping[str, Any] | None = None,
) -> JSON:
    """The prime claim for ``target``, to be filled with ``source`` (a populator source object:
    its ``kind`` is recorded, VolumeImportSource when absent). ``extra`` annotations and a
    ``dataSource`` (a CSI clone's source claim) are what other populators add."""
    meta = target["metadata"]
    spec = target.get("spec") or {}
    annotations = {
        ANN_POPULATOR_KIND: str(source.get("kind") or KIND_VOLUME_IMPORT_SOURCE),
        ANN_POPULATOR_SOURCE: json.dumps(dict(source.get("spec") or {}), sort_keys=True),
        **(extra or {}),
    }
    # where its pods run; whether its volume is read back once filled (datapath.verify)
    for key in (ANN_SELECTED_NODE, ANN_POD_NODE_SELECTOR, ANN_VERIFY):
        value = (meta.get("annotations") or {}).get(key)
        if value:
            annotations[key] = value
    prime_spec: JSON = {
        "accessModes": list(spec.get("accessModes") or ["ReadWriteOnce"]),
        "resources": {"requests": dict((spec.get("resources") or {}).get("requests") or {})},
        "volumeMode": spec.get("volumeMode") or "Filesystem",
    }
    if spec.get("storageClassName"):
        prime_spec["storageClassName"] = spec["storageClassName"]
    if data_source:
        prime_spec["dataSource"] = dict(data_source)
    return {
        "apiVersion": "v1",
        "kind": PVC_KIND,
        "metadata": {
            "name": prime_name(str(meta["uid"])),
            "namespace": meta["namespace"],
            "labels": {LABEL_APP: LABEL_APP_VALUE, LABEL_EXCLUDE_FROM_BACKUP: "true"},
            "annotations": annotations,
            "ownerReferences": [target_reference(target)],
        },
        "spec": prime_spec,
    }


def render_upload_prime(target: Mapping[str, Any], source: Mapping[str, Any]) -> JSON:
    """The prime of a ``VolumeUploadSource``: an upload target (``storage.upload.target``,
    what the proxy checks on PVC') with the source's content type and preallocation."""
    spec = source.get("spec") or {}
    extra = {ANN_UPLOAD_REQUEST: "", ANN_CONTENT_TYPE: str(spec.get("contentType") or "kubevirt")}
    if spec.get("preallocation") is not None:
        extra[ANN_PREALLOCATION_REQUESTED] = str(bool(spec["preallocation"])).lower()
    return render_prime(target, {**source, "kind": KIND_VOLUME_UPLOAD_SOURCE}, extra)


def clone_source_claim(source: Mapping[str, Any]) -> str:
    """The claim a ``VolumeCloneSource`` names (in its own namespace)."""
    return str(((source.get("spec") or {}).get("source") or {}).get("name") or "")


def render_clone_prime(target: Mapping[str, Any], source: Mapping[str, Any]) -> JSON:
    """The prime of a ``VolumeCloneSource``: ``dataSource`` = the source claim, so the
    provisioner makes its volume as a clone (CDI's csi-clone)."""
    data_source = {"kind": PVC_KIND, "name": clone_source_claim(source)}
    return render_prime(target, source, data_source=data_source)


def import_request(target: Mapping[str, Any], prime: Mapping[str, Any]) -> DataVolume:
    """The import the prime's recorded source asks for, as a DataVolume-shaped value whose
    identity is the target claim's. ``RenderError`` when the record is unusable."""
    raw = ((prime.get("metadata") or {}).get("annotations") or {}).get(ANN_POPULATOR_SOURCE)
    try:
        spec = json.loads(raw or "")
        source = DataVolumeSource.from_dict(spec.get("source") or {})
    except (ValueError, AttributeError, SchemaError) as exc:
        raise RenderError("the import source recorded on the prime claim is unusable") from exc
    if source.kind is None:
        raise RenderError("the VolumeImportSource must name exactly one source")
    meta = target["metadata"]
    # the DataVolume's request to verify reached the target claim (user-settable): keep it
    verify = (meta.get("annotations") or {}).get(ANN_VERIFY)
    return DataVolume(
        metadata=ObjectMeta(
            name=str(meta["name"]),
            namespace=str(meta["namespace"]),
            uid=str(meta["uid"]),
            annotations={ANN_VERIFY: str(verify)} if verify is not None else {},
        ),
        spec=DataVolumeSpec(
            source=source,
            content_type=spec.get("contentType"),
            preallocation=spec.get("preallocation"),
        ),
        api_version="v1",
        kind=PVC_KIND,
    )


def rebind_patch(target: Mapping[str, Any], pv_version: str | None = None) -> JSON:
    """Point a PV at ``target``: the PV binder then binds the target to it. ``pv_version``:
    only over that resourceVersion of the PV (the one whose binding was checked)."""
    meta = target["metadata"]
    guard = {"metadata": {"resourceVersion": pv_version}} if pv_version else {}
    return {
        **guard,
        "spec": {
            "claimRef": {
                "apiVersion": "v1",
                "kind": PVC_KIND,
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "resourceVersion": None,
            }
        },
    }


def claim_ref_uid(pv: Mapping[str, Any]) -> str | None:
    return ((pv.get("spec") or {}).get("claimRef") or {}).get("uid") or None


# The DataVolume sources an import populator fills (clone has its own flavour).
IMPORT_SOURCES = frozenset(
    {SourceKind.HTTP, SourceKind.S3, SourceKind.GCS, SourceKind.REGISTRY, SourceKind.BLANK}
)
POPULATED_SOURCES = IMPORT_SOURCES | {SourceKind.UPLOAD}


def uses_populator(dv: DataVolume, csi_storage: bool) -> bool:
    """CDI's ``shouldUseCDIPopulator``: the annotation ``storage.usePopulator`` decides when
    set; otherwise import and upload sources use the populator on CSI storage (the class's
    provisioner has a CSIDriver object) and nothing else does."""
    if dv.spec.source_kind not in POPULATED_SOURCES or dv.spec.checkpoints:
        return False
    wanted = dv.annotations.get(ANN_USE_POPULATOR)
    if wanted in ("true", "false"):
        return wanted == "true"
    return csi_storage


def import_source_name(dv: DataVolume) -> str:
    """CDI's ``volume-import-source-<dv uid>``."""
    return resource_name("volume-import-source", dv.uid)


def upload_source_name(dv: DataVolume) -> str:
    """CDI's ``volume-upload-source-<dv uid>``."""
    return resource_name("volume-upload-source", dv.uid)


def render_import_source(dv: DataVolume) -> JSON:
    """The populator source a DataVolume's claim names, owned by the DataVolume: a
    VolumeUploadSource for an upload, else a VolumeImportSource."""
    assert dv.spec.source is not None
    upload = dv.spec.source_kind == SourceKind.UPLOAD
    spec: JSON = {} if upload else {"source": dv.spec.source.to_dict()}
    if dv.spec.content_type:
        spec["contentType"] = dv.spec.content_type
    if dv.spec.preallocation is not None:
        spec["preallocation"] = dv.spec.preallocation
    kind = KIND_VOLUME_UPLOAD_SOURCE if upload else KIND_VOLUME_IMPORT_SOURCE
    name = upload_source_name(dv) if upload else import_source_name(dv)
    return {
        "apiVersion": f"{GROUP}/v1beta1",
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": dv.namespace,
            "ownerReferences": [datavolume_reference(dv)],
        },
        "spec": spec,
    }


def with_data_source_ref(pvc: Mapping[str, Any], source: Mapping[str, Any]) -> JSON:
    """``pvc`` naming ``source`` (a rendered populator source) as its ``dataSourceRef``."""
    ref = {"apiGroup": GROUP, "kind": source["kind"], "name": source["metadata"]["name"]}
    return {**pvc, "spec": {**(pvc.get("spec") or {}), "dataSourceRef": ref}}
