"""Sources: where image bytes come from. One module per source, all behind ``Source``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class SourceInfo:
    size: int | None  # bytes on the wire, when the source knows
    ranges: bool  # random access (HTTP Range) is available


class Source(Protocol):
    async def probe(self) -> SourceInfo: ...

    def stream(self) -> AsyncIterator[bytes]:
        """The source bytes from the first to the last, each exactly once."""
        ...

    async def close(self) -> None: ...
