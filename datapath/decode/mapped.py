"""Front-to-back decoding of images whose tables come before the data they map (vdi, vmdk).

VDI images and VMDK sparse extents, as qemu-img and VirtualBox write them, share one shape: a
header at offset 0, then the tables (VDI's block map; VMDK's grain directory and grain
tables), then data blocks in any order. A decoder for that shape needs no spill area: it
collects a fixed-size head, then each table as it streams past, and once the last table is in
it knows every data extent and serves them in file order as the bytes go by. Anything that
breaks the shape (a table that went by before the table naming it arrived, data placed before
the last table) is not refused but reported as ``LayoutNotStreamable``: qemu-img can still
convert such an image through scratch space, so the phase machine falls back to that.

``MappedImageDecoder`` is that machinery, sans-I/O (``feed(bytes) -> writes``, ``finish()``);
a format supplies ``_on_head`` (parse the head, name the first tables), ``_on_table`` (parse
one table, name more tables or add extents) and, for extents whose length is only known from
their first bytes (VMDK's compressed grains behind a marker), ``_frame_length`` and
``_frame_data``. Memory is the head, one table in assembly at a time (plus any queued behind it),
the extent list (capped at ``MAX_EXTENTS``; contiguous extents are merged as they are added),
one frame in assembly and the coalescer's bounded output.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from cdi.api.errors import InvalidImage, UnsafeImage
from datapath.decode.rawpieces import LayoutNotStreamable, Write, WriteCoalescer
from datapath.decode.spill import Expand, Spill, settle, with_repaid

PLAIN = 0  # raw bytes of the disk, placed as they pass
FRAME = 1  # a self-describing extent: read whole, then expanded by ``_frame_data``
FRAME_HEAD = 12  # bytes of a frame needed to learn its length
# As many separate extents as the qcow2 decoder holds at most; ~190 bytes each (a tuple of four
# ints in a list), so ~95 MB at the cap (docs/importer.md, memory table).
MAX_EXTENTS = 500_000

Extent = tuple[int, int, int, int]  # file start, file end (a bound for frames), virtual, kind


@dataclass(slots=True)
class _Table:
    start: int
    end: int
    tag: int
    acc: bytearray = field(default_factory=bytearray)


class MappedImageDecoder:
    """Base of the vdi and vmdk stream decoders: head, then tables, then data extents."""

    format_name = "image"

    def __init__(
        self, head_size: int, *, file_size: int | None, spill: Spill | None = None
    ) -> None:
        self.virtual_size: int | None = None
        self._spill = spill
        self._head_size = head_size
        self._file_size = file_size
        self._head = bytearray()
        self._pos = 0
        self._tables: list[tuple[int, int, _Table]] = []
        self._seq = itertools.count()
        self._named_at = 0  # end of the table being parsed: tables it names must come later
        self._extents: list[Extent] = []
        self._next = 0
        self._data_ready = False
        self._tables_later = False  # tables are named only at the end of the stream (a footer)
        self._last_end = 0  # file end of the last extent served: the next may not start before
        self._frame = bytearray()
        self._frame_len = 0
        self._out = WriteCoalescer(0)
        self._finished = False

    @property
    def position(self) -> int:
        """File offset of the next byte to feed."""
        return self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> Iterable[Write]:
        """Consume the next bytes of the file; return the raw writes that are ready (data
        read back from a spill comes lazily, as the result is iterated)."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        early = settle(self._spill, self.virtual_size)
        chunk = data if isinstance(data, bytes) else bytes(data)
        if self.virtual_size is None:
            chunk = self._feed_head(chunk)
            if self.virtual_size is None:
                return []
        if chunk:
            self._process(chunk, self._pos)
        writes = self._out.drain()
        return with_repaid(early + writes if early else writes, self._spill, self.virtual_size)

    def finish(self) -> Iterable[Write]:
        """End of stream: the last writes, or a typed error if anything mapped never came."""
        self._finished = True
        early = settle(self._spill, self.virtual_size)
        name = self.format_name
        if self.virtual_size is None:
            if len(self._head) < self._head_size and self._head:
                self._start(bytes(self._head))  # a file smaller than the head: parse what came
            if self.virtual_size is None:
                raise InvalidImage(f"{name} stream ended after {self._pos} bytes, in the header")
        if self._file_size is not None and self._pos != self._file_size:
            raise InvalidImage(f"{name} stream has {self._pos} bytes, expected {self._file_size}")
        if self._tables_later:
            self._at_end()
            self._tables_later = False
            self._process(b"", self._pos)  # the tables and the data are all in the spill
        if self._tables:
            start = self._tables[0][0]
            raise InvalidImage(
                f"{name} stream ended at {self._pos} but a table at {start:#x} never arrived "
                "(truncated, or a table points past the end)"
            )
        if self._next < len(self._extents):
            start, _, virt, _ = self._extents[self._next]
            raise InvalidImage(
                f"{name} stream ended at {self._pos} but data for virtual offset {virt:#x} at "
                f"{start:#x} never arrived completely (truncated)"
            )
        writes = self._out.drain(final=True)
        return with_repaid(early + writes if early else writes, self._spill, self.virtual_size)

    # -- for the formats ---------------------------------------------------------------------

    def _on_head(self, head: bytes) -> None:
        raise NotImplementedError

    def _on_table(self, tag: int, table: bytes) -> None:
        raise NotImplementedError

    def _at_end(self) -> None:
        """With ``_tables_later`` set (by ``_on_head``): the whole stream is in the spill; name
        the first tables now (e.g. from a footer)."""
        raise NotImplementedError

    def _frame_length(self, head: bytes, bound: int) -> int:
        raise NotImplementedError

    def _frame_data(self, virt: int, frame: bytes) -> bytes:
        """The raw bytes at ``virt`` that a whole frame holds (e.g. an inflated grain)."""
        raise NotImplementedError

    def _set_virtual_size(self, size: int) -> None:
        self.virtual_size = size
        self._out = WriteCoalescer(size)

    def _want_table(self, start: int, end: int, tag: int) -> None:
        """Ask for the bytes ``[start, end)``; ``_on_table(tag, bytes)`` gets them."""
        if start < self._named_at and self._spill is None:
            raise LayoutNotStreamable(
                f"{self.format_name} table at {start:#x} lies before the structure naming it "
                f"(which ends at {self._named_at:#x}); converting via scratch space instead"
            )
        self._check_in_file(start, end, "table")
        heapq.heappush(self._tables, (start, next(self._seq), _Table(start, end, tag)))

    def _add_extent(self, start: int, end: int, virt: int, kind: int = PLAIN) -> None:
        """Map file bytes ``[start, end)`` to virtual offset ``virt`` (merging neighbours)."""
        self._check_in_file(start, end if kind == PLAIN else start + FRAME_HEAD, "data")
        extents = self._extents
        if kind == PLAIN and extents:
            last_start, last_end, last_virt, last_kind = extents[-1]
            if last_kind == PLAIN and last_end == start and last_virt + start - last_start == virt:
                extents[-1] = (last_start, end, last_virt, PLAIN)
                return
        if len(extents) >= MAX_EXTENTS:
            raise LayoutNotStreamable(
                f"{self.format_name} tables map more than {MAX_EXTENTS} separate extents; "
                "converting via scratch space instead"
            )
        extents.append((start, end, virt, kind))

    def _check_in_file(self, start: int, end: int, what: str) -> None:
        if self._file_size is not None and end > self._file_size:
            raise UnsafeImage(
                f"{self.format_name} {what} at {start:#x} points outside the file "
                f"({self._file_size} bytes)"
            )

    # -- the machinery -----------------------------------------------------------------------

    def _feed_head(self, chunk: bytes) -> bytes:
        take = self._head_size - len(self._head)
        self._head += chunk[:take]
        self._pos = len(self._head)
        if len(self._head) < self._head_size:
            return b""
        head, self._head = bytes(self._head), bytearray()
        self._start(head)
        return chunk[take:]

    def _start(self, head: bytes) -> None:
        """Parse the head, then run it through the table and data machinery like any chunk."""
        self._on_head(head)
        self._pos = 0
        self._process(head, 0)

    def _process(self, chunk: bytes, c0: int) -> None:
        c1 = c0 + len(chunk)
        spill = self._spill
        claimed: list[tuple[int, int]] | None = (
            [] if spill is not None and not self._data_ready else None
        )
        tables = self._tables
        while tables and tables[0][0] < c1:
            _, _, table = heapq.heappop(tables)
            self._serve_table(table, chunk, c0, c1, claimed)
        if not tables and not self._data_ready and not self._tables_later:
            self._start_data()
        if self._data_ready:
            self._serve_extents(chunk, c0, c1)
            if spill is not None and spill.size:
                spill.clear()  # every table is in and all it mapped in the past is served
        elif spill is not None and claimed is not None:
            spill.add_gaps(chunk, c0, claimed)
        self._pos = c1

    def _serve_table(
        self, table: _Table, chunk: bytes, c0: int, c1: int, claimed: list[tuple[int, int]] | None
    ) -> None:
        lo = table.start + len(table.acc)
        if lo < c0:
            if self._spill is None:
                raise LayoutNotStreamable(
                    f"{self.format_name} table at {table.start:#x} went by before it was known; "
                    "converting via scratch space instead"
                )
            past = min(table.end, c0)
            table.acc += self._past(lo, past)
            self._spill.discard(lo, past)
            lo = past
        hi = min(table.end, c1)
        if lo < hi:
            table.acc += chunk[lo - c0 : hi - c0]
            if claimed is not None:
                claimed.append((lo, hi))
        if table.end > c1:
            heapq.heappush(self._tables, (c1, next(self._seq), table))
            return
        self._named_at = max(self._named_at, table.end)
        self._on_table(table.tag, bytes(table.acc))

    def _past(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` that went by before being mapped: they must all be held."""
        assert self._spill is not None
        data = self._spill.prefix(start, end)
        if len(data) != end - start:
            self._not_kept(start + len(data))
        return data

    def _owe(self, start: int, end: int, virt: int, expand: Expand | None = None) -> None:
        if self._spill is None:
            raise LayoutNotStreamable(
                f"{self.format_name} data at {start:#x} went by before its table; converting "
                "via scratch space instead"
            )
        held = self._spill.owe(start, end, virt, expand)
        if held != end - start:
            self._not_kept(start + held)

    def _not_kept(self, offset: int) -> NoReturn:
        raise InvalidImage(
            f"{self.format_name} bytes at {offset:#x} are mapped by a table that came after "
            "them but were taken by another structure (overlapping structures)"
        )

    def _take(self, lo: int, hi: int, chunk: bytes, c0: int) -> bytes:
        """File bytes ``[lo, hi)``: the part before this chunk from the spill, then the chunk."""
        if lo >= c0:
            return chunk[lo - c0 : hi - c0]
        if self._spill is None:
            raise LayoutNotStreamable(
                f"{self.format_name} data at {lo:#x} went by before its table; converting via "
                "scratch space instead"
            )
        past = self._past(lo, min(hi, c0))
        return past + chunk[: hi - c0] if hi > c0 else past

    def _start_data(self) -> None:
        """All tables are in: from here on every byte is data or ignorable."""
        self._extents.sort()
        self._data_ready = True
        if self._spill is None and self._extents and self._extents[0][0] < self._named_at:
            start, _, virt, _ = self._extents[0]
            raise LayoutNotStreamable(
                f"{self.format_name} data for virtual offset {virt:#x} at {start:#x} lies before "
                f"the end of the tables ({self._named_at:#x}); converting via scratch space instead"
            )

    def _serve_extents(self, chunk: bytes, c0: int, c1: int) -> None:
        extents = self._extents
        i = self._next
        while i < len(extents):
            start, end, virt, kind = extents[i]
            if start >= c1:
                break
            if start < self._last_end:
                raise InvalidImage(
                    f"{self.format_name} data at {start:#x} overlaps the data before it "
                    f"(which ends at {self._last_end:#x})"
                )
            if kind == FRAME:
                if not self._serve_frame(start, end, virt, chunk, c0, c1):
                    break
            elif start >= c0 and end <= c1:  # the common case: wholly in this chunk
                self._out.add(virt, chunk, start - c0, end - c0)
                self._last_end = end
            else:
                hi = min(end, c1)
                if start < c0:  # went by before its table: owed, read back lazily
                    self._owe(start, min(hi, c0), virt)
                lo = max(start, c0)
                if lo < hi:
                    self._out.add(virt + lo - start, chunk, lo - c0, hi - c0)
                if end > c1:  # the rest comes with the next chunks
                    extents[i] = (c1, end, virt + c1 - start, PLAIN)
                    break
                self._last_end = end
            i += 1
        self._next = i

    def _serve_frame(
        self, start: int, bound: int, virt: int, chunk: bytes, c0: int, c1: int
    ) -> bool:
        """Assemble one frame; True once it was whole and handed over."""
        frame = self._frame
        if not frame and start + FRAME_HEAD <= c0 and self._owe_frame(start, bound, virt, c0):
            return True
        while True:
            want = self._frame_len or FRAME_HEAD
            lo = start + len(frame)
            hi = min(start + want, c1)
            if lo < hi:
                frame += self._take(lo, hi, chunk, c0)
            if len(frame) < want:
                return False
            if self._frame_len:
                break
            self._frame_len = self._checked_length(start, bytes(frame), bound)
        data = bytes(frame)
        self._frame = bytearray()
        self._frame_len = 0
        self._last_end = start + len(data)
        self._out.add(virt, self._frame_data(virt, data))
        return True

    def _owe_frame(self, start: int, bound: int, virt: int, c0: int) -> bool:
        """A frame whose head went by before its table: if it lies wholly in the past, owe it
        (expanded lazily, as the writes are read) and say True; else it is assembled."""
        length = self._checked_length(start, self._past(start, start + FRAME_HEAD), bound)
        if start + length > c0:
            return False
        self._owe(start, start + length, virt, lambda data: (self._frame_data(virt, data), length))
        self._last_end = start + length
        return True

    def _checked_length(self, start: int, head: bytes, bound: int) -> int:
        length = self._frame_length(head, bound - start)
        if not FRAME_HEAD < length <= bound - start:
            raise InvalidImage(f"{self.format_name} frame at {start:#x} has a bad length")
        return length
