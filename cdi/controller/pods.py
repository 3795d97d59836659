"""Reading the worker pods a DataVolume owns: which are ours, and where each serves metrics.

The pods themselves are rendered whole by ``cdi.render`` (``render_importer_pod`` takes the
attempt, labels and metrics settings as inputs), so nothing here edits a pod. Pod names are a
function of (claim, attempt) (``cdi.render.naming.worker_pod_name``) and the attempt count lives
on the PVC (``cdi.controller.record``), so a controller that restarts finds the pod it created
instead of creating a second one, and a create that races with another gets 409. Failed
attempts' pods stay (their logs explain the failure) until the DataVolume goes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


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
