"""The open target between phases: one owner for the descriptor, opened off the event loop.

The phase machine opens the target at Info, closes it before qemu-img writes the same path and
reopens it to finish (size, preallocate, fsync). ``TargetHandle`` is the only holder of that
descriptor, so no phase can leak or double-close it, and every blocking call it makes (open,
ioctl, fstatvfs, ftruncate, fallocate, fsync, chmod) runs on a worker thread.
"""

from __future__ import annotations

import asyncio
import os
import stat
from types import TracebackType
from typing import TYPE_CHECKING

from datapath.target.nofollow import open_regular
from datapath.target.spec import TargetSpec, open_target
from datapath.target.writer import RawWriter, map_write_error

if TYPE_CHECKING:
    from datapath.verify import WriteDigest


def preallocate_tree(root: str) -> int:
    """Allocate every regular file under ``root`` whole (a filesystem clone's ``disk.img``
    arrives as a sparse tar member): CDI has its clone source send the zeros instead; here
    they never cross the network. Links are not followed (``lstat``, ``open_regular``).
    Returns the bytes allocated for."""
    total = 0
    for folder, _dirs, files in os.walk(root, followlinks=False):
        for name in files:
            path = os.path.join(folder, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            fd = open_regular(path, os.O_WRONLY)
            try:
                size = os.fstat(fd).st_size
                if size:
                    os.posix_fallocate(fd, 0, size)
                os.fsync(fd)
            except OSError as exc:
                raise map_write_error(exc) from exc
            finally:
                os.close(fd)
            total += size
    return total


class TargetHandle:
    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        self.fd = -1
        self.capacity: int | None = None  # usable bytes, known once opened

    @property
    def is_open(self) -> bool:
        return self.fd >= 0

    async def open(self, *, truncate: bool = True) -> None:
        """(Re)open for writing; a file is truncated unless an interrupted import resumes."""
        self.close()
        self.fd, self.capacity = await asyncio.to_thread(open_target, self.spec, truncate=truncate)

    async def reopen_existing(self) -> None:
        """Open what another writer (qemu-img) left at the path, without truncating it: the
        block device itself (``open_target`` checks it is one), else the regular file."""
        self.close()
        if self.spec.block:
            self.fd, _ = await asyncio.to_thread(open_target, self.spec, truncate=False)
            return
        self.fd = await asyncio.to_thread(open_regular, self.spec.path, os.O_WRONLY)

    def writer(
        self,
        *,
        direct: bool = False,
        zero_fill: bool | None = None,
        digest: WriteDigest | None = None,
    ) -> RawWriter:
        """A writer on the open descriptor; by default skipped ranges are zeroed only on a
        block device not known to read zeros. ``digest`` is told what it writes (verify.py)."""
        assert self.is_open, "the target is not open"
        if zero_fill is None:
            zero_fill = self.spec.block and not self.spec.zeroed
        return RawWriter(self.fd, self.capacity, direct=direct, zero_fill=zero_fill, digest=digest)

    async def zero_all(self) -> None:
        """Make the whole device read zeros (random-order writes leave gaps)."""
        assert self.capacity is not None
        writer = self.writer(zero_fill=True)
        await asyncio.to_thread(writer.zero_range, 0, self.capacity)

    async def finish(self, size: int | None) -> None:
        """Final size (files grow to the usable size, never shrink), preallocation, fsync and
        the file mode CDI gives disk.img."""
        spec = self.spec
        if not spec.block and self.capacity is not None and size is not None:
            size = max(size, self.capacity)
        writer = self.writer(zero_fill=False)
        await asyncio.to_thread(writer.finish, size, preallocate=spec.preallocate, block=spec.block)
        if not spec.block:
            await asyncio.to_thread(os.chmod, spec.path, 0o660)
            if spec.owner is not None and os.geteuid() == 0:
                await asyncio.to_thread(os.chown, spec.path, *spec.owner)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> TargetHandle:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
