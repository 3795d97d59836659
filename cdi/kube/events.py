"""Kubernetes Events about our objects (``kubectl describe dv`` shows them).

Best effort, as in client-go's recorder: an event that cannot be written is logged, never
fails a reconcile. Names are ``<object>.<hex nanoseconds>`` like client-go's, so two events in
the same second do not collide.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from cdi.kube.client import EVENTS, AsyncKube
from cdi.kube.errors import KubeError
from cdi.kube.leader import micro_time

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


class EventRecorder:
    def __init__(self, kube: AsyncKube, component: str, instance: str = "") -> None:
        self.kube = kube
        self.component = component
        self.instance = instance

    async def emit(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        now = micro_time()
        seconds = now.split(".")[0] + "Z"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name')}.{time.time_ns():x}", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
            "firstTimestamp": seconds,
            "lastTimestamp": seconds,
            "count": 1,
        }
        try:
            await self.kube.create(EVENTS, event, ns)
        except KubeError as exc:
            log.warning("event %s on %s/%s not written: %s", reason, ns, meta.get("name"), exc)
