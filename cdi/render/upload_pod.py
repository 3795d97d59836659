"""Render the upload server's Pod, Service and certificate Secret for a PVC (CDI's upload
controller ``createUploadPod``/``createUploadService``; the pod contract in docs/upload.md).

Shape, and why:

- Everything is named from the PVC (``cdi.render.naming.upload_service_name``: CDI's
  ``cdi-upload-<pvc>``, shortened to a DNS label) and owned by the PVC, not by a DataVolume: a
  plain PVC annotated ``cdi.kubevirt.io/storage.upload.target`` is an upload target too, and
  deleting the PVC (or its DataVolume, which owns the PVC) takes the server with it.
- ``restartPolicy: OnFailure``, as CDI: a crashed server is restarted in place (the restart
  count becomes ``storage.pod.restarts``); exit 0 ends the pod (upload done, or its deadline
  passed and the controller re-creates it with a fresh certificate).
- The serving certificate, its key and the client CA certificate come as files from Secret
  ``<pod>-tls``; nothing secret is in the environment. The server binds its pod's own address
  (downward API ``status.podIP``) so pods sharing a host network never collide on 8443.
- Readiness is a TCP connect to 8443 every second (the server listens once its app is set
  up): the controller writes ``storage.pod.ready`` from it, and the proxy only forwards once
  that says ``true``. Not ``GET /healthz``: the server requires a client certificate in the
  TLS handshake (security review 3, N4), which the kubelet does not have; and the kernel
  completes a TCP connect even while every connection slot is held, so the probe never
  competes with uploads for them.
- The same restricted security as every worker pod (``cdi.render.worker_pod``), no service
  account token, no service links; the target is ``/data`` (``/data/disk.img``) or the device
  ``/dev/cdi-block-volume`` (then with an emptyDir ``/scratch`` for spill and the raw
  checkpoint: a filesystem target keeps both beside the image); resources from CDIConfig.
  Placement: ``cdi.render.placement`` (workload, the claim's node selector annotation and node).
- The Service selects the pod by ``service: <name>`` (CDI's label), port 8443 to 8443.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api.config import CDIConfig, verification_requested
from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_PREALLOCATION_REQUESTED,
    ANN_PRIORITY_CLASS,
    ANN_SERVICE_ACCOUNT,
    ANN_VERIFY,
    BLOCK_DEVICE_PATH,
    DATA_MOUNT_PATH,
    DATAVOLUME_CONTENT_TYPES,
    DISK_IMAGE_PATH,
    LABEL_APP,
    LABEL_APP_VALUE,
    LABEL_COMPONENT,
    POD_ANNOTATION_DEFAULTS,
    TERMINATION_LOG_PATH,
    TMP_DIR,
    ContentType,
    VolumeMode,
)
from cdi.api.types import resolve_volume_mode
from cdi.render import RenderError
from cdi.render.naming import upload_service_name
from cdi.render.owner import controller_reference
from cdi.render.placement import pod_placement, requested_selector, selected_node
from cdi.render.worker_pod import (
    WorkerPod,
    admission_fields,
    block_scratch_empty_dir,
    container_security_context,
    image_fields,
    pod_security_context,
    worker_resources,
)

UPLOAD_COMPONENT = "cdi-upload-server"  # CDI's cdi.kubevirt.io label value and container name
LABEL_UPLOAD_TARGET = "cdi.kubevirt.io/uploadTarget"  # = the PVC's UID
LABEL_SERVICE = "service"
UPLOAD_CLIENT_NAME = "client.upload-server.cdi.kubevirt.io"  # CDI's CLIENT_NAME
UPLOAD_SERVER_PORT = 8443
TLS_DIR = "/etc/cdi/upload-server"
DATA_VOLUME = "cdi-data-vol"
TLS_VOLUME = "cdi-upload-tls"
# Which client CAs the server trusts (SHA-256 of each certificate's DER, hex, comma-separated):
# the upload client CA's switch waits until every live upload pod names the staged CA
# (cdi.controller.proxycreds; the controller reads pods, never tenants' Secrets).
ANN_CLIENT_CAS = "cdi.kubevirt.io/uploadClientCAs"
TMP_VOLUME = "tmp"
SCRATCH_VOLUME = "cdi-scratch-vol"
SCRATCH_DIR = "/scratch"
REASON_BAD_CONTENT_TYPE = "ErrUploadContentType"


@dataclass(frozen=True)
class UploadPodConfig(WorkerPod):
    """The controller's choices beyond the PVC: image (``WorkerPod``), cluster config, the
    deadline written into the pod, the client name demanded and the port."""

    cdi_config: CDIConfig = field(default_factory=CDIConfig)
    deadline: str = ""  # RFC 3339
    client_name: str = UPLOAD_CLIENT_NAME
    client_cas: tuple[str, ...] = ()  # fingerprints of the client CAs in its ca.crt
    port: int = UPLOAD_SERVER_PORT


def upload_pod_name(pvc_name: str) -> str:
    return upload_service_name(pvc_name)


def upload_secret_name(pvc_name: str) -> str:
    return f"{upload_pod_name(pvc_name)}-tls"


def pvc_reference(pvc: Mapping[str, Any]) -> dict[str, Any]:
    meta = pvc.get("metadata") or {}
    return controller_reference("v1", "PersistentVolumeClaim", meta["name"], meta["uid"])


def _metadata(pvc: Mapping[str, Any], name: str) -> dict[str, Any]:
    meta = pvc.get("metadata") or {}
    return {
        "name": name,
        "namespace": meta.get("namespace"),
        "labels": {
            LABEL_APP: LABEL_APP_VALUE,
            LABEL_COMPONENT: UPLOAD_COMPONENT,
            LABEL_UPLOAD_TARGET: str(meta.get("uid")),
            LABEL_SERVICE: upload_pod_name(str(meta["name"])),
        },
        "ownerReferences": [pvc_reference(pvc)],
    }


def content_type(pvc: Mapping[str, Any]) -> str:
    """The PVC's ``storage.contentType`` (``kubevirt`` when absent); anything else is refused."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    value = ann.get(ANN_CONTENT_TYPE) or ContentType.KUBEVIRT
    if value not in DATAVOLUME_CONTENT_TYPES:
        raise RenderError(f"upload content-type {value} is invalid", reason=REASON_BAD_CONTENT_TYPE)
    return str(value)


def render_upload_pod(pvc: Mapping[str, Any], config: UploadPodConfig) -> dict[str, Any]:
    """The final upload server pod for ``pvc``: nothing is added to it after this returns."""
    meta = pvc.get("metadata") or {}
    name = upload_pod_name(str(meta["name"]))
    ann = meta.get("annotations") or {}
    spec: dict[str, Any] = {
        "restartPolicy": "OnFailure",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [_container(pvc, config)],
        "volumes": [
            {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": meta["name"]}},
            {"name": TMP_VOLUME, "emptyDir": {}},
            *_scratch_volume(pvc),
            {
                "name": TLS_VOLUME,
                "secret": {
                    "secretName": upload_secret_name(str(meta["name"])),
                    "defaultMode": 0o440,
                },
            },
        ],
    }
    cdi = config.cdi_config
    spec.update(admission_fields(cdi, ann.get(ANN_PRIORITY_CLASS), ann.get(ANN_SERVICE_ACCOUNT)))
    # the claim carries the DataVolume's node selector (cdi.render.pvc USER_SETTABLE; a prime
    # copies its target's) and, once placed, its node
    spec.update(pod_placement(cdi.workload, requested_selector(ann), selected_node(pvc)))
    metadata = _metadata(pvc, name)
    metadata["annotations"] = dict(POD_ANNOTATION_DEFAULTS)
    if config.client_cas:
        metadata["annotations"][ANN_CLIENT_CAS] = ",".join(config.client_cas)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _scratch_volume(pvc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Block targets only (``block_scratch_empty_dir``): spill and the raw checkpoint, which
    survives a container restart so a raw upload resumes after a crash."""
    if not _is_block(pvc):
        return []
    return [block_scratch_empty_dir(SCRATCH_VOLUME, pvc.get("spec") or {})]


def _is_block(pvc: Mapping[str, Any]) -> bool:
    mode = (pvc.get("spec") or {}).get("volumeMode")
    return resolve_volume_mode(mode) == VolumeMode.BLOCK


def _container(pvc: Mapping[str, Any], config: UploadPodConfig) -> dict[str, Any]:
    block = _is_block(pvc)
    mounts: list[dict[str, Any]] = [
        {"name": TMP_VOLUME, "mountPath": TMP_DIR},
        {"name": TLS_VOLUME, "mountPath": TLS_DIR, "readOnly": True},
    ]
    if not block:
        mounts.append({"name": DATA_VOLUME, "mountPath": DATA_MOUNT_PATH})
    else:
        mounts.append({"name": SCRATCH_VOLUME, "mountPath": SCRATCH_DIR})
    container: dict[str, Any] = {
        "name": UPLOAD_COMPONENT,
        **image_fields(config),
        "env": _env(pvc, block, config),
        "ports": [{"name": "https", "containerPort": config.port, "protocol": "TCP"}],
        "readinessProbe": {
            "tcpSocket": {"port": config.port},
            "initialDelaySeconds": 2,
            "periodSeconds": 1,
        },
        "resources": worker_resources(config.cdi_config),
        "terminationMessagePath": TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    if block:
        container["volumeDevices"] = [{"name": DATA_VOLUME, "devicePath": BLOCK_DEVICE_PATH}]
    return container


def _env(pvc: Mapping[str, Any], block: bool, config: UploadPodConfig) -> list[dict[str, Any]]:
    meta, spec = pvc.get("metadata") or {}, pvc.get("spec") or {}
    ann = meta.get("annotations") or {}
    cdi = config.cdi_config
    size = ((spec.get("resources") or {}).get("requests") or {}).get("storage")
    if size is None:
        raise RenderError("target PVC has no storage request")
    requested = ann.get(ANN_PREALLOCATION_REQUESTED)
    preallocation = requested == "true" if requested is not None else bool(cdi.preallocation)
    overhead = "0" if block else cdi.filesystem_overhead(spec.get("storageClassName"))
    pairs = [
        ("TLS_CERT_FILE", f"{TLS_DIR}/tls.crt"),
        ("TLS_KEY_FILE", f"{TLS_DIR}/tls.key"),
        ("CLIENT_CERT_FILE", f"{TLS_DIR}/ca.crt"),
        ("CLIENT_NAME", config.client_name),
        ("DESTINATION", BLOCK_DEVICE_PATH if block else DISK_IMAGE_PATH),
        ("UPLOAD_IMAGE_SIZE", str(size)),
        ("FILESYSTEM_OVERHEAD", overhead),
        ("PREALLOCATION", str(preallocation).lower()),
        ("CONTENT_TYPE", content_type(pvc)),
        ("OWNER_UID", str(meta.get("uid"))),
        ("DEADLINE", config.deadline),
        ("UPLOAD_SERVER_PORT", str(config.port)),
        *cdi.tls_profile.env().items(),
    ]
    if block:
        pairs.append(("UPLOAD_SCRATCH_DIR", SCRATCH_DIR))
    if verification_requested(ann.get(ANN_VERIFY), cdi.spec.verify_volumes):
        pairs.append(("UPLOAD_VERIFY", "true"))  # datapath.verify (a clone's target too)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in pairs]
    env.append(
        {"name": "UPLOAD_SERVER_ADDRESS", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
    )
    return env


def render_upload_service(pvc: Mapping[str, Any], port: int = UPLOAD_SERVER_PORT) -> dict[str, Any]:
    """ClusterIP Service ``cdi-upload-<pvc>``: port ``port`` to the pod's ``port``."""
    name = upload_pod_name(str((pvc.get("metadata") or {})["name"]))
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pvc, name),
        "spec": {
            "type": "ClusterIP",
            "selector": {LABEL_SERVICE: name},
            "ports": [{"name": "https", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }


def render_upload_secret(pvc: Mapping[str, Any], data: Mapping[str, str]) -> dict[str, Any]:
    """Secret ``<pod>-tls`` with ``data`` (base64 ``tls.crt``, ``tls.key``, ``ca.crt``)."""
    name = upload_secret_name(str((pvc.get("metadata") or {})["name"]))
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(pvc, name),
        "data": dict(data),
    }
