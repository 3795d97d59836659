"""Reading the worker pods a DataVolume owns: which are ours, and where each serves metrics.

The pods themselves are rendered whole by ``cdi.render`` (``render_importer_pod`` takes the
attempt, labels and metrics settings as inputs), so nothing here edits a pod. Pod names are a
function of (claim, attempt) (``cdi.render.naming.worker_pod_name``) and the attempt count lives
on the PVC (``cdi.controller.record``), so a controller that restarts finds the pod it created
instead of creating a second one, and a create that races with another gets 409. Failed
attempts' pods stay (their logs explain the failure) until the DataVolume goes.

A name, labels and an owner reference are no proof of origin: a tenant who may create pods in
the namespace can create ``importer-<claim>`` first, labelled and "owned" by the DataVolume, and
its termination message would then decide the import. So ``claim_pod`` accepts the pod at the
attempt's name only when its UID is the one the controller recorded from its own create
(``cdi.controller.record``); any other pod there is an impostor, reported and never read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class PodMatch:
    """What stands at an attempt's pod name: the controller's pod, or an impostor, or nothing."""

    pod: dict[str, Any] | None = None
    impostor: dict[str, Any] | None = None


def pod_uid(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("metadata") or {}).get("uid") or None


def claim_pod(pods: Mapping[str, dict[str, Any]], name: str, recorded_uid: str | None) -> PodMatch:
    """The pod named ``name`` if its UID is ``recorded_uid``; any other pod there is an impostor
    (also when nothing is recorded: then the controller has not created one it knows of)."""
    pod = pods.get(name)
    if pod is None:
        return PodMatch()
    if recorded_uid is not None and pod_uid(pod) == recorded_uid:
        return PodMatch(pod=pod)
    return PodMatch(impostor=pod)
