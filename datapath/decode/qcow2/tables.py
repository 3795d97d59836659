"""qcow2 L1 and L2 tables: turn table bytes into the extents the stream decoder waits for.

The decoder never keeps L2 entries one by one. An L2 table becomes a short list of *runs*,
``(host_start, host_end, virtual_start, kind)``: adjacent normal clusters that are adjacent both
in the file and on the virtual disk fold into one run (images written by ``qemu-img convert``
collapse to a handful of runs per table), zero and unallocated clusters vanish (they are holes),
compressed clusters are one run each. Runs are sorted by host offset because the file is read
front to back. Bit layouts follow docs/interop/qcow2.txt: L1 and standard L2 offsets in bits
9-55, bit 62 compressed, bit 0 "reads as zero"; compressed descriptors hold
``62 - (cluster_bits - 8)`` bits of byte offset then a count of extra 512-byte sectors;
extended L2 entries add a 64-bit bitmap (bits 0-31 allocated, 32-63 reads-as-zero).
"""

from __future__ import annotations

import itertools
import sys
from array import array
from bisect import bisect_left

from cdi.api.errors import InvalidImage, UnsafeImage

from .header import Qcow2Header

OFFSET_MASK = 0x00FFFFFFFFFFFE00
COMPRESSED = 1 << 62
ZERO_FLAG = 1
SECTOR = 512
SUBCLUSTERS = 32
ALL_SUBCLUSTERS = 0xFFFFFFFF

NORMAL = 0
COMPRESSED_RUN = 1

Run = tuple[int, int, int, int]
"""(host_start, host_end, virtual_start, kind); host_end - host_start bytes of the file."""


def be_u64(table: bytes) -> array:
    """Big-endian u64 table as a native array (one C-level pass, no per-entry unpacking)."""
    arr = array("Q")
    arr.frombytes(table[: len(table) - len(table) % 8])
    if sys.byteorder == "little":
        arr.byteswap()
    return arr


def parse_l1(table: bytes, header: Qcow2Header) -> list[tuple[int, int]]:
    """``(l2_offset, l1_index)`` for every allocated L1 entry that can map the virtual disk.

    Entries past the virtual size are ignored (qemu never reads them). Rejects unaligned
    offsets, L2 tables on top of the header or the L1 table, and two entries sharing a table.
    """
    cluster_size = header.cluster_size
    l1_start = header.l1_table_offset
    l1_end = l1_start + header.l1_size * 8
    found: list[tuple[int, int]] = []
    for index, entry in enumerate(be_u64(table)[: header.l1_entries_needed]):
        offset = entry & OFFSET_MASK
        if not offset:
            continue
        if offset % cluster_size:
            raise InvalidImage(f"L1 entry {index} points to unaligned L2 table {offset:#x}")
        if offset < cluster_size:
            raise UnsafeImage(f"L2 table {index} overlaps the header")
        if offset < l1_end and offset + cluster_size > l1_start:
            raise UnsafeImage(f"L2 table {index} at {offset:#x} overlaps the L1 table")
        found.append((offset, index))
    found.sort()
    for (a, _), (b, index) in itertools.pairwise(found):
        if a == b:
            raise UnsafeImage(f"L2 table {index} at {b:#x} is shared with another L1 entry")
    return found


class MetadataMap:
    """Where the active tables live, to reject data clusters that overlap them."""

    def __init__(self, header: Qcow2Header, l2_offsets: list[int]) -> None:
        self._cluster_size = header.cluster_size
        self._l1 = (header.l1_table_offset, header.l1_table_offset + header.l1_size * 8)
        self._l2 = array("q", sorted(l2_offsets))

    def overlaps(self, start: int, end: int) -> bool:
        if start < self._cluster_size:
            return True
        if start < self._l1[1] and end > self._l1[0]:
            return True
        i = bisect_left(self._l2, start - self._cluster_size + 1)
        return i < len(self._l2) and self._l2[i] < end


def parse_l2(table: bytes, header: Qcow2Header, l1_index: int) -> list[Run]:
    """Runs of one L2 table, sorted by host offset. Entries past the virtual size are ignored."""
    vbase = l1_index * header.l2_coverage
    count = min(header.l2_entries, -(-(header.virtual_size - vbase) // header.cluster_size))
    if count <= 0:
        return []
    entries = be_u64(table)
    if header.extended_l2:
        runs = _extended_runs(entries, count, vbase, header)
    else:
        runs = _standard_runs(entries, count, vbase, header)
    if any(runs[i][0] > runs[i + 1][0] for i in range(len(runs) - 1)):
        runs.sort()
    return runs


def compressed_extent(entry: int, cluster_bits: int) -> tuple[int, int]:
    """Host ``(start, end)`` of a compressed cluster as qemu reads it (may overrun the data)."""
    shift = 62 - (cluster_bits - 8)
    start = entry & ((1 << shift) - 1)
    sectors = ((entry >> shift) & ((1 << (cluster_bits - 8)) - 1)) + 1
    return start, start + sectors * SECTOR - (start & (SECTOR - 1))


def _standard_runs(entries: array, count: int, vbase: int, header: Qcow2Header) -> list[Run]:
    cluster_size, cluster_bits = header.cluster_size, header.cluster_bits
    runs: list[Run] = []
    last_end = last_vend = -1
    virt = vbase - cluster_size
    for entry in entries[:count]:
        virt += cluster_size
        if not entry:
            continue
        if entry & COMPRESSED:
            start, end = compressed_extent(entry, cluster_bits)
            runs.append((start, end, virt, COMPRESSED_RUN))
            continue
        offset = entry & OFFSET_MASK
        if entry & ZERO_FLAG or not offset:
            continue
        if offset % cluster_size:
            raise InvalidImage(f"L2 entry maps virtual {virt:#x} to unaligned {offset:#x}")
        if offset == last_end and virt == last_vend:
            start, _, vstart, _ = runs[-1]
            runs[-1] = (start, offset + cluster_size, vstart, NORMAL)
        else:
            runs.append((offset, offset + cluster_size, virt, NORMAL))
        last_end, last_vend = offset + cluster_size, virt + cluster_size
    return runs


def _extended_runs(entries: array, count: int, vbase: int, header: Qcow2Header) -> list[Run]:
    cluster_size, cluster_bits = header.cluster_size, header.cluster_bits
    sub = cluster_size // SUBCLUSTERS
    runs: list[Run] = []
    for i in range(count):
        entry, bitmap = entries[2 * i], entries[2 * i + 1]
        if not (entry or bitmap):
            continue
        virt = vbase + i * cluster_size
        if entry & COMPRESSED:
            start, end = compressed_extent(entry, cluster_bits)
            runs.append((start, end, virt, COMPRESSED_RUN))
            continue
        alloc, zero = bitmap & ALL_SUBCLUSTERS, bitmap >> 32
        offset = entry & OFFSET_MASK
        if alloc & zero:
            raise InvalidImage(f"extended L2 entry at {virt:#x} is both allocated and zero")
        if not alloc:
            continue
        if not offset or offset % cluster_size:
            raise InvalidImage(f"extended L2 entry at {virt:#x} has invalid offset {offset:#x}")
        for first, last in _bit_ranges(alloc):
            _append_run(runs, offset + first * sub, offset + last * sub, virt + first * sub)
    return runs


def _append_run(runs: list[Run], start: int, end: int, virt: int) -> None:
    if runs:
        pstart, pend, pvirt, kind = runs[-1]
        if kind == NORMAL and pend == start and pvirt + (pend - pstart) == virt:
            runs[-1] = (pstart, end, pvirt, NORMAL)
            return
    runs.append((start, end, virt, NORMAL))


def _bit_ranges(bits: int) -> list[tuple[int, int]]:
    """Half-open index ranges of consecutive set bits, least significant first."""
    if bits == ALL_SUBCLUSTERS:
        return [(0, SUBCLUSTERS)]
    ranges: list[tuple[int, int]] = []
    i = 0
    while bits:
        low = (bits & -bits).bit_length() - 1
        i += low
        bits >>= low
        ones = (~bits & (bits + 1)).bit_length() - 1
        ranges.append((i, i + ones))
        i += ones
        bits >>= ones
    return ranges
