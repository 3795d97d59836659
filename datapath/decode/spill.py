"""The spill area: source bytes that went by before the table that maps them, kept until
that table arrives, so a disordered image from a one-shot body still converts in one pass.

Every streaming image decoder (qcow2, vdi, vmdk) reads its file front to back. Sometimes data
(or a table) comes before the table that maps it: images rewritten in place, L2 tables copied
on write after a snapshot, an L1 table or a VDI block map moved to the end, VMDK grain tables
after the grains. While any table is still to come, a decoder hands every byte it could not
place to ``Spill.add``, takes bytes back with ``prefix`` when a table maps them, and calls
``clear`` once no pending table can map what is left.

Shape. Bytes are keyed by their offset in the source file and always added in file order (a
stream cannot go back), so the index is a sorted list of segments appended at the end. Up to
``memory_limit`` bytes are held in memory; beyond that, with a ``scratch_dir``, segments are
written to a sparse scratch file *at their own source offset*: the file allocates blocks only
for the out-of-order parts, needs no allocator, and its apparent size is bounded by the source
size. ``file_limit`` is a hard ceiling on that size (an image file larger than its capacity plus
metadata is a bomb: ``UnsafeImage``). Without a scratch directory the spill is memory only and
passing the bound raises ``SpillLimitExceeded`` (a ``LayoutNotStreamable``: the phase machine's
fallback). The file is created on first use (``O_EXCL|O_NOFOLLOW``, mode 0600, so a planted
symlink is never followed), emptied by ``clear`` and deleted by ``close``.

Data runs that a late table maps can be as large as the image (an L1 table or a VDI block map
at the end maps everything before it), so they are not read back at once: the decoder checks
they are held and ``owe``s them; ``repaid_writes`` then reads them back ``REPAY_SLICE`` bytes
at a time (compressed extents one by one, expanded then), lazily, as the caller iterates the
writes a ``feed`` returned. Memory stays bounded
whatever the disorder; the decoder settles anything the caller left unread before it goes on.

The decoders stay sans-I/O apart from this one injected object; the file I/O is plain
``pread``/``pwrite`` on the decoder's thread, like the target writer's.
"""

from __future__ import annotations

import errno
import os
import secrets
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import chain
from types import TracebackType

from cdi.api.errors import (
    InsufficientSpace,
    InvalidImage,
    ScratchSpaceRequired,
    TargetError,
    UnsafeImage,
)
from datapath.decode.rawpieces import LayoutNotStreamable, Write, WriteCoalescer
from datapath.target.nofollow import ensure_dir

DEFAULT_MEMORY_LIMIT = 64 * 1024 * 1024
REPAY_SLICE = 4 * 1024 * 1024  # bytes read back at a time for data owed to the output

Expand = Callable[[bytes], tuple[bytes, int]]
"""A compressed extent's bytes -> (the raw data, how many input bytes its stream used)."""
SPILL_PREFIX = "cdi-spill-"
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class SpillLimitExceeded(LayoutNotStreamable):
    """The layout is too out of order to stream within the in-memory bound, and there is no
    scratch directory to spill to (the phase machine converts via scratch space instead)."""

    transient = False


class Spill:
    """Bytes keyed by source-file offset: in memory up to ``memory_limit``, then in a sparse
    scratch file at the same offset (when ``scratch_dir`` is given)."""

    def __init__(
        self,
        *,
        memory_limit: int = DEFAULT_MEMORY_LIMIT,
        scratch_dir: str | None = None,
        file_limit: int | None = None,
    ) -> None:
        self.memory_limit = memory_limit
        self.scratch_dir = scratch_dir
        self.file_limit = file_limit
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._data: list[bytearray | None] = []  # None: the segment lives in the file
        self._high = 0  # end of the last byte added: adds never go back
        self.memory = 0  # bytes held in memory
        self.size = 0  # bytes held, in memory and in the file
        self.memory_peak = 0
        self.scratch_bytes = 0  # bytes ever written to the scratch file
        self.path: str | None = None
        self._fd = -1
        self._file_used = False
        self.owed: deque[tuple[int, int, int, Expand | None]] = deque()  # start, end, virt
        self._clear_when_repaid = False

    def __len__(self) -> int:
        return len(self._starts)

    def __enter__(self) -> Spill:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- keeping -------------------------------------------------------------------------

    def add(self, offset: int, data: bytes | memoryview) -> None:
        """Keep ``data``, the source bytes at ``offset``; offsets only grow between calls."""
        size = len(data)
        if not size:
            return
        if offset < self._high:
            raise RuntimeError(f"spill add at {offset:#x} goes back before {self._high:#x}")
        end = offset + size
        self._high = end
        if self.memory + size <= self.memory_limit:
            self._add_memory(offset, end, data)
        elif self.scratch_dir is None:
            raise SpillLimitExceeded(
                f"image layout needs more than {self.memory_limit} bytes held for data that "
                f"comes before its table (at file offset {end:#x}); converting via scratch "
                "space instead"
            )
        else:
            self._add_file(offset, end, data)
        self.size += size

    def add_gaps(self, chunk: bytes, c0: int, claimed: list[tuple[int, int]]) -> None:
        """Keep the bytes of ``chunk`` (at file offset ``c0``) outside the ``claimed`` ranges:
        nothing placed them, and a table still to come may map them."""
        view = memoryview(chunk)
        pos = c0
        for lo, hi in sorted(claimed):
            if lo > pos:
                self.add(pos, view[pos - c0 : lo - c0])
            pos = max(pos, hi)
        if pos < c0 + len(chunk):
            self.add(pos, view[pos - c0 :])

    def _add_memory(self, offset: int, end: int, data: bytes | memoryview) -> None:
        last = len(self._starts) - 1
        held = self._data[last] if last >= 0 else None
        if held is not None and self._ends[last] == offset:
            held += data  # the common case: the next gap in file order
            self._ends[last] = end
        else:
            self._append(offset, end, bytearray(data))
        self.memory += end - offset
        self.memory_peak = max(self.memory_peak, self.memory)

    def _add_file(self, offset: int, end: int, data: bytes | memoryview) -> None:
        if self.file_limit is not None and end > self.file_limit:
            raise UnsafeImage(
                f"image data reaches file offset {end}, past the {self.file_limit} bytes an "
                "image for this target can need; refusing it as a bomb"
            )
        fd = self._file()
        view = memoryview(data)
        pos = 0
        try:
            while pos < len(view):
                pos += os.pwrite(fd, view[pos:], offset + pos)
        except OSError as exc:
            raise scratch_error(exc) from exc
        self.scratch_bytes += len(view)
        last = len(self._starts) - 1
        if last >= 0 and self._data[last] is None and self._ends[last] == offset:
            self._ends[last] = end
        else:
            self._append(offset, end, None)

    def _append(self, start: int, end: int, data: bytearray | None) -> None:
        self._starts.append(start)
        self._ends.append(end)
        self._data.append(data)

    def _file(self) -> int:
        if self._fd < 0:
            assert self.scratch_dir is not None
            path = os.path.join(self.scratch_dir, SPILL_PREFIX + secrets.token_hex(8))
            try:
                # Made only now, on first spill: an import that never spills needs no
                # scratch folder (a container's root filesystem is read-only).
                ensure_dir(self.scratch_dir)
                self._fd = os.open(path, _OPEN_FLAGS, 0o600)
            except OSError as exc:
                raise scratch_error(exc) from exc
            self.path = path
        self._file_used = True
        return self._fd

    # -- taking back ---------------------------------------------------------------------

    def prefix(self, start: int, end: int) -> bytes:
        """The held bytes from ``start`` towards ``end``, stopping at the first gap (empty if
        ``start`` itself is not held). Callers that need all of them compare the length."""
        parts: list[bytes] = []
        pos = start
        i = self._first_overlapping(start)
        while pos < end and i < len(self._starts) and self._starts[i] <= pos:
            hi = min(end, self._ends[i])
            parts.append(self._read(i, pos, hi))
            pos = hi
            i += 1
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _read(self, i: int, lo: int, hi: int) -> bytes:
        held = self._data[i]
        if held is not None:
            base = self._starts[i]
            return bytes(memoryview(held)[lo - base : hi - base])
        try:
            out = os.pread(self._fd, hi - lo, lo)
        except OSError as exc:
            raise scratch_error(exc) from exc
        if len(out) != hi - lo:
            raise TargetError(f"scratch spill file is short at {lo:#x} (changed under us?)")
        return out

    def held(self, start: int, end: int) -> int:
        """How many bytes from ``start`` towards ``end`` are held without a gap."""
        pos = start
        i = self._first_overlapping(start)
        while pos < end and i < len(self._starts) and self._starts[i] <= pos:
            pos = min(end, self._ends[i])
            i += 1
        return pos - start

    def owe(self, start: int, end: int, virt: int, expand: Expand | None = None) -> int:
        """Promise the held bytes ``[start, end)`` to the output at virtual offset ``virt``
        (read back later by ``repay``), as they are or, for a compressed extent (at most a
        few MiB), through ``expand``. Returns how many were held; only a whole range is owed."""
        held = self.held(start, end)
        if held == end - start:
            self.owed.append((start, end, virt, expand))
        return held

    def repay(self) -> Iterator[tuple[int, bytes]]:
        """``(virtual offset, bytes)`` slices of what is owed, read one at a time. A slice is
        forgotten only when the next is asked for: a consumer that stops half-way (an error
        while writing) leaves it owed, and it is written again (same bytes, same place)."""
        owed = self.owed
        while owed:
            start, end, virt, expand = owed[0]
            hi = end if expand is not None else min(end, start + REPAY_SLICE)
            data = self.prefix(start, hi)
            if expand is not None:
                # A compressed stream's range may overrun into the next extent, which may
                # have been taken meanwhile: its stream must end before such a gap.
                data, used = expand(data)
                taken = start + used  # the rest may begin another extent
            elif len(data) != hi - start:
                raise InvalidImage(
                    f"image bytes at {start + len(data):#x} are mapped as data but another "
                    "structure took them (overlapping structures)"
                )
            else:
                taken = hi
            yield virt, data
            self.discard(start, taken)
            if hi == end:
                owed.popleft()
            else:
                owed[0] = (hi, end, virt + hi - start, None)
        if self._clear_when_repaid:
            self.clear()

    def discard(self, start: int, end: int) -> None:
        """Forget ``[start, end)``. Trimming the front of a segment is cheap (bytearray
        deletes from the front in O(1)), which is the usual case: runs are taken in order."""
        if end <= start or not self._starts:
            return
        i = self._first_overlapping(start)
        while i < len(self._starts) and self._starts[i] < end:
            seg_start, seg_end, held = self._starts[i], self._ends[i], self._data[i]
            lo, hi = max(start, seg_start), min(end, seg_end)
            self.size -= hi - lo
            if held is not None:
                self.memory -= hi - lo
            if lo == seg_start and hi == seg_end:
                del self._starts[i], self._ends[i], self._data[i]
                continue
            if lo == seg_start:
                if held is not None:
                    del held[: hi - seg_start]
                self._starts[i] = hi
            elif hi == seg_end:
                if held is not None:
                    del held[lo - seg_start :]
                self._ends[i] = lo
            else:
                tail = None if held is None else held[hi - seg_start :]
                if held is not None:
                    del held[lo - seg_start :]
                self._ends[i] = lo
                self._starts.insert(i + 1, hi)
                self._ends.insert(i + 1, seg_end)
                self._data.insert(i + 1, tail)
            i += 1

    def clear(self) -> None:
        """Nothing held can be mapped any more: forget it all (once what is owed is repaid),
        and free the file's blocks."""
        if self.owed:
            self._clear_when_repaid = True
            return
        self._clear_when_repaid = False
        self._starts.clear()
        self._ends.clear()
        self._data.clear()
        self.size = self.memory = 0
        if self._file_used:
            try:
                os.ftruncate(self._fd, 0)
            except OSError as exc:
                raise scratch_error(exc) from exc
            self._file_used = False

    def close(self) -> None:
        """Drop everything and delete the scratch file (idempotent)."""
        self._starts.clear()
        self._ends.clear()
        self._data.clear()
        self.owed.clear()
        self.size = self.memory = 0
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self.path is not None:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
            self.path = None

    def _first_overlapping(self, offset: int) -> int:
        i = bisect_right(self._starts, offset) - 1
        if i >= 0 and self._ends[i] > offset:
            return i
        return i + 1


def repaid_writes(spill: Spill, virtual_size: int) -> Iterator[Write]:
    """The writes of everything ``spill`` owes, produced lazily slice by slice (zero pages
    left out, bytes past the disk end cut, like every other write)."""
    for virt, data in spill.repay():
        out = WriteCoalescer(virtual_size)  # nothing carried over between slices
        out.add(virt, data)
        yield from out.drain(final=True)


def settle(spill: Spill | None, virtual_size: int | None) -> list[Write]:
    """What a caller left unread of an earlier ``feed``: repaid now, before the spill moves
    on (memory then holds it at once; callers that iterate each result never get here)."""
    if spill is None or not spill.owed:
        return []
    return list(repaid_writes(spill, virtual_size or 0))


def with_repaid(
    writes: list[Write], spill: Spill | None, virtual_size: int | None
) -> Iterable[Write]:
    """``writes``, followed (lazily) by what ``spill`` owes, if anything."""
    if spill is None or not spill.owed:
        return writes
    return chain(writes, repaid_writes(spill, virtual_size or 0))


SCRATCH_REQUIRED_MESSAGE = "scratch space required and none found"  # CDI's words


def scratch_error(exc: OSError) -> Exception:
    """A failure to create or write scratch space, typed: full is ``InsufficientSpace``; no
    writable folder at all (a block target's pod without a scratch volume: a read-only root)
    is ``ScratchSpaceRequired``, which the controller answers with a scratch claim; anything
    else is a (transient) ``TargetError``. Classified by errno, never by message text."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientSpace(f"scratch space is full while spilling image data: {exc}")
    where = f" {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT):
        return ScratchSpaceRequired(f"{SCRATCH_REQUIRED_MESSAGE} ({exc.strerror or exc}{where})")
    return TargetError(f"scratch space{where}: {exc.strerror or exc}")
