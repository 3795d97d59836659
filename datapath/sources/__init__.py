"""Sources: where image bytes come from. One module per source, all behind ``Source``.

A source says what it knows about its bytes (``probe``) and streams them once per call. Whether
a second ``stream()`` returns the same bytes again is part of the answer (``replayable``): a
file, a block device or an HTTP URL can be read again, a request body cannot. The processor
chooses its fallbacks from that answer and never streams a one-shot source twice.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from cdi.api.errors import WorkerError


@dataclass(frozen=True)
class SourceInfo:
    size: int | None  # bytes on the wire, when the source knows
    ranges: bool  # random access (HTTP Range) is available
    validator: str | None = None  # ETag or Last-Modified: identifies this version of the bytes
    replayable: bool = True  # stream() may be called again and yields the same bytes


class Source(Protocol):
    async def probe(self) -> SourceInfo: ...

    def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        """The source bytes from ``start`` to the last, each exactly once per call."""
        ...

    async def close(self) -> None: ...


class SourceConsumed(WorkerError):
    """A one-shot source was asked for its bytes a second time: a bug in the caller, reported
    as a typed failure instead of silently streaming only what was left."""

    reason = "SourceConsumed"
    transient = False
