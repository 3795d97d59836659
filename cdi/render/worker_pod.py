"""What every worker pod shares, whichever worker it runs: identity, labels, security, metrics.

The importer pod is the first worker pod; the upload server (``render_upload_pod`` and
``render_upload_service``) and the cloner come next. Each renderer lays out its own containers,
volumes and environment, and takes from here the parts that must not drift between them:

- ``WorkerPod``: what the controller decides about a pod beyond the DataVolume (image, pull
  policy, command, which attempt this is, extra labels, where metrics are served). The
  renderer returns the *final* pod from these inputs; nothing edits a pod after rendering, so
  what is created is exactly what the pure function returned and a test can compare it whole.
- ``worker_metadata``: the attempt's deterministic name (``cdi.render.naming.worker_pod_name``),
  labels (the claim's, the extra ones, then CDI's, which win: the
  controller's informer selects on the component label), allowed annotations, owner reference.
- Pod and container security contexts: restricted (non-root qemu uid 107, no privilege
  escalation, no capabilities, RuntimeDefault seccomp, read-only root filesystem).
- ``block_scratch_empty_dir``: a Block target's writable ``/scratch`` (the root is read-only).
- ``worker_resources`` and ``admission_fields``: what a namespace's ResourceQuota, LimitRange
  and scheduler see of every worker pod (importer, DataImportCron poller, upload server, clone
  source): each container's requests *and* limits from CDIConfig (``podResourceRequirements``,
  CDI's defaults cpu 100m/750m, memory 60M/600M filled in), so a namespace whose quota counts
  ``limits.cpu``/``limits.memory`` admits them; the DataVolume's ``priorityClassName``;
  CDIConfig's ``imagePullSecrets``; and the DataVolume's ``serviceAccountName`` where CDI sets
  it (not on the clone source pod, which runs in the source's namespace).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    LABEL_APP,
    LABEL_APP_VALUE,
    LABEL_COMPONENT,
    LABEL_PROMETHEUS,
    METRICS_PORT,
    METRICS_PORT_NAME,
    POD_ANNOTATION_ALLOW_LIST,
    POD_ANNOTATION_DEFAULTS,
    QEMU_UID,
)
from cdi.api.quantity import QuantityError, parse_quantity, scratch_ceiling
from cdi.api.types import DataVolume
from cdi.render.naming import worker_pod_name
from cdi.render.owner import datavolume_reference

LABEL_ATTEMPT = "cdi.kubevirt.io/importAttempt"  # the attempt a worker pod belongs to


@dataclass(frozen=True)
class Metrics:
    """Where a worker serves Prometheus metrics.

    ``on_pod_ip`` binds the server to the pod's own address (downward API ``status.podIP``)
    instead of all addresses: enough for the controller's scrape, and pods sharing one host
    network namespace (the test node) then do not collide on the port.
    """

    port: int = METRICS_PORT
    on_pod_ip: bool = False


@dataclass(frozen=True)
class WorkerPod:
    """The controller's choices for one worker pod that are not in the DataVolume."""

    image: str
    command: tuple[str, ...] = ()  # empty: the image's ENTRYPOINT runs the worker
    pull_policy: str = "IfNotPresent"
    attempt: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    metrics: Metrics = field(default_factory=Metrics)


def worker_metadata(
    dv: DataVolume, pvc: Mapping[str, Any], worker: str, settings: WorkerPod
) -> dict[str, Any]:
    """Name, namespace, labels, annotations and owner of ``worker``'s pod for ``pvc``."""
    meta = pvc.get("metadata") or {}
    claim = str(meta.get("name") or dv.name)
    return {
        "name": worker_pod_name(worker, claim, settings.attempt),
        "namespace": meta.get("namespace") or dv.namespace,
        "labels": {
            **(meta.get("labels") or {}),
            **settings.labels,
            LABEL_APP: LABEL_APP_VALUE,
            LABEL_COMPONENT: worker,
            LABEL_PROMETHEUS: "true",
            LABEL_ATTEMPT: str(settings.attempt),
        },
        "annotations": _annotations(dv),
        "ownerReferences": [datavolume_reference(dv)],
    }


def _annotations(dv: DataVolume) -> dict[str, str]:
    out = dict(POD_ANNOTATION_DEFAULTS)
    out.update({k: v for k, v in dv.annotations.items() if k in POD_ANNOTATION_ALLOW_LIST})
    return out


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": QEMU_UID,
        "runAsGroup": QEMU_UID,
        "fsGroup": QEMU_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }


def block_scratch_empty_dir(name: str, pvc_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The scratch volume of a worker writing a Block claim: an emptyDir, mounted at
    ``/scratch``. A block target has no folder of its own for an image staged for qemu-img,
    out-of-order data or the raw checkpoint, and the container's root filesystem is read-only.
    Its ``sizeLimit`` is the largest image file the claim can need (``scratch_ceiling``, the
    same bound the worker enforces); it survives container restarts and goes with the pod.
    The upload server's pod always has it; an importer's only as the fallback of CDI's
    ``<pvc>-scratch`` claim when no storage class can be found for one
    (``cdi.render.scratch``)."""
    size = ((pvc_spec.get("resources") or {}).get("requests") or {}).get("storage")
    try:
        capacity = math.ceil(parse_quantity(str(size))) if size else 0
    except QuantityError:
        capacity = 0  # the API server validated the claim; be safe anyway: no limit
    limit = {"sizeLimit": str(scratch_ceiling(capacity))} if capacity > 0 else {}
    return {"name": name, "emptyDir": limit}


def image_fields(settings: WorkerPod) -> dict[str, Any]:
    """A container's image, pull policy and (only when given) command."""
    out: dict[str, Any] = {"image": settings.image, "imagePullPolicy": settings.pull_policy}
    if settings.command:
        out["command"] = list(settings.command)
    return out


def metrics_ports(settings: WorkerPod) -> list[dict[str, Any]]:
    port = settings.metrics.port
    return [{"name": METRICS_PORT_NAME, "containerPort": port, "protocol": "TCP"}]


def metrics_env(settings: WorkerPod, addr_var: str, port_var: str) -> list[dict[str, Any]]:
    """The worker's metrics address and port variables (named by the worker), when not default."""
    env: list[dict[str, Any]] = []
    if settings.metrics.port != METRICS_PORT:
        env.append({"name": port_var, "value": str(settings.metrics.port)})
    if settings.metrics.on_pod_ip:
        pod_ip = {"fieldRef": {"fieldPath": "status.podIP"}}
        env.append({"name": addr_var, "valueFrom": pod_ip})
    return env


def worker_resources(config: CDIConfig) -> dict[str, Any]:
    """A worker container's ``resources``: CDIConfig's pod resource requirements, requests and
    limits (status first: there CDI's defaults fill what the spec leaves out)."""
    return config.pod_resources.to_dict()


def admission_fields(
    config: CDIConfig, priority_class: str | None, service_account: str | None = None
) -> dict[str, Any]:
    """The pod spec's ``priorityClassName``, ``serviceAccountName`` and ``imagePullSecrets``
    (CDIConfig's), each only when there is one: what every worker pod carries for the
    namespace's admission plugins and the scheduler."""
    optional = {
        "priorityClassName": priority_class,
        "serviceAccountName": service_account,
        "imagePullSecrets": [{"name": n} for n in config.image_pull_secrets],
    }
    return {k: v for k, v in optional.items() if v}
