"""An upload's bytes as one data-path ``Source`` fed by one or more request bodies.

CDI's upload server reads one request body and is done; a cut connection loses everything.
Here the source outlives a request: each POST or PATCH *attaches* its body at the offset the
source has reached, the processor pulls the bytes through it, and when a body is cut the
source simply waits for the next attachment (tus 1.0 core: HEAD answers ``offset``, PATCH
continues there). The decoder on the other side never notices the gap, so any format resumes
while the pod lives. A source left waiting longer than ``idle_timeout`` gives up with a typed
error (the processor then discards its partial target), and a new upload may start from 0.

``offset`` counts the bytes handed to the pipeline: once yielded they are the decoder's, and a
body's bytes still in aiohttp's buffer when its connection died are simply sent again.

The source says it has ranges and a validator only for an upload of known length, which is
what lets the data path checkpoint a raw image durably (``datapath.run_files``), so a raw
upload also survives a restart of the pod: the next PATCH builds a source starting at the
checkpoint's offset (``start``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field

from cdi.api.errors import WorkerError
from datapath import SourceConsumed, SourceInfo
from datapath.sources.stream import coalesce


class UploadAbandoned(WorkerError):
    """A cut upload was not continued in time, or a new upload replaced it."""

    reason = "UploadAbandoned"


class UploadTooLong(WorkerError):
    """More bytes arrived than the upload's declared length."""

    reason = "UploadTooLong"


class OffsetMismatch(Exception):
    """A body was attached at an offset other than the source's (tus answers 409)."""


class Busy(Exception):
    """A body is still attached: another request is sending this upload's bytes (503)."""


@dataclass
class Feed:
    """One request's body attached to the source; ``ended`` resolves to True when the body was
    read to its end, False when it was cut (the request's connection died) and None when the
    data path stopped reading it (it failed or is closing: its own answer follows)."""

    pieces: AsyncIterable[bytes]
    ended: asyncio.Future[bool | None] = field(default_factory=lambda: asyncio.Future())

    def end(self, complete: bool | None) -> None:
        if not self.ended.done():
            self.ended.set_result(complete)


def validator_for(length: int) -> str:
    return f"upload-length:{length}"


class UploadBody:
    def __init__(self, *, length: int | None, idle_timeout: float, start: int = 0) -> None:
        self.length = length
        self.offset = start
        self.idle_timeout = idle_timeout
        self.finished = False  # every byte of the upload is in
        self._feed: Feed | None = None
        self._changed = asyncio.Event()
        self._abandoned: str | None = None
        self._streamed = False

    @property
    def attached(self) -> bool:
        return self._feed is not None

    async def probe(self) -> SourceInfo:
        known = self.length is not None
        validator = validator_for(self.length) if self.length is not None else None
        return SourceInfo(size=self.length, ranges=known, validator=validator, replayable=False)

    def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        if self._streamed:
            raise SourceConsumed("an upload's bytes can be read only once")
        if start != self.offset:
            raise UploadAbandoned(
                f"the upload server restarted and cannot continue at byte {self.offset} "
                f"(its checkpoint allows {start}); start the upload again from byte 0"
            )
        self._streamed = True
        return coalesce(self._pieces())

    def attach(self, pieces: AsyncIterable[bytes], at: int) -> Feed:
        if self._feed is not None:
            raise Busy("another request is sending this upload's bytes")
        if at != self.offset or self.finished or self._abandoned:
            raise OffsetMismatch(f"Upload-Offset {at} does not match {self.offset}")
        self._feed = Feed(pieces)
        self._changed.set()
        return self._feed

    def abandon(self, why: str) -> None:
        """Give up on this upload: a waiting ``stream`` raises ``UploadAbandoned``."""
        self._abandoned = why
        self._changed.set()

    async def close(self) -> None:
        feed, self._feed = self._feed, None
        if feed is not None:
            feed.end(None)

    async def _next_feed(self) -> Feed:
        while self._feed is None:
            if self._abandoned:
                raise UploadAbandoned(self._abandoned)
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), self.idle_timeout)
            except TimeoutError:
                self.abandon(
                    f"the upload was cut at byte {self.offset} and not continued within "
                    f"{self.idle_timeout:g} s; a new upload starts from byte 0"
                )
        return self._feed

    async def _pieces(self) -> AsyncIterator[bytes]:
        while not self.finished:
            feed = await self._next_feed()
            it = aiter(feed.pieces)
            complete: bool | None = None
            try:
                while True:
                    try:
                        piece = await anext(it)
                    except StopAsyncIteration:
                        complete = True
                        break
                    except Exception:  # the connection died: wait for the next request
                        complete = False
                        with contextlib.suppress(Exception):
                            await _aclose(it)
                        break
                    self.offset += len(piece)
                    if self.length is not None and self.offset > self.length:
                        raise UploadTooLong(f"more than the declared {self.length} bytes arrived")
                    yield piece
            finally:
                self._feed = None
                if complete and (self.length is None or self.offset >= self.length):
                    self.finished = True
                feed.end(complete)


async def _aclose(it: AsyncIterator[bytes]) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        await aclose()
