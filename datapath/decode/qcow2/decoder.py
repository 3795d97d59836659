"""Sans-I/O streaming qcow2 -> raw decoder: feed the file front to back, get raw writes out.

How it works. After the header (first cluster) the decoder knows where the active L1 table is.
Everything it is waiting for lives in one min-heap keyed by file offset: the L1 table, the L2
tables named by L1, and the data *runs* named by L2 (see ``tables``). Each ``feed`` covers the
file range ``[c0, c1)``; every heap item that starts before ``c1`` is served from the chunk,
and from the spill area for the part that went by before the item was known. Normal data is
streamed piecewise (a run may straddle chunks); tables and compressed clusters are assembled
whole, then parsed or decompressed. Snapshot tables and refcount structures are never asked
for, so they simply flow past.

Why a spill area: while some active table has not arrived yet, any byte we could not place
might still be mapped by it, so such bytes are kept (``datapath.decode.spill.Spill``, injected
as ``spill=``; by default one in memory only, bounded by ``spill_limit``); when the last
pending table arrives the spill is dropped. A spill with a scratch directory takes any amount
of disorder in one pass; a memory-only one raises ``SpillLimitExceeded`` past its bound so the
pipeline can fall back to scratch space + qemu-img.

Memory: the header cluster, the active L1 table (capped at qemu's 32 MiB), the runs of L2
tables whose data is still ahead (capped by ``max_pending_runs``), whole tables or compressed
clusters in assembly (one cluster each), the spill's memory (capped), and at most
``FLUSH_AT`` bytes of coalesced output. Nothing grows with the image size beyond those caps.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from cdi.api.errors import InvalidImage, UnsafeImage
from datapath.decode.rawpieces import LayoutNotStreamable, Write, WriteCoalescer
from datapath.decode.spill import Spill, SpillLimitExceeded, settle, with_repaid

from .clusters import inflate_cluster, zstd_cluster
from .header import COMPRESSION_ZSTD, Qcow2Header, parse_header, peek_cluster_size
from .tables import COMPRESSED_RUN, MetadataMap, Run, parse_l1, parse_l2

DEFAULT_SPILL_LIMIT = 64 * 1024 * 1024
# A pending run costs ~200 bytes of Python objects (tuple of four ints in a list): 500,000
# are ~100 MB, a bound the importer pod's 600M limit can take (docs/importer.md). Beyond it
# the layout is converted through scratch space instead (LayoutNotStreamable).
DEFAULT_MAX_PENDING_RUNS = 500_000
# Each pending L2 table costs ~370 bytes until it arrives: 65,536 are ~24 MiB. That covers 32 TiB
# at qemu's default 64 KiB clusters (128 GiB at 4 KiB); more go through scratch + qemu-img.
MAX_L2_TABLES = 1 << 16

__all__ = ["Qcow2StreamDecoder", "SpillLimitExceeded"]


@dataclass(slots=True)
class _Table:
    """An L1 or L2 table being assembled (``l1_index`` is -1 for L1)."""

    start: int
    end: int
    l1_index: int
    acc: bytearray = field(default_factory=bytearray)


@dataclass(slots=True)
class _Compressed:
    """A compressed cluster being assembled (it may straddle chunk boundaries).

    qemu packs compressed clusters back to back, and each one's range runs to the end of its
    last 512-byte sector, past its real stream, so ranges overlap their neighbours' heads. A
    compressed cluster therefore claims only the bytes its stream really used, known once it
    is decompressed; until then its bytes count as unclaimed (and are spilled while tables are
    pending, in case a neighbour mapped by a later table starts among them).
    """

    start: int
    end: int
    virt: int
    acc: bytearray


@dataclass(slots=True)
class _Runs:
    """The runs of one L2 table, consumed in host order from ``index``."""

    runs: list[Run]
    index: int = 0


_Item = _Table | _Compressed | _Runs


class Qcow2StreamDecoder:
    """Turn a qcow2 byte stream into ``(virtual_offset, bytes)`` writes of the raw image.

    Writes never overlap, skip zero pages, and assume the target reads as zeros where nothing
    is written. ``file_size`` (e.g. from Content-Length) is optional; when given, tables that
    point past it are rejected as soon as they are read and a short stream is reported.
    ``spill`` holds data that comes before its table (``spill_limit`` only sizes the default,
    memory-only one); the caller owns it and closes it.
    """

    def __init__(
        self,
        *,
        max_virtual_size: int | None = None,
        spill_limit: int = DEFAULT_SPILL_LIMIT,
        file_size: int | None = None,
        max_pending_runs: int = DEFAULT_MAX_PENDING_RUNS,
        spill: Spill | None = None,
    ) -> None:
        self.virtual_size: int | None = None
        self._max_virtual_size = max_virtual_size
        self._file_size = file_size
        self._max_pending_runs = max_pending_runs
        self._header: Qcow2Header | None = None
        self._head = bytearray()
        self._pos = 0
        self._heap: list[tuple[int, int, _Item]] = []
        self._seq = itertools.count()
        self._pending_tables = 0
        self._pending_runs = 0
        self._meta: MetadataMap | None = None
        self._spill = spill if spill is not None else Spill(memory_limit=spill_limit)
        self._out = WriteCoalescer(0)
        self._finished = False

    @property
    def header(self) -> Qcow2Header | None:
        return self._header

    @property
    def spill_bytes_peak(self) -> int:
        """The most bytes the spill held in memory at once."""
        return self._spill.memory_peak

    @property
    def position(self) -> int:
        """File offset of the next byte to feed."""
        return self._pos

    def feed(self, data: bytes | memoryview | bytearray) -> Iterable[Write]:
        """Consume the next bytes of the file; return the raw writes that are ready (data
        read back from a spill comes lazily, as the result is iterated)."""
        if self._finished:
            raise RuntimeError("feed() after finish()")
        early = settle(self._spill, self.virtual_size)
        chunk = data if isinstance(data, bytes) else bytes(data)
        if self._header is None:
            chunk = self._feed_head(chunk)
        if chunk:
            self._process(chunk)
        writes = self._out.drain()
        return with_repaid(early + writes if early else writes, self._spill, self.virtual_size)

    def flush(self) -> list[Write]:
        """Return all buffered writes now, without ending the stream."""
        return settle(self._spill, self.virtual_size) + self._out.drain(final=True)

    def finish(self) -> list[Write]:
        """End of stream: return the last writes, or raise if anything mapped never came."""
        self._finished = True
        early = settle(self._spill, self.virtual_size)
        if self._header is None:
            raise InvalidImage(f"qcow2 stream ended after {self._pos} bytes, inside the header")
        if self._file_size is not None and self._pos != self._file_size:
            raise InvalidImage(f"qcow2 stream has {self._pos} bytes, expected {self._file_size}")
        missing: list[tuple[int, str]] = []
        for start, _, item in sorted(self._heap, key=lambda entry: entry[:2]):
            if isinstance(item, _Compressed):
                self._finish_compressed(item, b"", self._pos, None)
            else:
                missing.append((start, _describe(item)))
        self._heap.clear()
        if missing:
            start, what = missing[0]
            raise InvalidImage(
                f"qcow2 stream ended at {self._pos} but {what} at {start:#x} never arrived "
                f"({len(missing)} item(s) missing: truncated, or a table points past the end)"
            )
        return early + self._out.drain(final=True)

    # -- header --------------------------------------------------------------------------

    def _feed_head(self, chunk: bytes) -> bytes:
        """Collect the first cluster; parse it once complete; return the bytes after it."""
        head = self._head
        if len(head) < 24:
            take = 24 - len(head)
            head += chunk[:take]
            chunk = chunk[take:]
        cluster_size = peek_cluster_size(bytes(head[:24]))
        if cluster_size is None:
            self._pos = len(head)
            return b""
        take = cluster_size - len(head)
        head += chunk[:take]
        chunk = chunk[take:]
        self._pos = len(head)
        if len(head) < cluster_size:
            return b""
        self._start(parse_header(bytes(head), max_virtual_size=self._max_virtual_size))
        self._head = bytearray()
        return chunk

    def _start(self, header: Qcow2Header) -> None:
        self._header = header
        self.virtual_size = header.disk_size
        self._out = WriteCoalescer(header.disk_size)
        needed = header.l1_entries_needed
        if needed:
            start = header.l1_table_offset
            self._check_in_file(start, start + needed * 8, "L1 table")
            self._push(start, _Table(start, start + needed * 8, -1))
            self._pending_tables = 1

    # -- the chunk loop ------------------------------------------------------------------

    def _process(self, chunk: bytes) -> None:
        c0 = self._pos
        c1 = c0 + len(chunk)
        served: list[tuple[int, int]] | None = [] if self._pending_tables else None
        heap = self._heap
        while heap and heap[0][0] < c1:
            _, _, item = heapq.heappop(heap)
            if isinstance(item, _Runs):
                self._serve_runs(item, chunk, c0, c1, served)
            elif isinstance(item, _Table):
                self._serve_table(item, chunk, c0, c1, served)
            else:
                self._serve_compressed(item, chunk, c0, c1, served)
        self._pos = c1
        if served is not None and self._pending_tables:
            self._spill.add_gaps(chunk, c0, served)
        elif self._spill.size:
            # Every table has arrived and all that it mapped was served: nothing else can
            # ever claim the kept bytes.
            self._spill.clear()

    def _push(self, start: int, item: _Item) -> None:
        heapq.heappush(self._heap, (start, next(self._seq), item))

    def _past(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` that went by before being claimed; they must be contiguous."""
        data = self._spill.prefix(start, end)
        if len(data) != end - start:
            _not_kept(start + len(data))
        return data

    def _owe(self, start: int, end: int, virt: int) -> None:
        held = self._spill.owe(start, end, virt)
        if held != end - start:
            _not_kept(start + held)

    # -- data runs -----------------------------------------------------------------------

    def _serve_runs(
        self, item: _Runs, chunk: bytes, c0: int, c1: int, served: list[tuple[int, int]] | None
    ) -> None:
        runs = item.runs
        while item.index < len(runs):
            start, end, virt, kind = runs[item.index]
            if start >= c1:
                self._push(start, item)
                return
            item.index += 1
            self._pending_runs -= 1
            if kind == COMPRESSED_RUN:
                self._serve_compressed_run(
                    _Compressed(start, end, virt, bytearray()), chunk, c0, c1, served
                )
                continue
            if start < c0:  # went by before its table: owed, read back lazily
                self._owe(start, min(end, c0), virt)
            lo, hi = max(start, c0), min(end, c1)
            if lo < hi:
                self._out.add(virt + lo - start, chunk, lo - c0, hi - c0)
                if served is not None:
                    served.append((lo, hi))
            if end > c1:
                runs[item.index - 1] = (c1, end, virt + c1 - start, kind)
                item.index -= 1
                self._pending_runs += 1
                self._push(c1, item)
                return

    def _serve_compressed_run(
        self,
        item: _Compressed,
        chunk: bytes,
        c0: int,
        c1: int,
        served: list[tuple[int, int]] | None,
    ) -> None:
        if item.start < c0:
            past_end = min(item.end, c0)
            held = self._spill.held(item.start, past_end)
            if item.end <= c0 or held < past_end - item.start:
                # Wholly in the past, or cut by a gap (the real stream must end before it, as
                # at EOF): expanded lazily, as the writes are read (memory stays bounded).
                self._spill.owe(item.start, item.start + held, item.virt, self._expand)
                return
            item.acc += self._spill.prefix(item.start, past_end)
        self._serve_compressed(item, chunk, c0, c1, served)

    def _serve_compressed(
        self,
        item: _Compressed,
        chunk: bytes,
        c0: int,
        c1: int,
        served: list[tuple[int, int]] | None,
    ) -> None:
        lo = max(item.start + len(item.acc), c0)
        piece = chunk[lo - c0 : min(item.end, c1) - c0] if lo < c1 else b""
        if item.end > c1:
            item.acc += piece
            self._push(c1, item)
            return
        self._finish_compressed(item, piece, c0, served)

    def _finish_compressed(
        self, item: _Compressed, piece: bytes, c0: int, served: list[tuple[int, int]] | None
    ) -> None:
        """Decompress a whole compressed cluster (its overrun may be missing at EOF), then
        claim exactly the bytes its stream used: in this chunk, and in the spill."""
        out, used = self._expand(bytes(item.acc) + piece if item.acc else piece)
        self._out.add(item.virt, out)
        real_end = item.start + used
        if served is not None and real_end > max(item.start, c0):
            served.append((max(item.start, c0), real_end))
        self._spill.discard(item.start, min(real_end, c0))

    def _expand(self, data: bytes) -> tuple[bytes, int]:
        """One compressed cluster: ``(cluster bytes, input bytes its stream used)``."""
        header = self._header
        assert header is not None
        if header.compression_type == COMPRESSION_ZSTD:
            return zstd_cluster(data, header.cluster_size)
        return inflate_cluster(data, header.cluster_size)

    # -- tables --------------------------------------------------------------------------

    def _serve_table(
        self, item: _Table, chunk: bytes, c0: int, c1: int, served: list[tuple[int, int]] | None
    ) -> None:
        if item.start < c0 and not item.acc:
            past_end = min(item.end, c0)
            item.acc += self._past(item.start, past_end)
            self._spill.discard(item.start, past_end)
        lo, hi = max(item.start + len(item.acc), c0), min(item.end, c1)
        if lo < hi:
            item.acc += chunk[lo - c0 : hi - c0]
            if served is not None:
                served.append((lo, hi))
        if item.end > c1:
            self._push(c1, item)
            return
        table = bytes(item.acc)
        item.acc = bytearray()
        if item.l1_index < 0:
            self._on_l1(table)
        else:
            self._on_l2(table, item.l1_index)
        self._pending_tables -= 1

    def _on_l1(self, table: bytes) -> None:
        header = self._header
        assert header is not None
        l2s = parse_l1(table, header)
        if len(l2s) > MAX_L2_TABLES:
            raise LayoutNotStreamable(
                f"qcow2 image has {len(l2s)} L2 tables, over {MAX_L2_TABLES} to stream; "
                "converting via scratch space instead"
            )
        self._meta = MetadataMap(header, [offset for offset, _ in l2s])
        for offset, index in l2s:
            self._check_in_file(offset, offset + header.cluster_size, "L2 table")
            self._push(offset, _Table(offset, offset + header.cluster_size, index))
        self._pending_tables += len(l2s)

    def _on_l2(self, table: bytes, l1_index: int) -> None:
        header, meta = self._header, self._meta
        assert header is not None and meta is not None
        runs = parse_l2(table, header, l1_index)
        if not runs:
            return
        for start, end, virt, kind in runs:
            if meta.overlaps(start, end):
                raise UnsafeImage(
                    f"data for virtual offset {virt:#x} at {start:#x} overlaps qcow2 metadata"
                )
            self._check_in_file(start, start + 1 if kind == COMPRESSED_RUN else end, "data")
        self._pending_runs += len(runs)
        if self._pending_runs > self._max_pending_runs:
            raise LayoutNotStreamable(
                f"qcow2 tables map more than {self._max_pending_runs} separate extents ahead "
                "of the stream; converting via scratch space instead"
            )
        self._push(runs[0][0], _Runs(runs))

    def _check_in_file(self, start: int, end: int, what: str) -> None:
        if self._file_size is not None and end > self._file_size:
            raise UnsafeImage(
                f"qcow2 {what} at {start:#x} points outside the file ({self._file_size} bytes)"
            )


def _not_kept(offset: int) -> NoReturn:
    raise InvalidImage(
        f"qcow2 bytes at {offset:#x} were claimed by a table that came later than them and "
        "were not kept (overlapping structures)"
    )


def _describe(item: _Item) -> str:
    if isinstance(item, _Table):
        return "the L1 table" if item.l1_index < 0 else f"the L2 table #{item.l1_index}"
    if isinstance(item, _Runs):
        return f"data for virtual offset {item.runs[item.index][2]:#x}"
    return "a compressed cluster"
