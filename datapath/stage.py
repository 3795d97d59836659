"""A bounded hand-off from the event loop to one worker thread.

The event loop only moves bytes off the network; decompression, hashing and writing run on
threads (CONVENTIONS: no CPU work on the loop). The thread consumes an ordinary iterator, so the
code it runs is plain synchronous Python. At most ``max_bytes`` are queued (a chunk is always
accepted into an empty queue), which bounds memory; the per-chunk cost is one queue operation
and an uncontended lock, and a waiting producer is woken only once the queue is half empty
(profiling showed a per-chunk wake-up's self-pipe write costing ~0.2 s per 2 GiB image).
8 MiB (two chunks) keeps the decoder fed at loopback speed: the socket buffers behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class StageAborted(Exception):
    """Raised inside the consumer when the producer gives up."""


_END = object()
_ABORT = object()


class ThreadStage(Generic[T]):
    def __init__(
        self, consume: Callable[[Iterator[bytes]], T], *, max_bytes: int = 8 << 20, name: str
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._pending = 0  # bytes queued and not yet taken by the consumer
        self._waiter: asyncio.Future[None] | None = None  # a producer waiting for room
        self._max = max_bytes
        self._consume = consume
        self._done: asyncio.Future[T] = self._loop.create_future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _iterate(self) -> Iterator[bytes]:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if item is _ABORT:
                raise StageAborted("producer aborted")
            assert isinstance(item, bytes)
            self._taken(len(item))
            yield item

    def _taken(self, size: int) -> None:
        """Wake a waiting producer only once the queue is half empty: one cross-thread wake-up
        per max_bytes/2 instead of one per chunk (each costs a self-pipe write)."""
        with self._lock:
            self._pending -= size
            waiter = self._waiter if self._pending <= self._max // 2 else None
            if waiter is not None:
                self._waiter = None
        if waiter is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(_wake, waiter)

    def _run(self) -> None:
        outcome: tuple[T | None, BaseException | None]
        try:
            outcome = (self._consume(self._iterate()), None)
        except BaseException as exc:  # handed to the event loop, re-raised by finish()
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is waiting
            self._loop.call_soon_threadsafe(self._complete, outcome)

    def _complete(self, outcome: tuple[T | None, BaseException | None]) -> None:
        result, exc = outcome
        if not self._done.done():
            if exc is not None:
                self._done.set_exception(exc)
            else:
                self._done.set_result(result)  # type: ignore[arg-type]
        with self._lock:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)  # a producer waiting for room learns the consumer has ended

    async def put(self, chunk: bytes) -> None:
        """Queue ``chunk``; raise the consumer's error if it failed, drop it if it finished."""
        while True:
            if self._done.done():
                if self._done.exception() is not None:
                    raise self._done.exception()  # type: ignore[misc]
                return
            with self._lock:
                if self._pending == 0 or self._pending + len(chunk) <= self._max:
                    self._pending += len(chunk)
                    self._queue.put(chunk)
                    return
                waiter = self._waiter = self._loop.create_future()
            await waiter

    async def finish(self) -> T:
        self._queue.put(_END)
        return await self._done

    async def abort(self) -> None:
        self._queue.put(_ABORT)
        try:
            await self._done
        except BaseException:
            pass


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
