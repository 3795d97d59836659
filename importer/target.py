"""Where decoded bytes land: a sparse ``disk.img`` or a raw block device.

``RawWriter`` writes at absolute offsets and skips all-zero 4 KiB blocks aligned to the image,
not to the chunk (so the result does not depend on how a decoder happened to cut its output;
perf-baselines section 4). Zero tests use ``bytes.startswith`` on a zero constant, a memcmp,
never ``memoryview == bytes``, which runs element by element at 0.5 GB/s (perf-baselines T6d).

On a fresh file a skipped block is a hole. On a block device a skipped block still holds whatever
was there, so unless the device is known to read zeros the skipped ranges are zeroed with
``fallocate(PUNCH_HOLE)`` (served as discard-with-zeroing or write-zeroes by the kernel), with
plain zero writes as the last resort.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import math
import mmap
import os
import stat
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from cdi.api.errors import InsufficientSpace, InvalidConfig, TargetError

ZERO_BLOCK = 64 * 1024
FINE_BLOCK = 4096  # the allocation unit of ext4/xfs: finer detection saves nothing
_ZERO = bytes(ZERO_BLOCK)
_ZERO_FINE = bytes(FINE_BLOCK)
_ZERO_WRITE = bytes(4 * 1024 * 1024)
_BLKGETSIZE64 = 0x80081272
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_FALLOC_FL_ZERO_RANGE = 0x10
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


@dataclass(frozen=True)
class TargetSpec:
    """What the worker was told to fill."""

    path: str
    block: bool
    size: int | None = None  # requested bytes; None = the image's own size (CLI only)
    filesystem_overhead: float = 0.0
    preallocate: bool = False
    zeroed: bool = False  # a block device known to read zeros (e.g. freshly provisioned)


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def block_device_size(fd: int) -> int:
    buf = fcntl.ioctl(fd, _BLKGETSIZE64, b"\x00" * 8)
    return int(struct.unpack("<Q", buf)[0])


def usable_space(available: int, overhead: float) -> int:
    """CDI's GetUsableSpace: room for the image once the filesystem takes its share, rounded
    down to MiB. The inverse of the renderer's ``size / (1 - overhead)`` PVC request."""
    if not overhead:
        return available
    mib = 1024 * 1024
    return (math.ceil((1 - overhead) * available) // mib) * mib


def open_target(spec: TargetSpec, *, truncate: bool = True) -> tuple[int, int | None]:
    """Open the target for writing; return (fd, capacity). A file is truncated to zero first,
    so anything not written is a hole and nothing from an earlier attempt survives (unless
    an interrupted import is being resumed)."""
    try:
        if spec.block:
            st = os.stat(spec.path)
            if not stat.S_ISBLK(st.st_mode):
                raise InvalidConfig(f"{spec.path} is not a block device")
            fd = os.open(spec.path, os.O_WRONLY | os.O_CLOEXEC)
            return fd, block_device_size(fd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_TRUNC if truncate else 0)
        fd = os.open(spec.path, flags, 0o660)
    except FileNotFoundError as exc:
        raise InvalidConfig(f"target {spec.path} does not exist: {exc.strerror}") from exc
    except OSError as exc:
        raise TargetError(f"cannot open target {spec.path}: {exc.strerror}") from exc
    if spec.size is None:
        return fd, None
    # The claim was sized as image / (1 - overhead): the image gets the claim minus the
    # overhead, and never more than the filesystem really has free (statfs already excludes
    # its metadata, so the overhead is not taken from it a second time, unlike CDI).
    usable = usable_space(spec.size, spec.filesystem_overhead)
    if spec.filesystem_overhead:
        vfs = os.fstatvfs(fd)
        usable = min(usable, (vfs.f_bavail * vfs.f_frsize) // (1 << 20) * (1 << 20))
    return fd, usable


class RawWriter:
    """Sparse writer of raw image bytes at absolute offsets, bounded by ``capacity``."""

    def __init__(
        self, fd: int, capacity: int | None, *, zero_fill: bool, direct: bool = False
    ) -> None:
        self.fd = fd
        self.capacity = capacity
        self.zero_fill = zero_fill  # explicitly zero skipped ranges (block device, not zeroed)
        self.position = 0  # end of the sequential stream
        self.extent = 0  # highest offset written or skipped
        self.bytes_written = 0
        self._direct = _DirectIO(fd) if direct else None

    def write(self, data: bytes) -> None:
        """Append ``data`` to the sequential stream."""
        self.write_at(self.position, data)
        self.position += len(data)

    def write_at(self, offset: int, data: bytes) -> None:
        self._claim(offset + len(data))
        run = zrun = -1  # starts (relative) of the pending data run and zero run
        for start, _stop, zero in page_segments(data, offset):
            if zero:
                if run >= 0:
                    self._pwrite(data, run, start, offset)
                    run = -1
                zrun = start if zrun < 0 else zrun
            else:
                if zrun >= 0:
                    self._zero(offset + zrun, start - zrun)
                    zrun = -1
                run = start if run < 0 else run
        if run >= 0:
            self._pwrite(data, run, len(data), offset)
        if zrun >= 0:
            self._zero(offset + zrun, len(data) - zrun)

    def _claim(self, end: int) -> None:
        """Refuse data past the usable size: a decompression bomb stops here."""
        if self.capacity is not None and end > self.capacity:
            raise InsufficientSpace(
                f"image data reaches byte {end}, beyond the target's usable size of "
                f"{self.capacity} bytes; a larger volume is required"
            )
        self.extent = max(self.extent, end)

    def write_data_at(self, offset: int, data: bytes) -> None:
        """Write ``data`` known to hold no all-zero page (a decoder already skipped those)."""
        self._claim(offset + len(data))
        self._pwrite(data, 0, len(data), offset)

    def _pwrite(self, data: bytes, start: int, stop: int, offset: int) -> None:
        mv = memoryview(data)[start:stop]
        at = offset + start
        try:
            if self._direct is not None and self._direct.write(mv, at):
                self.bytes_written += stop - start
                return
            while mv:
                done = os.pwrite(self.fd, mv, at)
                mv = mv[done:]
                at += done
        except OSError as exc:
            raise _map_write_error(exc) from exc
        self.bytes_written += stop - start

    def close(self) -> None:
        """Leave the fd as it was given (buffered); the fd itself belongs to the caller."""
        if self._direct is not None:
            self._direct.set(False)
            self._direct = None

    def _zero(self, offset: int, length: int) -> None:
        if self.zero_fill and length:
            self.zero_range(offset, length)

    def zero_range(self, offset: int, length: int) -> None:
        """Make ``[offset, offset+length)`` read as zeros, as cheaply as the device allows."""
        for mode in (_FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, _FALLOC_FL_ZERO_RANGE):
            try:
                fallocate(self.fd, mode, offset, length)
                return
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV):
                    raise _map_write_error(exc) from exc
        while length:  # last resort: the device cannot zero ranges itself
            step = min(length, len(_ZERO_WRITE))
            self._pwrite(_ZERO_WRITE, 0, step, offset)
            offset += step
            length -= step

    def finish(self, size: int | None, *, preallocate: bool, block: bool) -> None:
        """Give a file its final size (holes at the end), optionally allocate it, and fsync."""
        try:
            if not block and size is not None:
                os.ftruncate(self.fd, size)
                if preallocate:
                    os.posix_fallocate(self.fd, 0, size)
            os.fsync(self.fd)
        except OSError as exc:
            raise _map_write_error(exc) from exc


class _DirectIO:
    """O_DIRECT writes of 4 KiB-aligned runs through a page-aligned bounce buffer.

    Buffered writes pay for page-cache allocation, which on a VM with free-page reporting costs
    about 1.2 s per GiB when memory is cold; O_DIRECT skips the page cache and is the fastest
    way to a file or loop device here (perf-baselines 2.4, T1b). Unaligned pieces (an image
    edge, 512-byte qcow2 clusters) go through the page cache; O_DIRECT is toggled on the same
    fd with F_SETFL only when the kind of write changes. A filesystem without O_DIRECT (tmpfs)
    just keeps the buffered path.
    """

    ALIGN = 4096
    BUFFER = 8 * 1024 * 1024

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.on = False
        self.usable = True
        self.buffer = mmap.mmap(-1, self.BUFFER)  # page aligned

    def set(self, on: bool) -> None:
        if on == self.on:
            return
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_DIRECT if on else flags & ~os.O_DIRECT)
        self.on = on

    def write(self, mv: memoryview, offset: int) -> bool:
        """Write ``mv`` at ``offset`` with O_DIRECT if it is aligned; False if not done."""
        if not self.usable or offset % self.ALIGN or len(mv) % self.ALIGN:
            self.set(False)
            return False
        try:
            self.set(True)
            while mv:
                n = min(len(mv), self.BUFFER)
                self.buffer[:n] = mv[:n]
                done = os.pwrite(self.fd, memoryview(self.buffer)[:n], offset)
                mv, offset = mv[done:], offset + done
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self.set(False)  # this filesystem refuses O_DIRECT: stay buffered
            self.usable = False
            return False
        return True


def page_segments(data: bytes, offset: int) -> Iterator[tuple[int, int, bool]]:
    """(start, stop, all_zero) pieces of ``data`` aligned to absolute 4 KiB blocks.

    A 64 KiB block is tested first in one memcmp; only blocks holding data are looked at in
    4 KiB steps (a data block fails its memcmp at the first non-zero byte, so this is cheap).
    """
    pos, n = 0, len(data)
    while pos < n:
        step = min(n - pos, ZERO_BLOCK - (offset + pos) % ZERO_BLOCK)
        if data.startswith(_ZERO if step == ZERO_BLOCK else _ZERO[:step], pos):
            yield pos, pos + step, True
        else:
            stop = pos + step
            while pos < stop:
                small = min(stop - pos, FINE_BLOCK - (offset + pos) % FINE_BLOCK)
                zero = _ZERO_FINE if small == FINE_BLOCK else _ZERO[:small]
                yield pos, pos + small, data.startswith(zero, pos)
                pos += small
            continue
        pos += step


def _map_write_error(exc: OSError) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return InsufficientSpace(f"target volume is full: {exc.strerror}")
    return TargetError(f"writing the target failed: {exc.strerror}")
