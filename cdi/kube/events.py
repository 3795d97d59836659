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

Under a burst the queue also yields: while ``busy()`` says new objects wait for their first
reconcile (the controller's DataVolume queue is ``urgent``), an event waits, for at most
``max_delay`` seconds after it was queued, so its write does not compete with the creates of
claims and pods someone is waiting for; every event is still written. An event identical to
one still waiting (same object, type, reason, message, source) is folded into it (``count``
and ``lastTimestamp``), as client-go's correlator folds repeats into one Event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from cdi.kube.client import EVENTS, AsyncKube
from cdi.kube.errors import KubeError
from cdi.kube.leader import micro_time

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"


EventKey = tuple[Any, ...]


def _identity(event: dict[str, Any]) -> EventKey:
    """What makes two events the same event (client-go's ``getEventKey``, minus the time)."""
    involved = event.get("involvedObject") or {}
    return (
        involved.get("uid"),
        involved.get("name"),
        event.get("type"),
        event.get("reason"),
        event.get("message"),
        event.get("reportingComponent"),
    )


class EventQueue:
    """Events waiting to be written by one background task (``start`` .. ``close``)."""

    def __init__(
        self,
        kube: AsyncKube,
        maxsize: int = 5000,
        *,
        busy: Callable[[], bool] | None = None,
        max_delay: float = 5.0,
    ) -> None:
        self.kube = kube
        self.dropped = 0
        self.folded = 0  # repeats folded into an event still waiting
        self.busy = busy
        self.max_delay = max_delay
        self._queue: asyncio.Queue[tuple[float, EventKey]] = asyncio.Queue(maxsize)
        self._waiting: dict[EventKey, dict[str, Any]] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events")

    def put(self, event: dict[str, Any]) -> None:
        key = _identity(event)
        waiting = self._waiting.get(key)
        if waiting is not None:
            waiting["count"] = int(waiting.get("count") or 1) + 1
            waiting["lastTimestamp"] = event.get("lastTimestamp")
            self.folded += 1
            return
        try:
            self._queue.put_nowait((time.monotonic(), key))
        except asyncio.QueueFull:
            self.dropped += 1
            log.warning("event %s dropped: %d waiting", event.get("reason"), self._queue.qsize())
            return
        self._waiting[key] = event

    async def _run(self) -> None:
        while True:
            queued_at, key = await self._queue.get()
            try:
                await self._yield(queued_at)
                event = self._waiting.pop(key)
                await _write(self.kube, event)
            except Exception:  # a bug must not stop every later event
                log.exception("event %s not written", key[3])
            finally:
                self._queue.task_done()

    async def _yield(self, queued_at: float) -> None:
        """Wait while ``busy`` (new objects' first reconciles), at most ``max_delay`` after
        the event was queued."""
        deadline = queued_at + self.max_delay
        while True:
            busy = self.busy
            if busy is None or not busy() or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.05)  # a poll: the work queue has no event to wait on

    async def close(self, grace: float = 5.0) -> None:
        """Write what is queued (for at most ``grace`` seconds, yielding no more), then stop."""
        if self._task is None:
            return
        self.busy = None
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
