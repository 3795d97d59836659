"""Streaming VMDK -> raw for the self-contained subformats; every other subformat refused.

What streams: a hosted sparse extent ("KDMV"), as qemu-img writes both ``monolithicSparse``
(its default) and ``streamOptimized``: a 512-byte header, the embedded descriptor, the
redundant and the primary grain directory (GD) each followed by its grain tables (GTs), then
the grains. The decoder follows qemu's reader (block/vmdk.c): only the primary GD and its GTs
are used; a grain table entry (GTE) is a sector offset, 0 for an unallocated grain and 1 for a
zeroed grain when the header says zeroed-grain GTEs are in use (both are holes in the target).
In ``streamOptimized`` images every grain is deflate-compressed behind a 12-byte marker (its
LBA and compressed size); it is decompressed with its output bounded by the grain size. The
tables come before the grains, so ``datapath.decode.mapped`` places each grain as it streams past.

Tables that come after the data they map stream with a ``spill`` (the grains wait there for
their tables), and so does a GD named only by the footer (``streamOptimized`` files written by
VMware tools: the whole stream waits in the spill, then the footer's header is read as qemu
does and the tables and grains are taken back). Without a spill both are
``LayoutNotStreamable``, like compressed grains without markers.

Refused: descriptor files (``monolithicFlat``, ``twoGbMaxExtent*``, ``vmfs``...) and KDMV
headers that defer to a descriptor (capacity 0): their extents are paths on the importer's file
system, which an image must never make us read; and a ``parentFileNameHint`` in the descriptor
qemu reads (a backing file). Header checks follow qemu's ``vmdk_open_vmdk4``.
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from isal import isal_zlib

from cdi.api.errors import InsufficientSpace, InvalidImage, UnsafeImage, UnsupportedFormat
from datapath.decode.mapped import FRAME, PLAIN, MappedImageDecoder
from datapath.decode.rawpieces import LayoutNotStreamable, Write
from datapath.decode.spill import Spill

MAGIC = b"KDMV"
DESCRIPTOR_MAGIC = b"# Disk DescriptorFile"
SECTOR = 512
HEADER_BYTES = 512
DESC_SIZE = 20 * SECTOR  # qemu reads this much descriptor text at 0x200 (vmdk_parent_open)
HEAD_BYTES = HEADER_BYTES + DESC_SIZE

FLAG_NL_DETECT = 1 << 0
FLAG_ZERO_GRAIN = 1 << 2
FLAG_MARKER = 1 << 17
COMPRESSION_NONE = 0
COMPRESSION_DEFLATE = 1
GD_AT_END = 0xFFFFFFFFFFFFFFFF
GTE_ZEROED = 1
NL_CHECK = b"\n \r\n"

MAX_VERSION = 3
MAX_GTES_PER_GT = 512  # qemu: "L2 table size too big"
MAX_GRANULARITY = 0x200000  # sectors; qemu: "Invalid granularity"
MAX_COMPRESSED_GRANULARITY = 4096  # sectors (2 MiB): a compressed grain is held whole
MAX_CAPACITY = 1 << 47  # sectors (64 PiB): beyond any real disk
MAX_GRAIN_TABLES = 1 << 18  # 8 TiB with qemu's 64 KiB grains and 512-entry tables
GT_BATCH = 256  # grain tables that lie back to back are read as one table of up to this many
MARKER = struct.Struct("<QI")  # LBA, compressed size
_MARKER_HEAD = struct.Struct("<QII")  # value, size, type of a metadata marker
MARKER_FOOTER = 3
FOOTER_BYTES = 3 * SECTOR  # footer marker, footer (a copy of the header), end-of-stream marker
_HEADER = struct.Struct("<IIQQQQIQQQ")  # version ... grain_offset, after the magic
_GD_TAG = -1
_HEX = re.compile(rb"[ \t\n\v\f\r]*[+-]?[0-9a-fA-F]")


@dataclass(frozen=True)
class VmdkHeader:
    """The vetted fields of a sparse extent header that decoding needs."""

    version: int
    flags: int
    capacity: int  # sectors
    granularity: int  # sectors per grain
    num_gtes_per_gt: int
    gd_offset: int  # sectors; GD_AT_END when only the footer knows
    grain_offset: int  # sectors
    compressed: bool

    @property
    def virtual_size(self) -> int:
        return self.capacity * SECTOR

    @property
    def grain_size(self) -> int:
        return self.granularity * SECTOR

    @property
    def grains(self) -> int:
        return -(-self.capacity // self.granularity)

    @property
    def gd_entries(self) -> int:
        return -(-self.capacity // (self.num_gtes_per_gt * self.granularity))

    @property
    def gt_bytes(self) -> int:
        return self.num_gtes_per_gt * 4

    @property
    def markers(self) -> bool:
        return bool(self.flags & FLAG_MARKER)

    @property
    def zeroed_grains(self) -> bool:
        return bool(self.flags & FLAG_ZERO_GRAIN)


def parse_header(head: bytes, *, max_virtual_size: int | None = None) -> VmdkHeader:
    """Parse and vet a vmdk from its first bytes (``HEAD_BYTES`` of them when the file has
    that many). Descriptor files and anything naming another file are refused here."""
    if not head.startswith(MAGIC):
        refuse_descriptor(head)
    if len(head) < HEADER_BYTES:
        raise InvalidImage(f"truncated vmdk header ({len(head)} bytes)")
    version, flags, capacity, granularity, desc_offset, _, gtes, _, gd, grain_offset = (
        _HEADER.unpack_from(head, 4)
    )
    compression = struct.unpack_from("<H", head, 77)[0]
    if capacity == 0 and desc_offset:
        raise UnsafeImage(
            "vmdk sparse header defers to its embedded descriptor's extents (capacity 0): "
            "those are paths on the importer's file system; refused"
        )
    _check_parent(head)
    if version > MAX_VERSION:
        raise UnsupportedFormat(f"vmdk version {version} is not supported")
    if compression not in (COMPRESSION_NONE, COMPRESSION_DEFLATE):
        raise UnsupportedFormat(f"vmdk compression algorithm {compression} is not supported")
    if flags & FLAG_NL_DETECT and head[73:77] != NL_CHECK:
        raise InvalidImage("vmdk newline check bytes are mangled (transferred as text?)")
    header = VmdkHeader(
        version, flags, capacity, granularity, gtes, gd, grain_offset,
        compression == COMPRESSION_DEFLATE,
    )  # fmt: skip
    _check_geometry(header, max_virtual_size)
    return header


def _check_parent(head: bytes) -> None:
    """qemu opens ``parentFileNameHint`` from the descriptor text at 0x200 as a backing file."""
    text = head[HEADER_BYTES:HEAD_BYTES].split(b"\0", 1)[0]
    if b"parentFileNameHint" in text:
        raise UnsafeImage("vmdk names a parent image (parentFileNameHint): a backing file")
    for key in (b"CID", b"parentCID"):  # qemu's vmdk_read_cid: strstr, then sscanf("%x")
        at = text.find(key)
        if at < 0 or not _HEX.match(text, at + len(key) + 1):
            raise InvalidImage(f"vmdk descriptor has no valid {key.decode()} (qemu refuses it)")


def _check_geometry(header: VmdkHeader, max_virtual_size: int | None) -> None:
    if not 0 < header.num_gtes_per_gt <= MAX_GTES_PER_GT:
        raise InvalidImage(f"vmdk grain table size {header.num_gtes_per_gt} is invalid")
    if not 0 < header.granularity <= MAX_GRANULARITY:
        raise InvalidImage(f"vmdk granularity {header.granularity} is invalid")
    if header.compressed and header.granularity > MAX_COMPRESSED_GRANULARITY:
        raise UnsupportedFormat(f"vmdk compressed grains of {header.grain_size} bytes")
    if header.capacity >= MAX_CAPACITY:
        raise InvalidImage(f"vmdk capacity of {header.capacity} sectors is absurd")
    if max_virtual_size is not None and header.virtual_size > max_virtual_size:
        raise InsufficientSpace(
            f"virtual size {header.virtual_size} exceeds the target's {max_virtual_size} bytes"
        )
    if header.gd_entries > MAX_GRAIN_TABLES:
        raise UnsafeImage(f"vmdk needs {header.gd_entries} grain tables, over {MAX_GRAIN_TABLES}")
    if header.gd_offset != GD_AT_END and header.capacity and header.gd_offset == 0:
        raise InvalidImage("vmdk grain directory overlaps the header")


def refuse_descriptor(text: bytes) -> NoReturn:
    """A text descriptor names the files that hold the data: never follow such a path."""
    if not text.startswith(DESCRIPTOR_MAGIC):
        raise InvalidImage("not a vmdk image: bad magic")
    body = text.split(b"\0", 1)[0].decode("latin-1")
    kind = re.search(r'createType\s*=\s*"([^"]*)"', body)
    names = re.findall(r'^\s*(?:RW|RDONLY|NOACCESS)\s+\d+\s+\w+\s+"([^"]*)"', body, re.M)
    create = kind.group(1) if kind else "unknown"
    if not names:
        raise InvalidImage(f"vmdk descriptor file (createType {create}) lists no extents")
    shown = ", ".join(repr(name) for name in names[:4]) + (" ..." if len(names) > 4 else "")
    raise UnsafeImage(
        f"vmdk descriptor file (createType {create}) keeps its data in other files ({shown}): "
        "an extent is a path on the importer's file system, like a backing file; refused. "
        "Convert it to a monolithicSparse or streamOptimized vmdk (or raw/qcow2) first"
    )


def _u32s(data: bytes) -> array[int]:
    entries = array("I")
    entries.frombytes(data)
    if sys.byteorder == "big":
        entries.byteswap()
    return entries


def inflate_grain(data: bytes, grain_size: int) -> bytes:
    """One zlib-compressed grain (qemu writes it with ``compress()``): the stream must end and
    may not produce more than a grain; output is bounded before it is produced."""
    inflater = isal_zlib.decompressobj()
    try:
        out = inflater.decompress(data, grain_size + 1)
    except isal_zlib.error as exc:  # type: ignore[misc]
        raise InvalidImage(f"corrupt compressed vmdk grain: {exc}") from None
    if len(out) > grain_size:
        raise InvalidImage(f"compressed vmdk grain expands beyond {grain_size} bytes")
    if not inflater.eof:
        raise InvalidImage("compressed vmdk grain is truncated")
    return out


class VmdkStreamDecoder(MappedImageDecoder):
    """Turn a monolithicSparse or streamOptimized vmdk byte stream into ``(virtual_offset,
    bytes)`` writes of the raw image (non-overlapping, zero pages left out)."""

    format_name = "vmdk"

    def __init__(
        self,
        *,
        max_virtual_size: int | None = None,
        file_size: int | None = None,
        spill: Spill | None = None,
    ) -> None:
        super().__init__(HEAD_BYTES, file_size=file_size, spill=spill)
        self._max_virtual_size = max_virtual_size
        self.header: VmdkHeader | None = None
        self._head_bytes = b""

    def finish(self) -> Iterable[Write]:
        writes = super().finish()
        header = self.header
        if header is not None and self.position < header.grain_offset * SECTOR:
            raise InvalidImage(
                f"vmdk stream ended at {self.position}, before its grain area at "
                f"{header.grain_offset * SECTOR} (truncated)"
            )
        return writes

    def _on_head(self, head: bytes) -> None:
        header = parse_header(head, max_virtual_size=self._max_virtual_size)
        self._set_virtual_size(header.virtual_size)
        if header.gd_offset == GD_AT_END:
            if self._spill is None:
                raise LayoutNotStreamable(
                    "vmdk grain directory is only in the footer; converting via scratch space"
                )
            self._head_bytes = head
            self._tables_later = True  # everything waits in the spill for the footer
            return
        self._use(header)

    def _use(self, header: VmdkHeader) -> None:
        if header.compressed and not header.markers:
            raise LayoutNotStreamable(
                "vmdk compressed grains without markers; converting via scratch space"
            )
        self.header = header
        if header.gd_entries:
            start = header.gd_offset * SECTOR
            self._want_table(start, start + header.gd_entries * 4, _GD_TAG)

    def _at_end(self) -> None:
        """qemu's reading of a footer (vmdk_open_vmdk4): a footer marker, the header that takes
        precedence over the first one, and an end-of-stream marker in the last 1536 bytes."""
        assert self._spill is not None
        end = self.position // SECTOR * SECTOR
        footer = self._spill.prefix(end - FOOTER_BYTES, end) if end >= FOOTER_BYTES else b""
        if len(footer) != FOOTER_BYTES:
            raise InvalidImage("vmdk stream ended without the footer its header announces")
        _, size, kind = _MARKER_HEAD.unpack_from(footer, 0)
        eos = _MARKER_HEAD.unpack_from(footer, 2 * SECTOR)
        if footer[SECTOR : SECTOR + 4] != MAGIC or (size, kind) != (0, MARKER_FOOTER) or any(eos):
            raise InvalidImage("vmdk footer is invalid")
        head = footer[SECTOR : 2 * SECTOR] + self._head_bytes[HEADER_BYTES:]
        header = parse_header(head, max_virtual_size=self._max_virtual_size)
        if header.gd_offset == GD_AT_END or header.virtual_size != self.virtual_size:
            raise InvalidImage("vmdk footer disagrees with the header (capacity, directory)")
        self._use(header)

    def _on_table(self, tag: int, table: bytes) -> None:
        if tag == _GD_TAG:
            self._on_directory(table)
            return
        header = self.header
        assert header is not None
        step = header.gt_bytes
        for k in range(len(table) // step):
            self._on_grain_table(tag + k, table[k * step : (k + 1) * step])

    def _on_directory(self, table: bytes) -> None:
        """Ask for every grain table; tables back to back in the file are read as one."""
        header = self.header
        assert header is not None
        step = header.gt_bytes
        wanted = sorted((sector * SECTOR, index) for index, sector in enumerate(_u32s(table)))
        run_start = run_index = run_count = 0
        for start, index in wanted:
            if start == 0:
                continue  # no grain table: the whole range is unallocated
            follows = start == run_start + run_count * step and index == run_index + run_count
            if run_count and follows and run_count < GT_BATCH:
                run_count += 1
                continue
            if run_count:
                self._want_table(run_start, run_start + run_count * step, run_index)
            run_start, run_index, run_count = start, index, 1
        if run_count:
            self._want_table(run_start, run_start + run_count * step, run_index)

    def _on_grain_table(self, index: int, table: bytes) -> None:
        if table.count(0) == len(table):
            return  # nothing allocated under this table
        header = self.header
        assert header is not None
        grain_size, size = header.grain_size, header.virtual_size
        first = index * header.num_gtes_per_gt
        zeroed = header.zeroed_grains
        for j, sector in enumerate(_u32s(table)):
            if first + j >= header.grains:
                break
            if sector == 0 or (zeroed and sector == GTE_ZEROED):
                continue
            virt = (first + j) * grain_size
            start = sector * SECTOR
            if header.compressed:
                self._add_extent(start, start + 2 * grain_size, virt, FRAME)
            else:
                self._add_extent(start, start + min(grain_size, size - virt), virt, PLAIN)

    def _frame_length(self, head: bytes, bound: int) -> int:
        _, size = MARKER.unpack_from(head)
        if size == 0:
            raise InvalidImage("vmdk grain table points at a metadata marker, not a grain")
        return MARKER.size + size

    def _frame_data(self, virt: int, frame: bytes) -> bytes:
        header = self.header
        assert header is not None
        lba, _ = MARKER.unpack_from(frame)
        if lba * SECTOR != virt:
            raise InvalidImage(
                f"vmdk grain marker says LBA {lba}, but its grain table maps it to sector "
                f"{virt // SECTOR}"
            )
        data = inflate_grain(frame[MARKER.size :], header.grain_size)
        needed = min(header.grain_size, header.virtual_size - virt)
        if len(data) < needed:
            raise InvalidImage(f"compressed vmdk grain at LBA {lba} holds only {len(data)} bytes")
        return data
