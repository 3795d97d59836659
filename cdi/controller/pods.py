"""The importer pod for one attempt of one DataVolume: deterministic name, pure.

Attempt 0 is CDI's ``importer-<pvc>``; a retry after a transient failure is
``importer-<pvc>-retry-<n>``. The name is a function of (claim, attempt) and the attempt count
lives on the PVC (``cdi.controller.record``), so a controller that restarts finds the pod it
created instead of creating a second one, and a create that races with another gets 409.
Failed attempts' pods stay (their logs explain the failure) until the DataVolume goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api.types import DataVolume
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.naming import importer_pod_name, resource_name

LABEL_ATTEMPT = "cdi.kubevirt.io/importAttempt"
ENV_METRICS_ADDR = "IMPORTER_METRICS_ADDR"


def attempt_pod_name(claim: str, attempt: int) -> str:
    if attempt == 0:
        return importer_pod_name(claim)
    return resource_name("importer", f"{claim}-retry-{attempt}")


def desired_pod(
    dv: DataVolume, pvc: Mapping[str, Any], config: ImporterPodConfig, attempt: int
) -> dict[str, Any]:
    pod = render_importer_pod(dv, pvc, config)
    claim = str((pvc.get("metadata") or {}).get("name") or dv.name)
    pod["metadata"]["name"] = attempt_pod_name(claim, attempt)
    pod["metadata"]["labels"][LABEL_ATTEMPT] = str(attempt)
    for container in pod["spec"]["containers"]:
        if not container.get("command"):
            container.pop("command", None)  # the image's ENTRYPOINT runs the importer
        # Serve metrics on the pod's own address: enough for the controller's scrape, and
        # pods sharing a host network namespace (the test node) do not collide on the port.
        container.setdefault("env", []).append(
            {"name": ENV_METRICS_ADDR, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}
        )
    return pod


def owned_pods(pods: Iterable[Mapping[str, Any]], owner_uid: str) -> dict[str, dict[str, Any]]:
    """The pods whose controller reference is ``owner_uid``, by name."""
    out: dict[str, dict[str, Any]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        refs = meta.get("ownerReferences") or []
        if any(r.get("controller") and r.get("uid") == owner_uid for r in refs):
            out[str(meta.get("name"))] = dict(pod)
    return out


def metrics_port(pod: Mapping[str, Any], default: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics":
                return int(port.get("containerPort") or default)
    return default
