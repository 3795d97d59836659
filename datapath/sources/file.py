"""Local files and block devices as sources (the CLI's ``cdi import ./disk.qcow2``, a clone's
source volume).

Both are read with ``os.preadv`` into fresh buffers on a worker thread, one ``CHUNK_SIZE`` read
per step, so the event loop never waits on the disk. A block device's ``st_size`` is 0, so
``BlockSource`` asks the kernel for the device size (BLKGETSIZE64) instead.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from cdi.api.errors import SourceNotFound, SourceUnavailable
from datapath.sources import SourceInfo
from datapath.streams import CHUNK_SIZE
from datapath.target.spec import block_device_size


class FileSource:
    """A regular file: replayable, with random access."""

    def __init__(self, path: str) -> None:
        self.path = path

    async def probe(self) -> SourceInfo:
        try:
            st = await asyncio.to_thread(os.stat, self.path)
        except FileNotFoundError as exc:
            raise SourceNotFound(f"source file {self.path} does not exist") from exc
        except OSError as exc:
            raise SourceUnavailable(f"source {self.path}: {exc.strerror}") from exc
        size = await asyncio.to_thread(self._size)
        return SourceInfo(size=size, ranges=True, validator=f"mtime:{st.st_mtime_ns}")

    def _size(self) -> int:
        return os.stat(self.path).st_size

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        fd = await asyncio.to_thread(self._open)
        try:
            offset = start
            while chunk := await asyncio.to_thread(os.pread, fd, CHUNK_SIZE, offset):
                offset += len(chunk)
                yield chunk
        finally:
            os.close(fd)

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise SourceNotFound(f"source file {self.path} does not exist") from exc
        except OSError as exc:
            raise SourceUnavailable(f"source {self.path}: {exc.strerror}") from exc

    async def close(self) -> None:
        return None


class BlockSource(FileSource):
    """A block device (a clone's source volume): its size comes from BLKGETSIZE64."""

    def _size(self) -> int:
        fd = self._open()
        try:
            return block_device_size(fd)
        finally:
            os.close(fd)
