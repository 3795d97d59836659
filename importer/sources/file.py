"""A local file as a source (the CLI's ``cdi import ./disk.qcow2 ...``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import aiofiles

from cdi.api.errors import SourceNotFound
from importer.sources import SourceInfo
from importer.streams import CHUNK_SIZE


class FileSource:
    def __init__(self, path: str) -> None:
        self.path = path

    async def probe(self) -> SourceInfo:
        try:
            return SourceInfo(size=os.stat(self.path).st_size, ranges=True)
        except FileNotFoundError as exc:
            raise SourceNotFound(f"source file {self.path} does not exist") from exc

    async def stream(self) -> AsyncIterator[bytes]:
        async with aiofiles.open(self.path, "rb") as fh:
            while chunk := await fh.read(CHUNK_SIZE):
                yield chunk

    async def close(self) -> None:
        return None
