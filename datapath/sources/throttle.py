"""A bandwidth cap on any network source (issue 28: imports that share the network fairly).

``Throttled(source, bytes_per_second)`` hands on the source's bytes no faster than the cap:
chunk *k* leaves once the bytes up to and including it would have taken that long at the cap
since the first byte arrived. The wrapped source reads ahead only as far as the data path's
back-pressure lets it (the HTTP source's parallel ranges: a few segments), so on the wire the
cap holds too, give or take that read-ahead at the start; ``benchmarks/bandwidth.py`` measures
how close. Applied once per import, above every connection the source opens (the HTTP source's
parallel ranges share it), and only to sources that read the network (HTTP, S3, GCS, a
registry): never to local files, a node-pulled image or an upload body.

The pacing is pure (``Pace``, a clock passed in) so it is tested without sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from datapath.sources import Source, SourceInfo

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class Pace:
    """When each chunk may leave, at ``rate`` bytes per second from the first chunk on."""

    def __init__(self, rate: int, clock: Clock = time.monotonic) -> None:
        if rate <= 0:
            raise ValueError(f"a bandwidth cap must be positive, not {rate}")
        self.rate, self.clock = rate, clock
        self.started: float | None = None
        self.sent = 0

    def delay(self, size: int) -> float:
        """Seconds to wait before handing on ``size`` more bytes (0: at once)."""
        now = self.clock()
        if self.started is None:
            self.started = now
        self.sent += size
        return max(0.0, self.started + self.sent / self.rate - now)


class Throttled:
    """``source`` with its bytes paced to ``rate`` bytes per second."""

    def __init__(self, source: Source, rate: int, sleep: Sleep = asyncio.sleep) -> None:
        Pace(rate)  # refuses a cap that is not positive, before anything is read
        self.source, self.rate, self._sleep = source, rate, sleep

    async def probe(self) -> SourceInfo:
        return await self.source.probe()

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        pace = Pace(self.rate)
        chunks = self.source.stream(start)
        try:
            async for chunk in chunks:
                wait = pace.delay(len(chunk))
                if wait > 0:
                    await self._sleep(wait)
                yield chunk
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()

    async def close(self) -> None:
        await self.source.close()
