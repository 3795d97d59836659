"""A local file as a source (the CLI's ``cdi import ./disk.qcow2 ...``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import aiofiles

from cdi.api.errors import SourceNotFound
from datapath.sources import SourceInfo
from datapath.streams import CHUNK_SIZE


class FileSource:
    def __init__(self, path: str) -> None:
        self.path = path

    async def probe(self) -> SourceInfo:
        try:
            st = os.stat(self.path)
            return SourceInfo(size=st.st_size, ranges=True, validator=f"mtime:{st.st_mtime_ns}")
        except FileNotFoundError as exc:
            raise SourceNotFound(f"source file {self.path} does not exist") from exc

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        async with aiofiles.open(self.path, "rb") as fh:
            await fh.seek(start)
            while chunk := await fh.read(CHUNK_SIZE):
                yield chunk

    async def close(self) -> None:
        return None
