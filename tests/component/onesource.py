"""A one-shot body for driving the processor the way an upload server would: an async iterator
of small pieces that refuses to be iterated twice (a request body cannot be re-read)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from cdi.api.termination import TerminationMessage
from datapath import Processor, ProcessPlan, StreamSource, TargetSpec

PIECE = 64 * 1024  # what aiohttp's iter_chunked hands out


class OneShotBody:
    def __init__(self, data: bytes, piece: int = PIECE) -> None:
        self.data = data
        self.piece = piece
        self.iterations = 0

    @classmethod
    def of(cls, path: Path) -> OneShotBody:
        return cls(path.read_bytes())

    def __aiter__(self) -> AsyncIterator[bytes]:
        self.iterations += 1
        if self.iterations > 1:
            raise AssertionError("a one-shot body was iterated twice")
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        view = memoryview(self.data)
        for at in range(0, len(view), self.piece):
            yield bytes(view[at : at + self.piece])
            if at % (16 * self.piece) == 0:
                await asyncio.sleep(0)  # a real body awaits its socket now and then


async def process_body(
    body: OneShotBody, target: Path, *, size: int | None = None, **plan: object
) -> TerminationMessage:
    spec = TargetSpec(path=str(target), block=False, size=size)
    return await Processor(ProcessPlan(target=spec, **plan), StreamSource(body)).run()  # type: ignore[arg-type]
