"""The worker pods a DataVolume owns, by name; whether one is ours is ``cdi.controller.workerpod``.

The pods themselves are rendered whole by ``cdi.render`` (``render_importer_pod`` takes the
attempt, labels and metrics settings as inputs), so nothing here edits a pod. Pod names are a
function of (claim, attempt) (``cdi.render.naming.worker_pod_name``) and the attempt count lives
on the PVC (``cdi.controller.record``), so a controller that restarts finds the pod it created
instead of creating a second one, and a create that races with another gets 409. Failed
attempts' pods stay (their logs explain the failure) until the DataVolume goes.

A controller reference is no proof of origin (a tenant can write one): this only narrows the
pod cache to a DataVolume's pods. The pod at an attempt's name is trusted only by the UID the
controller recorded from its own create (``cdi.controller.workerpod.assess``).
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
