"""The host-assisted clone's source pod, rendered pure: ``python -m cloner`` next to the source.

CDI's clone controller (``pkg/controller/clone-controller.go``, reference §4.3) runs a pod
``<target uid>-source-pod`` in the **source** namespace that mounts the source claim read-only
(``/var/run/cdi/clone/source``, or the block device) and streams it to the upload server on the
target claim, authenticating with a client certificate whose CN the server demands
(``srcNs/srcName-tgtNs/tgtName``). Here the certificate, its key and the server's CA come from
a Secret in the source namespace, mounted as files (``CLIENT_CERT_FILE`` ...), never as
environment values. A filesystem source cloned into a block target is sent as its ``disk.img``
alone (``CLONE_STREAM=raw``), as only the controller knows the target's mode.

A pod cannot own objects across namespaces, so the pod carries no owner reference when the
clone crosses namespaces; it is labelled with the target claim's UID instead, which is how the
flavour finds (and deletes) it. Security is every worker pod's (``cdi.render.worker_pod``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import GROUP, LABEL_APP, LABEL_APP_VALUE, LABEL_COMPONENT
from cdi.api.types import DataVolume
from cdi.render.naming import upload_service_name
from cdi.render.owner import datavolume_reference
from cdi.render.worker_pod import (
    WorkerPod,
    container_security_context,
    image_fields,
    pod_security_context,
)

CLONE_SOURCE = "cdi-clone-source"
LABEL_TARGET_UID = f"{GROUP}/cloneTargetUID"
SOURCE_MOUNT = "/var/run/cdi/clone/source"
SOURCE_DEVICE = "/dev/cdi-block-volume"
CERT_DIR = "/etc/cdi/clone-source"
UPLOAD_PORT = 8443


@dataclass(frozen=True)
class CloneSourcePod:
    """The controller's choices for the source pod: image etc., and the Secret (in the source
    namespace) holding ``tls.crt``, ``tls.key`` and the upload server CA ``ca.crt``."""

    settings: WorkerPod
    client_secret: str
    upload_port: int = UPLOAD_PORT


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def source_pod_name(target: Mapping[str, Any]) -> str:
    return f"{_meta(target).get('uid')}-source-pod"


def client_name(source: Mapping[str, Any], target: Mapping[str, Any]) -> str:
    """The CN the target's upload server demands (``CLIENT_NAME``)."""
    s, t = _meta(source), _meta(target)
    return f"{s.get('namespace')}/{s.get('name')}-{t.get('namespace')}/{t.get('name')}"


def upload_url(target: Mapping[str, Any], port: int = UPLOAD_PORT) -> str:
    meta = _meta(target)
    service = upload_service_name(str(meta.get("name")))
    return f"https://{service}.{meta.get('namespace')}.svc:{port}/v1beta1/upload"


def _block(claim: Mapping[str, Any]) -> bool:
    return (claim.get("spec") or {}).get("volumeMode") == "Block"


def _env(source: Mapping[str, Any], target: Mapping[str, Any], port: int) -> list[dict[str, Any]]:
    block = _block(source)
    values = {
        "UPLOAD_URL": upload_url(target, port),
        "VOLUME_MODE": "block" if block else "filesystem",
        "MOUNT_POINT": SOURCE_DEVICE if block else SOURCE_MOUNT,
        "CLONE_STREAM": "raw" if block or _block(target) else "tar",
        "OWNER_UID": str(_meta(target).get("uid") or ""),
        "CLIENT_CERT_FILE": f"{CERT_DIR}/tls.crt",
        "CLIENT_KEY_FILE": f"{CERT_DIR}/tls.key",
        "SERVER_CA_CERT_FILE": f"{CERT_DIR}/ca.crt",
    }
    return [{"name": k, "value": v} for k, v in values.items()]


def render_clone_source_pod(
    dv: DataVolume, source: Mapping[str, Any], target: Mapping[str, Any], config: CloneSourcePod
) -> dict[str, Any]:
    src = _meta(source)
    container: dict[str, Any] = {
        "name": "cdi-clone-source",
        **image_fields(config.settings),
        "env": _env(source, target, config.upload_port),
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "client-cert", "mountPath": CERT_DIR, "readOnly": True}],
    }
    if _block(source):
        container["volumeDevices"] = [{"name": "source", "devicePath": SOURCE_DEVICE}]
    else:
        mount = {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True}
        container["volumeMounts"].append(mount)
    metadata: dict[str, Any] = {
        "name": source_pod_name(target),
        "namespace": src.get("namespace"),
        "labels": {
            **config.settings.labels,
            LABEL_APP: LABEL_APP_VALUE,
            LABEL_COMPONENT: CLONE_SOURCE,
            LABEL_TARGET_UID: str(_meta(target).get("uid") or ""),
        },
    }
    if src.get("namespace") == dv.namespace:
        metadata["ownerReferences"] = [datavolume_reference(dv)]
    claim = {"claimName": src.get("name"), "readOnly": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "restartPolicy": "OnFailure",
            "securityContext": pod_security_context(),
            "containers": [container],
            "volumes": [
                {"name": "source", "persistentVolumeClaim": claim},
                {
                    "name": "client-cert",
                    "secret": {"secretName": config.client_secret, "defaultMode": 0o440},
                },
            ],
        },
    }
