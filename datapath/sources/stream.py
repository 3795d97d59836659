"""A one-shot byte stream as a source: an upload's request body, a pipe.

``StreamSource`` wraps any ``AsyncIterable[bytes]`` (an iterator is one). It cannot be
re-read (``replayable`` is False, so the processor never plans a second pass), and a second
``stream()`` raises ``SourceConsumed`` instead of quietly yielding only the unread rest. It
coalesces small pieces into ``CHUNK_SIZE`` chunks, because every chunk costs a queue hand-off
to the decode and hash threads; pieces of ``PASS_SIZE`` or more pass through as they are. An
upload body over TLS arrives in 256-512 KiB pieces (asyncio reads 256 KiB at a time and aiohttp
joins what is buffered): joining those into 4 MiB copied every byte once more on the event loop
(13 % of the upload server's samples in a clone), while handing them on costs one queue
operation each (~2,500 per 600 MB).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

from cdi.api.errors import InvalidConfig
from datapath.sources import SourceConsumed, SourceInfo
from datapath.streams import CHUNK_SIZE

PASS_SIZE = 128 * 1024  # a piece this large costs less to hand on than to copy


class StreamSource:
    def __init__(
        self, chunks: AsyncIterable[bytes], *, size: int | None = None, chunk_size: int = CHUNK_SIZE
    ) -> None:
        self._chunks: AsyncIterable[bytes] | None = chunks
        self._size = size
        self._chunk_size = chunk_size

    async def probe(self) -> SourceInfo:
        return SourceInfo(size=self._size, ranges=False, replayable=False)

    def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        if self._chunks is None:
            raise SourceConsumed("this source is a one-shot stream and was already read")
        if start:
            raise InvalidConfig("a one-shot stream cannot start past its first byte")
        chunks, self._chunks = self._chunks, None
        return coalesce(chunks, self._chunk_size)

    async def close(self) -> None:
        chunks, self._chunks = self._chunks, None
        aclose = getattr(chunks, "aclose", None)
        if aclose is not None:
            await aclose()


async def coalesce(
    chunks: AsyncIterable[bytes], size: int = CHUNK_SIZE, pass_size: int = PASS_SIZE
) -> AsyncIterator[bytes]:
    """The same bytes, small pieces joined into chunks of about ``size`` bytes; pieces of at
    least ``min(pass_size, size)`` pass through uncopied (after any small ones held before)."""
    parts: list[bytes] = []
    held = 0
    passing = min(pass_size, size)
    async for piece in chunks:
        if not piece:
            continue
        if len(piece) >= passing:
            if held:
                yield b"".join(parts)
                parts, held = [], 0
            yield piece
            continue
        parts.append(piece)
        held += len(piece)
        if held >= size:
            yield b"".join(parts)
            parts, held = [], 0
    if held:
        yield b"".join(parts)
