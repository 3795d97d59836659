"""Parallel ranged download, delivered in order with bounded memory.

When a server supports ranges and the size is known, ``connections`` segments are fetched at
once and handed on strictly in file order, so the checksum and the decoders still see each byte
exactly once and in sequence. At most ``connections`` segments are in flight and one is being
consumed, so memory is ``(connections + 1) * segment`` whatever the image size. This pays off
when a server or a network path throttles each connection; on an unthrottled loopback it costs
about nothing. A segment cut short is re-requested from its last byte, bounded by the source's
shared cut budget.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable

from datapath.streams import CHUNK_SIZE

# Fetch bytes [start, end) and return them as chunks; raise on failure after its retries.
RangeFetcher = Callable[[int, int], Awaitable[list[bytes]]]


class RangesUnsupported(Exception):
    """The server answered a range request with the whole body: use one stream instead."""


async def parallel_ranges(
    fetch: RangeFetcher,
    size: int,
    start: int = 0,
    *,
    connections: int = 4,
    segment: int = CHUNK_SIZE,
) -> AsyncIterator[bytes]:
    offsets = iter(range(start, size, segment))
    window: deque[asyncio.Task[list[bytes]]] = deque()

    def launch() -> None:
        offset = next(offsets, None)
        if offset is not None:
            window.append(asyncio.ensure_future(fetch(offset, min(offset + segment, size))))

    # The first segment alone tells whether ranges really work, before fanning out.
    launch()
    first = await window.popleft()
    for _ in range(connections):
        launch()
    try:
        for chunk in first:
            yield chunk
        while window:
            pieces = await window.popleft()
            launch()
            for chunk in pieces:
                yield chunk
    finally:
        for task in window:
            task.cancel()
        for task in window:
            with contextlib.suppress(BaseException):
                await task
