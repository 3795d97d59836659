"""Where decoded bytes land: a sparse ``disk.img`` or a raw block device.

``RawWriter`` writes at absolute offsets and skips all-zero 4 KiB blocks aligned to the image,
not to the chunk (so the result does not depend on how a decoder happened to cut its output;
perf-baselines section 4; pages are classified by ``zeros.page_segments``).

On a fresh file a skipped block is a hole. On a block device a skipped block still holds whatever
was there, so unless the device is known to read zeros the skipped ranges are zeroed with
``fallocate(PUNCH_HOLE)`` (served as discard-with-zeroing or write-zeroes by the kernel), with
plain zero writes as the last resort.
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import TYPE_CHECKING

from cdi.api.errors import InsufficientSpace, TargetError
from datapath.target.directio import _DirectIO, _pwrite_all
from datapath.target.zeros import page_segments

if TYPE_CHECKING:
    from datapath.verify import WriteDigest

_ZERO_WRITE = bytes(4 * 1024 * 1024)
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_FALLOC_FL_ZERO_RANGE = 0x10
# The process's own symbols include libc's; ctypes.util.find_library would run ldconfig.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


class RawWriter:
    """Sparse writer of raw image bytes at absolute offsets, bounded by ``capacity``.

    One writer belongs to one thread. Threads that write one target at once each take a
    ``lane``: a writer of its own on the same fd (pwrite and fallocate are safe to share), with
    its own counters and its own O_DIRECT descriptor, buffers and writer thread, so lanes share
    no mutable state and need no lock; ``absorb`` folds a finished lane's counters back.

    With a ``digest`` (a verified volume, ``datapath.verify``) every piece written and every
    range left zero is told to it here, the one place all writes of the data path pass, so the
    run can compare the target with it once it is durable. Lanes share the writer's digest.
    """

    def __init__(
        self,
        fd: int,
        capacity: int | None,
        *,
        zero_fill: bool,
        direct: bool = False,
        writers: int = 3,
        buffer: int = 2 * 1024 * 1024,
        digest: WriteDigest | None = None,
    ) -> None:
        self.fd = fd
        self.digest = digest
        self.capacity = capacity
        self.zero_fill = zero_fill  # explicitly zero skipped ranges (block device, not zeroed)
        self.position = 0  # end of the sequential stream
        self.extent = 0  # highest offset written or skipped
        self.bytes_written = 0
        self._direct = _DirectIO(fd, writers, buffer) if direct else None

    def lane(self) -> RawWriter:
        """A writer of the same target for another thread (see the class docstring). One
        O_DIRECT write in flight and 1 MiB buffers: lanes write pieces of that size, and there
        are as many lanes as decoding threads."""
        direct = self._direct is not None
        return RawWriter(
            self.fd,
            self.capacity,
            zero_fill=self.zero_fill,
            direct=direct,
            writers=1,
            buffer=1 << 20,
            digest=self.digest,  # shared: one bound for all partial blocks, calls locked
        )

    def absorb(self, lane: RawWriter) -> None:
        """Wait for a lane's writes (raising the first that failed) and count them."""
        lane.flush()
        self.bytes_written += lane.bytes_written
        self.extent = max(self.extent, lane.extent)

    def write(self, data: bytes) -> None:
        """Append ``data`` to the sequential stream."""
        self.write_at(self.position, data)
        self.position += len(data)

    def skip_to(self, offset: int) -> None:
        """Move the sequential stream to ``offset`` over bytes known to be zeros: a hole, or
        zeroed on a device not known to read zeros (``zero_fill``), as zero pages written."""
        self._claim(offset)
        self._zero(self.position, offset - self.position)
        self.position = offset

    def write_at(self, offset: int, data: bytes) -> None:
        self._claim(offset + len(data))
        for start, stop, zero in page_segments(data, offset):  # maximal runs, alternating
            if zero:
                self._zero(offset + start, stop - start)
            else:
                self._pwrite(data, start, stop, offset)

    def ensure_room(self, end: int) -> None:
        """Refuse data past the usable size: a decompression bomb stops here."""
        if self.capacity is not None and end > self.capacity:
            raise InsufficientSpace(
                f"image data reaches byte {end}, beyond the target's usable size of "
                f"{self.capacity} bytes; a larger volume is required"
            )

    def _claim(self, end: int) -> None:
        self.ensure_room(end)
        self.extent = max(self.extent, end)

    def write_data_at(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` known to hold no all-zero page (a decoder already skipped those)."""
        self._claim(offset + len(data))
        self._pwrite(data, 0, len(data), offset)

    def _pwrite(
        self, data: bytes | memoryview, start: int, stop: int, offset: int, *, meant: bool = True
    ) -> None:
        mv = memoryview(data)[start:stop]
        if meant and self.digest is not None:  # not zeros written in place of a hole
            self.digest.add(offset + start, mv)
        try:
            if self._direct is not None:
                self._direct.write(mv, offset + start)
            else:
                _pwrite_all(self.fd, mv, offset + start)
        except OSError as exc:
            raise map_write_error(exc) from exc
        self.bytes_written += stop - start

    def flush(self) -> None:
        """Wait for the writes in flight and raise the first that failed. A decoder calls this
        before it reports success, and a checkpoint before its fdatasync."""
        if self._direct is not None:
            try:
                self._direct.drain()
            except OSError as exc:
                raise map_write_error(exc) from exc

    def close(self) -> None:
        """Wait for the writes in flight; the fd itself belongs to the caller."""
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    def _zero(self, offset: int, length: int) -> None:
        if self.digest is not None and length:
            self.digest.zeros(offset, length)
        if self.zero_fill and length:
            self.zero_range(offset, length)

    def zero_range(self, offset: int, length: int) -> None:
        """Make ``[offset, offset+length)`` read as zeros, as cheaply as the device allows.
        Safe beside the writes in flight: they never cover this range."""
        for mode in (_FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, _FALLOC_FL_ZERO_RANGE):
            try:
                fallocate(self.fd, mode, offset, length)
                return
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENODEV):
                    raise map_write_error(exc) from exc
        while length:  # last resort: the device cannot zero ranges itself
            step = min(length, len(_ZERO_WRITE))
            self._pwrite(_ZERO_WRITE, 0, step, offset, meant=False)
            offset += step
            length -= step

    def finish(self, size: int | None, *, preallocate: bool, block: bool) -> None:
        """Give a file its final size (holes at the end), optionally allocate it, and fsync."""
        self.flush()
        try:
            if not block and size is not None:
                os.ftruncate(self.fd, size)
                if preallocate:
                    os.posix_fallocate(self.fd, 0, size)
            os.fsync(self.fd)
        except OSError as exc:
            raise map_write_error(exc) from exc


def map_write_error(exc: OSError) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return InsufficientSpace(f"target volume is full: {exc.strerror}")
    return TargetError(f"writing the target failed: {exc.strerror}")
