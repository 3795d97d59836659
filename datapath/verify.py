"""Verified volumes (issue 28): a digest of what a run wrote, and of what the device holds after.

A run writes its target out of order (qcow2 clusters in file order, xz blocks on a thread pool,
parallel ranged reads) and sparsely (zero pages are holes, or zeroed ranges on a device), so one
running hash over a stream cannot describe it. The digest here is order independent instead:
the target is cut into aligned ``BLOCK``-byte blocks and the digest is the sum, modulo 2^128, of
XXH3-128(block bytes, seed = block index) over every block that is not all zeros. A zero block
contributes nothing, so a hole, a punched range and written zeros all agree, and the sum does
not care in which order blocks were finished.

Write side (``WriteDigest``): the one sink every worker writes through (``RawWriter``, the
importer's, the upload server's and therefore a host-assisted clone's target) hands it each
piece it writes and each range it leaves zero. A piece covering a whole block is hashed at
once; pieces of a block are gathered in a buffer until the block is covered. Stream decoders
leave zero pages out without saying so, so a block may never be covered: such a block is
folded as it is (its gaps read as zeros, the data path's contract with its target) at the end,
or earlier when more than ``PENDING_LIMIT`` bytes of partial blocks wait (oldest first). A
later write into a block already folded early cannot be added any more; the run is then not
verifiable (``unordered``) and says so instead of claiming a result. The hashing stays on the
writing thread (the decoder's, or an xz lane's): XXH3 holds the GIL for a 64 KiB input (the
xxhash binding releases it only above 128 KiB), so hashing the bounce buffers on the O_DIRECT
writer threads instead only fought the decoder for the GIL and made the transfer slower
(``benchmarks/README.md``, "Verified volumes").

Read side (``read_back``): after the final fsync, the target is read from the device, not the
page cache: its cached pages are dropped first (``POSIX_FADV_DONTNEED``: after the fsync every
page is clean and nothing maps them, so all go), then it is read with ``O_DIRECT`` through a
second descriptor, ``READERS`` reads of ``READ_SIZE`` bytes in flight on helper threads; the
calling thread hashes each piece in order as it arrives and hands its page-aligned buffer to
the next read. Nothing enters the page cache (which counts against the pod's memory limit) and
nothing is copied. On the benchmark VM's virtio disk many small reads in flight beat a few
large ones: the 676 MB of the 2 GiB image, read and hashed, took 0.34-0.40 s (medians, under
load) against 0.39-0.50 s through the kernel's readahead one 8 MiB piece ahead, with a third
less CPU (no copies out of the page cache); the bare reads 0.24 s at best against 0.32 s
through readahead and 0.38-0.41 s with 1-8 O_DIRECT reads of 8 MiB. 16 x 512 KiB, 4 x 2 MiB
and 16 x 1 MiB did no better. A filesystem without O_DIRECT is read through its page cache,
each piece dropped behind the read. Only data extents are read (``SEEK_DATA``/``SEEK_HOLE``),
rounded out to whole blocks; a block device reports no holes and is read whole up to the
image's size (the rest of the device is not the image's), so stale bytes a run should have
zeroed are found too.

An archive (archive, filesystem-clone content) is a folder of files: each regular file's data
is written by ``decode.tarcopy`` with a digest of its own, and ``compare_files`` reads each back.

XXH3-128 (``xxhash``) because the budget is tight: verification must cost under 1.3x of a 2
GiB import that takes ~0.7 s, and XXH3 hashes at memory speed where BLAKE3 (our checkpoint
digest) costs ~0.15 s per 600 MB and pass. This is a check against storage faults and bugs,
not against an adversary: the tenant writes its own image.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import xxhash

from cdi.api.errors import TargetError, VerificationFailed
from datapath.target.nofollow import open_regular
from datapath.target.spec import block_device_size

BLOCK = 64 * 1024
# Bytes of partially written blocks held at most: the importer's memory budget
# (tests/unit/test_memory_budget.py) has 8 MiB left for it.
PENDING_LIMIT = 4 * 1024 * 1024
READ_SIZE = 1024 * 1024  # one read-back request
READERS = 8  # read-back requests in flight
ALGORITHM = "xxh3-128-sum/64k"
_MASK = (1 << 128) - 1
_ZERO = bytes(BLOCK)


def block_term(index: int, block: bytes | bytearray | memoryview) -> int:
    """One block's share of the digest: 0 for all zeros, else XXH3-128 seeded by its index.
    ``block`` is the whole block (``BLOCK`` bytes)."""
    if _ZERO.startswith(block):  # a memcmp, never a memoryview compare (zeros.py)
        return 0
    return int(xxhash.xxh3_128_intdigest(block, seed=index))


@dataclass(frozen=True)
class Digest:
    total: int  # the sum of the block terms, modulo 2^128
    blocks: int  # non-zero blocks in it

    def __str__(self) -> str:
        return f"{ALGORITHM}:{self.total:032x}"


class WriteDigest:
    """The digest of what a writer meant to write, fed piece by piece in any order.

    Shared by a writer and its lanes (threads writing one target at once: xz blocks), so one
    bound holds for all partial blocks; a lock makes each call atomic (the hashing is short and
    the threads' real work, decoding, runs outside it). Pieces never overlap (the writer's
    contract: no range is written twice).
    """

    def __init__(self, *, pending_limit: int = PENDING_LIMIT) -> None:
        self._lock = threading.Lock()
        self._total = 0
        self._blocks = 0
        self._pending: dict[int, tuple[bytearray, list[int]]] = {}  # index -> (bytes, [covered])
        self._folded_early: set[int] = set()  # partial blocks folded before the end
        self._max_pending = max(1, pending_limit // BLOCK)
        self.unordered = False  # a piece came for a block already folded early

    def add(self, offset: int, data: bytes | bytearray | memoryview) -> None:
        """``data`` was written at ``offset``."""
        with self._lock:
            self._add(offset, memoryview(data))

    def _add(self, offset: int, mv: memoryview) -> None:
        n, pos = len(mv), 0
        while pos < n:
            index, within = divmod(offset + pos, BLOCK)
            take = min(BLOCK - within, n - pos)
            if take == BLOCK and index not in self._pending:
                if self._folded_early and index in self._folded_early:
                    self.unordered = True
                else:
                    self._fold(index, mv[pos : pos + BLOCK])
            else:
                self._part(index, within, mv[pos : pos + take])
            pos += take

    def zeros(self, offset: int, length: int) -> None:
        """``[offset, offset+length)`` was left to read as zeros (a hole, a zeroed range):
        only the partial blocks at its ends need to know, to complete their coverage."""
        with self._lock:
            self._zeros(offset, length)

    def _zeros(self, offset: int, length: int) -> None:
        end = offset + length
        first, last = offset // BLOCK, (end - 1) // BLOCK
        if length <= 0:
            return
        if offset % BLOCK:
            self._cover(first, min(end, (first + 1) * BLOCK) - offset)
            if last == first:
                return
        if end % BLOCK:
            self._cover(last, end % BLOCK)

    def finish(self) -> Digest:
        """Fold the blocks still partial (their gaps read as zeros) and return the digest."""
        with self._lock:
            for index, (data, _covered) in self._pending.items():
                self._fold(index, data)
            self._pending = {}
            return Digest(self._total & _MASK, self._blocks)

    def _part(self, index: int, within: int, piece: memoryview) -> None:
        entry = self._entry(index)
        if entry is None:
            return
        data, covered = entry
        data[within : within + len(piece)] = piece
        covered[0] += len(piece)
        if covered[0] >= BLOCK:
            del self._pending[index]
            self._fold(index, data)

    def _cover(self, index: int, amount: int) -> None:
        entry = self._entry(index)
        if entry is None:
            return
        entry[1][0] += amount
        if entry[1][0] >= BLOCK:
            del self._pending[index]
            self._fold(index, entry[0])

    def _entry(self, index: int) -> tuple[bytearray, list[int]] | None:
        entry = self._pending.get(index)
        if entry is not None:
            return entry
        if self._folded_early and index in self._folded_early:
            self.unordered = True
            return None
        if len(self._pending) >= self._max_pending:  # fold the oldest: usually long finished
            oldest = next(iter(self._pending))
            data, _covered = self._pending.pop(oldest)
            self._folded_early.add(oldest)
            self._fold(oldest, data)
        entry = self._pending[index] = (bytearray(BLOCK), [0])
        return entry

    def _fold(self, index: int, block: bytes | bytearray | memoryview) -> None:
        term = block_term(index, block)
        if term:
            self._total += term
            self._blocks += 1


# -- the read side ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadBack:
    digest: Digest
    bytes_read: int


def read_back(path: str, *, block_device: bool, length: int | None = None) -> ReadBack:
    """The digest of what ``path`` holds, read from the device (module docstring), up to
    ``length`` bytes when given (a block device past the image is not the image's: CDI leaves
    it as it was). Blocking: the processor runs it on a worker thread."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if block_device else open_regular(path)
    except OSError as exc:
        raise TargetError(f"cannot open the target to read it back: {exc.strerror}") from exc
    try:
        size = block_device_size(fd) if block_device else os.fstat(fd).st_size
        if length is not None:
            size = min(size, length)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean after the fsync: dropped
        return _digest_ranges(fd, _block_ranges(fd, size, block_device))
    except OSError as exc:
        raise TargetError(f"reading the target back failed: {exc.strerror}") from exc
    finally:
        os.close(fd)


def compare_files(
    files: Mapping[str, WriteDigest], *, block_device: bool, length: int | None = None
) -> tuple[Digest, ReadBack]:
    """Read back each of ``files`` (one disk image, or an archive's files) and compare it with
    the digest of what was written to it; ``VerificationFailed`` at the first that differs or
    is no longer there. Returns the sums over all of them. Blocking."""
    total = blocks = found_total = found_blocks = read = 0
    for path, digest in files.items():
        expected = digest.finish()
        try:
            found = read_back(path, block_device=block_device, length=length)
        except TargetError as exc:
            if len(files) == 1:
                raise
            raise VerificationFailed(
                f"an extracted file cannot be read back: {exc.message}"
            ) from exc
        if found.digest != expected:
            name = "the volume" if len(files) == 1 else f"file {os.path.basename(path)[:64]!r}"
            raise VerificationFailed(
                f"{name} read back from the device does not hold what was written: "
                f"{expected.blocks} non-zero 64 KiB blocks written ({expected}), "
                f"{found.digest.blocks} read back ({found.digest})"
            )
        total, blocks = total + expected.total, blocks + expected.blocks
        found_total, found_blocks = (
            found_total + found.digest.total,
            found_blocks + found.digest.blocks,
        )
        read += found.bytes_read
    return Digest(total & _MASK, blocks), ReadBack(Digest(found_total & _MASK, found_blocks), read)


def read_into(digest: WriteDigest, path: str, block_device: bool, length: int) -> None:
    """Feed ``digest`` the first ``length`` bytes already in the target (a resumed import's
    prefix, which the checkpoint's attested digest vouched for) as if this run wrote them."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC) if block_device else open_regular(path)
    except OSError as exc:
        raise TargetError(f"cannot open the target to read its prefix: {exc.strerror}") from exc
    buf = bytearray(READ_SIZE)
    offset = 0
    try:
        while offset < length:
            n = os.preadv(fd, [memoryview(buf)[: min(READ_SIZE, length - offset)]], offset)
            if n <= 0:
                break
            digest.add(offset, memoryview(buf)[:n])
            offset += n
    finally:
        os.close(fd)


def _block_ranges(fd: int, size: int, block_device: bool) -> list[tuple[int, int]]:
    """The data extents of ``fd`` rounded out to whole blocks and merged; a device is one."""
    if block_device:
        return [(0, size)] if size else []
    ranges: list[tuple[int, int]] = []
    pos = 0
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no data past pos
                break
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        lo, hi = start // BLOCK * BLOCK, min(size, -(-end // BLOCK) * BLOCK)
        if ranges and lo <= ranges[-1][1]:
            ranges[-1] = (ranges[-1][0], max(ranges[-1][1], hi))
        else:
            ranges.append((lo, hi))
        pos = end
    return ranges


def _pieces(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    for lo, hi in ranges:
        for at in range(lo, hi, READ_SIZE):
            yield at, min(READ_SIZE, hi - at)


def _read(fd: int, direct: int, buf: mmap.mmap, offset: int, length: int) -> int:
    """Read ``length`` bytes at ``offset`` into ``buf`` through ``direct`` (O_DIRECT: the
    request rounded up to whole pages), or through ``fd``'s page cache when there is no such
    descriptor or the filesystem refuses the read, dropping the pages behind it. Fewer bytes
    only at the end of the file; the rest of the buffer up to ``length`` is zeroed."""
    view = memoryview(buf)
    done = 0
    if direct >= 0:
        want = -(-length // _ALIGN) * _ALIGN
        try:
            while done < want:
                n = os.preadv(direct, [view[done:want]], offset + done)
                done += max(n, 0)
                if n <= 0 or n % _ALIGN:  # short, off a page boundary: the end of the file
                    break
        except OSError as exc:
            if exc.errno != errno.EINVAL or done:
                raise
            direct = -1  # no O_DIRECT on this filesystem after all: the page cache is its device
    if direct < 0:
        while done < length:
            n = os.preadv(fd, [view[done:length]], offset + done)
            if n <= 0:
                break
            done += n
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    got = min(done, length)
    if got < length:
        view[got:length] = _ZERO_READ[: length - got]
    view.release()
    return got


_ZERO_READ = bytes(READ_SIZE)
_ALIGN = 4096


def _reopen_direct(fd: int) -> int:
    """A second open file description of ``fd``'s file with O_DIRECT, or -1 (tmpfs and the
    like: there the page cache is the device)."""
    try:
        return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    except OSError:
        return -1


def _digest_ranges(fd: int, ranges: list[tuple[int, int]]) -> ReadBack:
    """Hash the blocks of ``ranges`` as ``READERS`` reads of ``READ_SIZE`` bytes each run on
    helper threads: each piece is hashed here once read, in order, and its buffer goes to the
    next read."""
    total = blocks = read = 0
    pieces = _pieces(ranges)
    direct = _reopen_direct(fd)
    try:
        with ThreadPoolExecutor(READERS, thread_name_prefix="read-back") as pool:
            inflight: deque[tuple[Future[int], mmap.mmap, int, int]] = deque()
            for piece in itertools.islice(pieces, READERS):
                buf = mmap.mmap(-1, READ_SIZE)  # page-aligned, as O_DIRECT needs
                inflight.append((pool.submit(_read, fd, direct, buf, *piece), buf, *piece))
            while inflight:
                job, buf, offset, length = inflight.popleft()
                read += job.result()
                view = memoryview(buf)
                padded = -(-length // BLOCK) * BLOCK
                if padded > length:  # the file ends inside its last block: the rest reads zeros
                    view[length:padded] = _ZERO[: padded - length]
                for at in range(0, padded, BLOCK):
                    term = block_term((offset + at) // BLOCK, view[at : at + BLOCK])
                    if term:
                        total += term
                        blocks += 1
                view.release()
                following = next(pieces, None)
                if following is None:
                    buf.close()
                else:
                    job = pool.submit(_read, fd, direct, buf, *following)
                    inflight.append((job, buf, *following))
    finally:
        if direct >= 0:  # only now: every read on it has ended
            os.close(direct)
    return ReadBack(Digest(total & _MASK, blocks), read)
