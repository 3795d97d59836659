"""Kubernetes Events about our objects (``kubectl describe dv`` shows them).

Best effort, as in client-go's recorder: an event that cannot be written is logged, never
fails a reconcile. Names are ``<object>.<hex nanoseconds>`` like client-go's, so two events in
the same second do not collide.

Off the reconcile path when given an ``EventQueue`` (the controller's manager does): ``emit``
then only queues the event and one background writer creates them, as client-go's broadcaster
does, so a reconcile never waits for an event's round trip and events do not take the API
threads reconciles need. The queue is bounded: under a burst beyond it, events are dropped
(and logged), never the reconcile slowed. Without a queue (tests, one-shot tools) ``emit``
writes the event before it returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from cdi.kube.client import EVENTS, AsyncKube
from cdi.kube.errors import KubeError
from cdi.kube.leader import micro_time

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


class EventQueue:
    """Events waiting to be written by one background task (``start`` .. ``close``)."""

    def __init__(self, kube: AsyncKube, maxsize: int = 1000) -> None:
        self.kube = kube
        self.dropped = 0
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events")

    def put(self, event: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event %s dropped: %d waiting", event.get("reason"), self._queue.qsize())

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                await _write(self.kube, event)
            except Exception:  # a bug must not stop every later event
                log.exception("event %s not written", event.get("reason"))
            finally:
                self._queue.task_done()

    async def close(self, grace: float = 5.0) -> None:
        """Write what is queued (for at most ``grace`` seconds), then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), grace)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def _write(kube: AsyncKube, event: dict[str, Any]) -> None:
    meta = event["metadata"]
    try:
        await kube.create(EVENTS, event, meta["namespace"])
    except KubeError as exc:
        involved = event["involvedObject"]
        log.warning(
            "event %s on %s/%s not written: %s",
            event.get("reason"),
            meta["namespace"],
            involved.get("name"),
            exc,
        )


class EventRecorder:
    def __init__(
        self,
        kube: AsyncKube,
        component: str,
        instance: str = "",
        queue: EventQueue | None = None,
    ) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        self.queue = queue

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
        if self.queue is not None:
            self.queue.put(event)
        else:
            await _write(self.kube, event)
