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

import contextlib
import ctypes
import errno
import fcntl
import math
import mmap
import os
import re
import stat
import struct
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from cdi.api.errors import InsufficientSpace, InvalidConfig, TargetError

ZERO_BLOCK = 64 * 1024
FINE_BLOCK = 4096  # the allocation unit of ext4/xfs: finer detection saves nothing
_ZERO = bytes(ZERO_BLOCK)
_ZERO_FINE = bytes(FINE_BLOCK)
_ZERO_WRITE = bytes(4 * 1024 * 1024)
# Bytes looked at in every page before it is memcmp'd: first, last, and spread in between.
_SAMPLES = (0, 512, 1024, 1536, 2048, 2560, 3072, 3584, FINE_BLOCK - 1)
_NONZERO = re.compile(b"[^\\x00]")
_BLKGETSIZE64 = 0x80081272
_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_FALLOC_FL_ZERO_RANGE = 0x10
# The process's own symbols include libc's; ctypes.util.find_library would run ldconfig.
_libc = ctypes.CDLL(None, use_errno=True)
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
    """Sparse writer of raw image bytes at absolute offsets, bounded by ``capacity``.

    One writer belongs to one thread. Threads that write one target at once each take a
    ``lane``: a writer of its own on the same fd (pwrite and fallocate are safe to share), with
    its own counters and its own O_DIRECT descriptor, buffers and writer thread, so lanes share
    no mutable state and need no lock; ``absorb`` folds a finished lane's counters back.
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
    ) -> None:
        self.fd = fd
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

    def _pwrite(self, data: bytes | memoryview, start: int, stop: int, offset: int) -> None:
        mv = memoryview(data)[start:stop]
        try:
            if self._direct is not None:
                self._direct.write(mv, offset + start)
            else:
                _pwrite_all(self.fd, mv, offset + start)
        except OSError as exc:
            raise _map_write_error(exc) from exc
        self.bytes_written += stop - start

    def flush(self) -> None:
        """Wait for the writes in flight and raise the first that failed. A decoder calls this
        before it reports success, and a checkpoint before its fdatasync."""
        if self._direct is not None:
            try:
                self._direct.drain()
            except OSError as exc:
                raise _map_write_error(exc) from exc

    def close(self) -> None:
        """Wait for the writes in flight; the fd itself belongs to the caller."""
        if self._direct is not None:
            self._direct.close()
            self._direct = None

    def _zero(self, offset: int, length: int) -> None:
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
                    raise _map_write_error(exc) from exc
        while length:  # last resort: the device cannot zero ranges itself
            step = min(length, len(_ZERO_WRITE))
            self._pwrite(_ZERO_WRITE, 0, step, offset)
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
            raise _map_write_error(exc) from exc


class _DirectIO:
    """O_DIRECT writes, several in flight, through page-aligned buffers; any piece accepted.

    Buffered writes pay for page-cache allocation, which on a VM with free-page reporting costs
    about 1.2 s per GiB when memory is cold; O_DIRECT skips the page cache and is the fastest
    way to a file or loop device here (perf-baselines 2.4, T1b). One synchronous O_DIRECT write
    at a time leaves the disk idle between requests (600 MB of qcow2 clusters took 0.49 s, half
    the disk's speed), so like ``qemu-img convert -t none -m N`` we keep ``writers`` writes in
    flight on a small thread pool (pwrite releases the GIL).

    The caller's pieces are copied (a memcpy: Python bytes are not aligned) into a bounce
    buffer that starts on a page; pieces that continue each other are gathered whatever their
    lengths, so a decoder may cut its output anywhere (a VDI block split by a chunk boundary at
    an odd offset). A full buffer, or a piece that does not continue it, starts a write of the
    buffer's whole pages; a partial page left at the end of a run, or at the start of a run
    that begins mid-page, is written through the page cache on the caller's own fd (it never
    shares a page with an O_DIRECT write, and the final fsync covers both). The O_DIRECT writes
    go through a second open file description of the same file, so the caller's fd keeps its
    flags and nothing is ever toggled. When all buffers are busy the caller waits for the
    oldest write, which bounds memory to ``(writers + 1) * buffer``. Writes may land out of
    order; callers never write one range twice.

    A filesystem without O_DIRECT (tmpfs on old kernels) refuses the open or the first write
    with EINVAL: from then on everything is written through the page cache.
    """

    ALIGN = 4096

    def __init__(self, fd: int, writers: int, buffer: int) -> None:
        self.fd = fd  # buffered: partial pages
        self.dfd = _reopen_direct(fd)  # O_DIRECT, or -1 when the filesystem has none
        self.direct = self.dfd >= 0  # False once the filesystem refused an O_DIRECT write
        self.writers, self.buffer = writers, buffer
        self._free = [mmap.mmap(-1, self.buffer) for _ in range(self.writers + 1)]  # aligned
        self._inflight: deque[tuple[Future[None], mmap.mmap, int, int]] = deque()
        self._pool: ThreadPoolExecutor | None = None
        self._fill: mmap.mmap | None = None  # the buffer being filled with contiguous pieces
        self._fill_at = 0  # target offset of its first byte (page aligned)
        self._fill_len = 0

    def write(self, mv: memoryview, offset: int) -> None:
        if not self.direct:
            _pwrite_all(self.fd, mv, offset)
            return
        if self._fill is not None and offset != self._fill_at + self._fill_len:
            self._submit()
        if self._fill is None:
            head = min(len(mv), -offset % self.ALIGN)
            if head:  # the run starts mid-page: that page goes through the page cache
                _pwrite_all(self.fd, mv[:head], offset)
                mv, offset = mv[head:], offset + head
        while mv:
            if self._fill is None:
                self._fill = self._free.pop() if self._free else self._reap()
                self._fill_at, self._fill_len = offset, 0
            n = min(len(mv), self.buffer - self._fill_len)
            self._fill[self._fill_len : self._fill_len + n] = mv[:n]
            self._fill_len += n
            mv, offset = mv[n:], offset + n
            if self._fill_len == self.buffer:
                self._submit()

    def _submit(self) -> None:
        """Start writing the whole pages of the filled buffer. It starts on a page and is cut
        only when full (a whole number of pages) or when its run ends, so a partial page can
        only be the end of a run: that one is written now, through the page cache."""
        buf, n, offset = self._fill, self._fill_len, self._fill_at
        if buf is None:
            return
        self._fill = None
        whole = n - n % self.ALIGN
        if n > whole:
            _pwrite_all(self.fd, memoryview(buf)[whole:n], offset + whole)
        if not whole:
            self._free.append(buf)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.writers, thread_name_prefix="write")
        job = self._pool.submit(_pwrite_all, self.dfd, memoryview(buf)[:whole], offset)
        self._inflight.append((job, buf, whole, offset))

    def _reap(self) -> mmap.mmap:
        """Wait for the oldest write; return its buffer. Errors surface here."""
        job, buf, n, offset = self._inflight.popleft()
        try:
            job.result()
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                self._free.append(buf)
                raise
            self.direct = False  # this filesystem refuses O_DIRECT: the page cache then
            _pwrite_all(self.fd, memoryview(buf)[:n], offset)
        return buf

    def drain(self) -> None:
        """Write out the buffer being filled and wait for every write in flight; the first
        error is raised after all have ended."""
        if self._fill is not None and not self.direct:
            _pwrite_all(self.fd, memoryview(self._fill)[: self._fill_len], self._fill_at)
            self._free.append(self._fill)
            self._fill = None
        self._submit()
        error: OSError | None = None
        while self._inflight:
            try:
                self._free.append(self._reap())
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the writes in flight (never leave a thread writing to an fd that is about
        to be closed). Errors were the caller's to collect."""
        with contextlib.suppress(OSError):
            self.drain()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
        if self.dfd >= 0:  # only now: a thread may have been writing to it until drained
            os.close(self.dfd)
            self.dfd = -1


def _reopen_direct(fd: int) -> int:
    """A second open file description of ``fd``'s file with O_DIRECT, or -1."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return -1


def _pwrite_all(fd: int, mv: memoryview, offset: int) -> None:
    while mv:
        done = os.pwrite(fd, mv, offset)
        mv, offset = mv[done:], offset + done


def page_segments(
    data: bytes, offset: int, lo: int = 0, hi: int | None = None
) -> list[tuple[int, int, bool]]:
    """Alternating maximal (start, stop, all_zero) runs of ``data[lo:hi]`` whose boundaries
    fall on absolute 4 KiB pages (``offset`` is where ``data[lo]`` sits in the image); a
    partial page at either end is a run of its own. Positions index ``data`` itself, so a
    caller can look at part of a chunk without slicing (copying) it first.

    The cost is per run, not per page: a per-page Python loop cost ~0.3 s per 600 MB of data.
    Every aligned page contributes a few sampled bytes (one strided slice per sample position,
    OR-ed as big integers); a page with any non-zero sample holds data. Only the stretches
    whose samples are all zero are checked, each with one memcmp against a zero constant
    (never a memoryview compare, perf-baselines T6d), and page by page only if that fails.
    """
    n = len(data) if hi is None else hi
    head = min(n, lo + -offset % FINE_BLOCK)
    tail_start = head + (n - head) // FINE_BLOCK * FINE_BLOCK
    runs: list[tuple[int, int, bool]] = []
    if head > lo:
        _add_run(runs, lo, head, data.startswith(_ZERO[: head - lo], lo))
    if tail_start > head:
        _aligned_runs(data, head, tail_start, runs)
    if tail_start < n:
        _add_run(runs, tail_start, n, data.startswith(_ZERO[: n - tail_start], tail_start))
    return runs


def _aligned_runs(data: bytes, lo: int, hi: int, runs: list[tuple[int, int, bool]]) -> None:
    pages = (hi - lo) // FINE_BLOCK
    sampled = 0
    for at in _SAMPLES:
        sampled |= int.from_bytes(data[lo + at : hi : FINE_BLOCK], "little")
    flags = sampled.to_bytes(pages, "little")  # 0: the page's samples are all zero
    page = 0
    while page < pages:
        quiet = flags.find(0, page)  # next page that might be all zeros
        if quiet < 0:
            quiet = pages
        if quiet > page:
            _add_run(runs, lo + page * FINE_BLOCK, lo + quiet * FINE_BLOCK, False)
        if quiet == pages:
            return
        match = _NONZERO.search(flags, quiet)
        loud = match.start() if match else pages
        _zero_or_mixed(data, lo + quiet * FINE_BLOCK, lo + loud * FINE_BLOCK, runs)
        page = loud


def _zero_or_mixed(data: bytes, lo: int, hi: int, runs: list[tuple[int, int, bool]]) -> None:
    """Pages [lo, hi) whose samples were all zero: usually all zero (one memcmp per 64 KiB)."""
    pos = lo
    while pos < hi:
        step = min(hi - pos, ZERO_BLOCK)
        if data.startswith(_ZERO if step == ZERO_BLOCK else _ZERO[:step], pos):
            _add_run(runs, pos, pos + step, True)
        else:
            for at in range(pos, pos + step, FINE_BLOCK):
                _add_run(runs, at, at + FINE_BLOCK, data.startswith(_ZERO_FINE, at))
        pos += step


def _add_run(runs: list[tuple[int, int, bool]], start: int, stop: int, zero: bool) -> None:
    if runs and runs[-1][2] == zero and runs[-1][1] == start:
        runs[-1] = (runs[-1][0], stop, zero)
    else:
        runs.append((start, stop, zero))


def _map_write_error(exc: OSError) -> Exception:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return InsufficientSpace(f"target volume is full: {exc.strerror}")
    return TargetError(f"writing the target failed: {exc.strerror}")
