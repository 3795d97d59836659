"""Sources: where image bytes come from. One module per source, all behind ``Source``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SourceInfo:
    size: int | None  # bytes on the wire, when the source knows
    ranges: bool  # random access (HTTP Range) is available
    validator: str | None = None  # ETag or Last-Modified: identifies this version of the bytes


class Source(Protocol):
    async def probe(self) -> SourceInfo: ...

    def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        """The source bytes from ``start`` to the last, each exactly once."""
        ...

    async def close(self) -> None: ...
