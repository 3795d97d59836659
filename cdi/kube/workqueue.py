"""A keyed work queue with rate-limited requeue, drained by a bounded number of workers.

The semantics are client-go's ``workqueue`` (the shape controller-runtime builds on):

- a key is queued at most once however many events arrive for it (``dirty``);
- a key being processed is never handed to a second worker: an ``add`` during processing marks
  it dirty and it is queued again when the first worker calls ``done`` (``processing``);
- ``add_after`` delays a key (the earliest pending deadline wins);
- ``add_rate_limited`` delays it by a per-key exponential backoff (``base * 2^failures``,
  capped) until ``forget`` resets the count, so a failing object does not spin;
- ``shutdown`` wakes every waiting ``get``, which then returns None;
- ``add(key, first=True)`` puts a key ahead of every ordinary one (still in arrival order among
  such keys): the controller uses it for an object it has never acted on (a new DataVolume),
  whose first reconcile is the one someone waits for, while keys requeued by the object's own
  children (status follow-ups) can wait a little longer under a burst;
- ``follow_ups_while_urgent``: while such first keys are queued or being processed
  (``urgent``), at most that many ordinary keys are processed at once, so follow-ups (and
  their API writes) cannot fill every worker and API thread while new objects wait: under a
  burst of creates, the new objects' first reconciles go ahead, and follow-ups run at a
  bounded rate beside them (never starved). None: no limit.

``run_workers`` is the loop each worker runs: get a key, call the reconciler, requeue as its
``Result`` (or its exception) says, mark done. Pure asyncio; no Kubernetes here.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for: nothing (``Result()``), or to run again after a delay."""

    requeue_after: float | None = None


@dataclass(frozen=True)
class Backoff:
    base: float = 0.05
    cap: float = 60.0

    def delay(self, failures: int) -> float:
        return float(min(self.cap, self.base * (2 ** max(0, failures))))


class WorkQueue:
    def __init__(
        self, backoff: Backoff | None = None, *, follow_ups_while_urgent: int | None = None
    ) -> None:
        self.backoff = backoff or Backoff()
        self.follow_ups_while_urgent = follow_ups_while_urgent
        self._queue: deque[str] = deque()
        self._first: deque[str] = deque()  # ahead of _queue
        self._dirty: set[str] = set()
        self._processing: set[str] = set()
        self._processing_first: set[str] = set()  # handed out from _first, not done yet
        self._failures: dict[str, int] = {}
        self._timers: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._ready = asyncio.Event()
        self._shutting_down = False

    def __len__(self) -> int:
        return len(self._first) + len(self._queue)

    @property
    def processing(self) -> frozenset[str]:
        return frozenset(self._processing)

    @property
    def first_waiting(self) -> int:
        """First keys queued, not yet handed to a worker."""
        return len(self._first)

    @property
    def urgent(self) -> int:
        """First keys queued or being processed: new objects whose first reconcile is due."""
        return len(self._first) + len(self._processing_first)

    def add(self, key: str, *, first: bool = False) -> None:
        if self._shutting_down:
            return
        if key in self._dirty:
            if first and key in self._queue:  # waiting as an ordinary key: move it ahead
                self._queue.remove(key)
                self._first.append(key)
            return
        self._dirty.add(key)
        if key in self._processing:
            return  # queued again by done()
        (self._first if first else self._queue).append(key)
        self._wake()

    def add_after(self, key: str, delay: float) -> None:
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        when = loop.time() + delay
        pending = self._timers.get(key)
        if pending is not None:
            if pending[0] <= when:
                return
            pending[1].cancel()
        self._timers[key] = (when, loop.call_at(when, self._fire, key))

    def _fire(self, key: str) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> float:
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        delay = self.backoff.delay(failures) * random.uniform(0.9, 1.1)
        self.add_after(key, delay)
        return delay

    def failures(self, key: str) -> int:
        return self._failures.get(key, 0)

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    async def get(self) -> str | None:
        while not self._shutting_down and not (self._first or self._follow_up_allowed()):
            self._ready.clear()
            await self._ready.wait()
        if not len(self):
            return None
        if self._first:
            key = self._first.popleft()
            self._processing_first.add(key)
        else:
            key = self._queue.popleft()
        self._processing.add(key)
        self._dirty.discard(key)
        return key

    def _follow_up_allowed(self) -> bool:
        """An ordinary key is waiting and may be handed out now (see ``urgent``)."""
        if not self._queue:
            return False
        limit = self.follow_ups_while_urgent
        if limit is None or not self.urgent:
            return True
        return len(self._processing) - len(self._processing_first) < limit

    def done(self, key: str) -> None:
        self._processing.discard(key)
        self._processing_first.discard(key)
        if key in self._dirty and not self._shutting_down:
            self._queue.append(key)
        self._wake()  # a follow-up held back for this key's slot may go now

    def shutdown(self) -> None:
        self._shutting_down = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        self._queue.clear()
        self._first.clear()
        self._wake()

    def _wake(self) -> None:
        self._ready.set()  # every waiter re-checks the queue; one of them takes the key


Reconcile = Callable[[str], Awaitable[Result]]


async def worker(queue: WorkQueue, reconcile: Reconcile, name: str = "worker") -> None:
    """One worker: until shutdown, reconcile keys and requeue them as asked."""
    while True:
        key = await queue.get()
        if key is None:
            return
        try:
            result = await reconcile(key)
        except Exception as exc:
            delay = queue.add_rate_limited(key)
            log.warning(
                "%s: reconcile %s failed (%s: %s); retry in %.2fs",
                name,
                key,
                type(exc).__name__,
                exc,
                delay,
            )
        else:
            queue.forget(key)
            if result.requeue_after is not None:
                queue.add_after(key, result.requeue_after)
        finally:
            queue.done(key)


async def run_workers(queue: WorkQueue, reconcile: Reconcile, count: int) -> None:
    """``count`` workers in parallel; returns when the queue shuts down and all are idle."""
    await asyncio.gather(*(worker(queue, reconcile, f"worker-{i}") for i in range(count)))
