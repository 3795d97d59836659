"""Cluster lookups of admission reviews, shared fairly between callers and bounded per caller.

A review that needs the cluster (the DataVolume rules look up claims and DataSources, the
visibility and clone checks ask SubjectAccessReviews) blocks a thread of a small pool: as many
as the API client keeps connections (``API_CONCURRENCY``). The API server gives up on a review
after ``timeoutSeconds`` (10 s) and, with ``failurePolicy: Fail``, refuses the request. So one
caller must not be able to make everyone else wait, as a plain FIFO queue in front of the pool
let it (security review finding N2: a flood of reviews naming DataSources in other namespaces
queued the API server's own reviews towards their timeout).

``FairLookups.run(caller, fn, *args)`` is the gate every such review goes through:

- a caller (the user the API server authenticated, ``userInfo.username``) has at most
  ``per_caller`` reviews admitted at once, running or waiting; one more is refused at once with
  ``CallerBusy`` (the review answers 429 "too many requests"), nothing is queued for it;
- a caller runs at most ``workers - 1`` lookups at once, so one slot is always left to the
  others whatever a single caller sends;
- a freed slot goes to the waiting caller that runs the fewest lookups (ties: round robin),
  not to the oldest waiting review: a caller that just arrived is served at the next free
  slot, never behind a flood's queue.

It runs on the event loop (no locks): ``run_blocking`` is what hands ``fn`` to the pool.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any

RunBlocking = Callable[..., Awaitable[Any]]
PER_CALLER = 32  # a user's DataVolume creates in flight at once (the load benchmark sends 16)


class CallerBusy(Exception):
    """The caller already has ``per_caller`` reviews admitted; the new one is refused."""

    def __init__(self, caller: str, limit: int) -> None:
        super().__init__(
            f"too many admission reviews of {caller!r} in progress (limit {limit}); try again"
        )
        self.caller = caller


class FairLookups:
    def __init__(self, run_blocking: RunBlocking, workers: int, per_caller: int = PER_CALLER):
        if workers < 1 or per_caller < 1:
            raise ValueError("workers and per_caller must be at least 1")
        self._run_blocking = run_blocking
        self.workers = workers
        self.per_caller = per_caller
        self.max_running = max(1, workers - 1)
        self._free = workers
        self._admitted: dict[str, int] = {}  # running or waiting, per caller
        self._running: dict[str, int] = {}
        self._waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    def admitted(self, caller: str) -> int:
        return self._admitted.get(caller, 0)

    async def run(self, caller: str, fn: Callable[..., Any], *args: Any) -> Any:
        if self.admitted(caller) >= self.per_caller:
            raise CallerBusy(caller, self.per_caller)
        self._admitted[caller] = self.admitted(caller) + 1
        try:
            await self._acquire(caller)
            try:
                return await self._run_blocking(fn, *args)
            finally:
                self._release(caller)
        finally:
            self._admitted[caller] -= 1
            if not self._admitted[caller]:
                del self._admitted[caller]

    def _may_start(self, caller: str) -> bool:
        return self._free > 0 and self._running.get(caller, 0) < self.max_running

    async def _acquire(self, caller: str) -> None:
        if caller not in self._waiting and self._may_start(caller):
            self._start(caller)
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(caller, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release(caller)  # granted, then cancelled before it ran
            else:
                self._forget(caller, turn)
            raise

    def _start(self, caller: str) -> None:
        self._free -= 1
        self._running[caller] = self._running.get(caller, 0) + 1

    def _release(self, caller: str) -> None:
        self._running[caller] -= 1
        if not self._running[caller]:
            del self._running[caller]
        self._free += 1
        self._grant()

    def _grant(self) -> None:
        """Hand free slots to waiting callers: the one running fewest lookups first, ties in
        line order; a caller served goes to the back of the line."""
        while self._free > 0:
            ready = [c for c in self._waiting if self._may_start(c)]
            if not ready:
                return
            caller = min(ready, key=lambda c: self._running.get(c, 0))
            queue = self._waiting.pop(caller)
            turn = queue.popleft()
            if queue:
                self._waiting[caller] = queue
            self._start(caller)
            turn.set_result(None)

    def _forget(self, caller: str, turn: asyncio.Future[None]) -> None:
        queue = self._waiting.get(caller)
        if queue is None:
            return
        if turn in queue:
            queue.remove(turn)
        if not queue:
            del self._waiting[caller]
