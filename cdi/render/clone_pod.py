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
flavour finds (and deletes) it. Security, container resources (CDIConfig's requests and
limits), the DataVolume's ``priorityClassName`` and CDIConfig's ``imagePullSecrets`` are every
worker pod's (``cdi.render.worker_pod``); like CDI's, the pod names no service account: the
DataVolume's lives in the target namespace, not beside the source. Placement
(``cdi.render.placement``): the CDI resource's ``workload``, pinned to the node of a running pod
that mounts a ReadWriteOnce source (``reader_node``: CDI's required affinity), preferring the
node of the target's upload server (CDI's preferred affinity).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import GROUP, LABEL_APP, LABEL_APP_VALUE, LABEL_COMPONENT
from cdi.api.types import DataVolume
from cdi.render.naming import upload_service_name
from cdi.render.owner import datavolume_reference
from cdi.render.placement import pod_placement, prefer_pods_with
from cdi.render.upload_pod import LABEL_UPLOAD_TARGET
from cdi.render.worker_pod import (
    WorkerPod,
    admission_fields,
    container_security_context,
    image_fields,
    metrics_ports,
    pod_security_context,
    worker_resources,
)

CLONE_SOURCE = "cdi-clone-source"
LABEL_TARGET_UID = f"{GROUP}/cloneTargetUID"
ANN_COPY_TARGET = f"{GROUP}/clone.copyTarget"  # "namespace/name" of the target claim
SOURCE_MOUNT = "/var/run/cdi/clone/source"
SOURCE_DEVICE = "/dev/cdi-block-volume"
CERT_DIR = "/etc/cdi/clone-source"
UPLOAD_PORT = 8443
MAX_COMMON_NAME = 64


@dataclass(frozen=True)
class CloneSourcePod:
    """The controller's choices for the source pod: image etc., and the Secret (in the source
    namespace) holding ``tls.crt``, ``tls.key`` and the upload server CA ``ca.crt``."""

    settings: WorkerPod
    client_secret: str
    upload_port: int = UPLOAD_PORT
    # The upload Service's ClusterIP: dialled directly (no cluster DNS needed), the server's
    # certificate still verified for ``upload_server_name`` (``UPLOAD_SERVER_NAME``).
    upload_host: str = ""
    cdi_config: CDIConfig = field(default_factory=CDIConfig)  # resources, pull secrets
    # where a ReadWriteOnce source is mounted already (``reader_node``): the pod must run there
    source_node: str | None = None


RWO_MODES = frozenset({"ReadWriteOnce", "ReadWriteOncePod"})


def reader_node(pods: list[Mapping[str, Any]], source: Mapping[str, Any]) -> str | None:
    """The node of a pod not yet finished that mounts ``source`` (read-only: a writer stops
    the clone before this), when ``source`` is ReadWriteOnce: a second node could not attach
    it, so the source pod must join it there (CDI's required pod affinity to such a pod).
    None for a volume any node may attach, or one nobody mounts (the scheduler then follows
    the volume's own node affinity, as for a local volume)."""
    modes = set((source.get("spec") or {}).get("accessModes") or [])
    if not modes or not modes <= RWO_MODES:
        return None
    name = _meta(source).get("name")
    for pod in pods:
        status, spec = pod.get("status") or {}, pod.get("spec") or {}
        if status.get("phase") in ("Succeeded", "Failed") or not spec.get("nodeName"):
            continue
        for vol in spec.get("volumes") or []:
            if (vol.get("persistentVolumeClaim") or {}).get("claimName") == name:
                return str(spec["nodeName"])
    return None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def source_pod_name(target: Mapping[str, Any]) -> str:
    return f"{_meta(target).get('uid')}-source-pod"


def client_name(source: Mapping[str, Any], target: Mapping[str, Any]) -> str:
    """The CN the target's upload server demands (``CLIENT_NAME``): CDI's
    ``srcNs/srcName-tgtNs/tgtName``, or, when that exceeds a CN's 64 characters (X.509's upper
    bound, which Go does not enforce but our certificate library does), ``clone-`` and a
    SHA-256 prefix of it: still one name per source and target pair."""
    s, t = _meta(source), _meta(target)
    full = f"{s.get('namespace')}/{s.get('name')}-{t.get('namespace')}/{t.get('name')}"
    if len(full) <= MAX_COMMON_NAME:
        return full
    return "clone-" + hashlib.sha256(full.encode()).hexdigest()[:40]


def upload_server_name(target: Mapping[str, Any]) -> str:
    """The name the target's upload server certificate is issued for."""
    meta = _meta(target)
    return f"{upload_service_name(str(meta.get('name')))}.{meta.get('namespace')}.svc"


def upload_url(target: Mapping[str, Any], port: int = UPLOAD_PORT, host: str = "") -> str:
    return f"https://{host or upload_server_name(target)}:{port}/v1beta1/upload"


def _block(claim: Mapping[str, Any]) -> bool:
    return (claim.get("spec") or {}).get("volumeMode") == "Block"


def _env(
    source: Mapping[str, Any], target: Mapping[str, Any], config: CloneSourcePod
) -> list[dict[str, Any]]:
    block = _block(source)
    values = {
        "UPLOAD_URL": upload_url(target, config.upload_port, config.upload_host),
        "UPLOAD_SERVER_NAME": upload_server_name(target),
        "VOLUME_MODE": "block" if block else "filesystem",
        "MOUNT_POINT": SOURCE_DEVICE if block else SOURCE_MOUNT,
        "CLONE_STREAM": "raw" if block or _block(target) else "tar",
        "OWNER_UID": str(_meta(target).get("uid") or ""),
        "CLIENT_CERT_FILE": f"{CERT_DIR}/tls.crt",
        "CLIENT_KEY_FILE": f"{CERT_DIR}/tls.key",
        "SERVER_CA_CERT_FILE": f"{CERT_DIR}/ca.crt",
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    # The clone's progress (CDI's cloner serves it on 8443), on the pod IP when asked.
    env.append({"name": "CLONER_METRICS_PORT", "value": str(config.settings.metrics.port)})
    if config.settings.metrics.on_pod_ip:
        pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
        env.append({"name": "CLONER_METRICS_ADDR", "valueFrom": pod_ip})
    return env


def _source_metadata(
    dv: DataVolume,
    source: Mapping[str, Any],
    target: Mapping[str, Any],
    name: str,
    settings: WorkerPod | None = None,
) -> dict[str, Any]:
    """Name, labels (the target claim's UID) and, in the DataVolume's namespace only, owner."""
    src = _meta(source)
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": src.get("namespace"),
        "labels": {
            **(settings.labels if settings else {}),
            LABEL_APP: LABEL_APP_VALUE,
            LABEL_COMPONENT: CLONE_SOURCE,
            LABEL_TARGET_UID: str(_meta(target).get("uid") or ""),
        },
        "annotations": {
            ANN_COPY_TARGET: f"{_meta(target).get('namespace')}/{_meta(target).get('name')}"
        },
    }
    if src.get("namespace") == dv.namespace:
        metadata["ownerReferences"] = [datavolume_reference(dv)]
    return metadata


def client_secret_name(target: Mapping[str, Any]) -> str:
    return f"{source_pod_name(target)}-tls"


def render_clone_client_secret(
    dv: DataVolume, source: Mapping[str, Any], target: Mapping[str, Any], data: Mapping[str, str]
) -> dict[str, Any]:
    """Secret ``<target uid>-source-pod-tls`` in the source namespace: the source pod's client
    certificate (``tls.crt``, ``tls.key``, CN = ``client_name``) and the upload server CA
    (``ca.crt``), base64 ``data``."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _source_metadata(dv, source, target, client_secret_name(target)),
        "data": dict(data),
    }


def render_clone_source_pod(
    dv: DataVolume, source: Mapping[str, Any], target: Mapping[str, Any], config: CloneSourcePod
) -> dict[str, Any]:
    src = _meta(source)
    container: dict[str, Any] = {
        "name": "cdi-clone-source",
        **image_fields(config.settings),
        "env": _env(source, target, config),
        "ports": metrics_ports(config.settings),
        "resources": worker_resources(config.cdi_config),
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "client-cert", "mountPath": CERT_DIR, "readOnly": True}],
    }
    if _block(source):
        container["volumeDevices"] = [{"name": "source", "devicePath": SOURCE_DEVICE}]
    else:
        mount = {"name": "source", "mountPath": SOURCE_MOUNT, "readOnly": True}
        container["volumeMounts"].append(mount)
    metadata = _source_metadata(dv, source, target, source_pod_name(target), config.settings)
    claim = {"claimName": src.get("name"), "readOnly": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "restartPolicy": "OnFailure",
            "enableServiceLinks": False,
            "automountServiceAccountToken": False,
            "securityContext": pod_security_context(),
            "containers": [container],
            "volumes": [
                {"name": "source", "persistentVolumeClaim": claim},
                {
                    "name": "client-cert",
                    "secret": {"secretName": config.client_secret, "defaultMode": 0o440},
                },
            ],
            **admission_fields(config.cdi_config, dv.spec.priority_class_name),
            **_placement(target, config),
        },
    }


def _placement(target: Mapping[str, Any], config: CloneSourcePod) -> dict[str, Any]:
    """The workload placement, pinned to ``source_node``, preferring the node of the target's
    upload server (CDI's preferred affinity: the stream then stays on one host). The
    DataVolume's node selector is for the pods writing its claim, not this one: the source
    pod must run where its volume can be attached."""
    placed = pod_placement(config.cdi_config.workload, node=config.source_node)
    server = {LABEL_UPLOAD_TARGET: str(_meta(target).get("uid") or "")}
    return prefer_pods_with(placed, str(_meta(target).get("namespace") or ""), server)
