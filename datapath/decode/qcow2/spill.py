"""The spill area: bytes that went by before we knew whether a table would map them.

A qcow2 file read front to back sometimes shows a data cluster (or an L2 table) before the
table that maps it: images rewritten in place, L2 tables copied on write after a snapshot, an
L1 table moved to the end by a resize. While any active table is still to come, the decoder
keeps every byte it could not place here, keyed by file offset, and takes them back when a
table maps them. The store is a sorted list of non-overlapping segments, appended in file
order in the common case; its size is capped by the caller (``SpillLimitExceeded``).
"""

from __future__ import annotations

from bisect import bisect_right


class SpillStore:
    """Non-overlapping byte segments keyed by file offset."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._data: list[bytearray] = []
        self.size = 0

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, offset: int, data: bytes) -> None:
        """Keep ``data`` at ``offset``; bytes already held are not stored twice."""
        end = offset + len(data)
        if not data:
            return
        last = len(self._starts) - 1
        if last >= 0 and offset == self._end(last):
            self._data[last] += data  # the common case: the next gap in file order
            self.size += len(data)
            return
        if last < 0 or offset > self._end(last):
            self._insert(last + 1, offset, data)
            return
        i = self._first_overlapping(offset)
        pos = offset
        while pos < end:
            if i < len(self._starts) and self._starts[i] <= pos:
                pos = max(pos, self._end(i))
                i += 1
                continue
            stop = min(end, self._starts[i]) if i < len(self._starts) else end
            self._insert(i, pos, data[pos - offset : stop - offset])
            i += 1
            pos = stop

    def read(self, start: int, end: int) -> list[tuple[int, bytes]]:
        """Held pieces of ``[start, end)`` in order (gaps are simply missing)."""
        out: list[tuple[int, bytes]] = []
        i = self._first_overlapping(start)
        while i < len(self._starts) and self._starts[i] < end:
            seg_start, seg = self._starts[i], self._data[i]
            lo, hi = max(start, seg_start), min(end, seg_start + len(seg))
            if lo < hi:
                out.append((lo, memoryview(seg)[lo - seg_start : hi - seg_start].tobytes()))
            i += 1
        return out

    def discard(self, start: int, end: int) -> None:
        """Forget ``[start, end)``. Trimming either end of a segment is cheap (bytearray
        deletes from the front in O(1)), which is the usual case: runs are taken in order."""
        if end <= start:
            return
        i = self._first_overlapping(start)
        while i < len(self._starts) and self._starts[i] < end:
            seg_start, seg = self._starts[i], self._data[i]
            seg_end = seg_start + len(seg)
            lo, hi = max(start, seg_start), min(end, seg_end)
            self.size -= hi - lo
            if lo == seg_start and hi == seg_end:
                del self._starts[i], self._data[i]
                continue
            if lo == seg_start:
                del seg[: hi - seg_start]
                self._starts[i] = hi
            elif hi == seg_end:
                del seg[lo - seg_start :]
            else:
                tail = seg[hi - seg_start :]
                del seg[lo - seg_start :]
                self._starts.insert(i + 1, hi)
                self._data.insert(i + 1, tail)
            i += 1

    def clear(self) -> None:
        self._starts.clear()
        self._data.clear()
        self.size = 0

    def _first_overlapping(self, offset: int) -> int:
        i = bisect_right(self._starts, offset) - 1
        if i >= 0 and self._end(i) > offset:
            return i
        return i + 1

    def _end(self, i: int) -> int:
        return self._starts[i] + len(self._data[i])

    def _insert(self, i: int, offset: int, data: bytes | bytearray) -> None:
        if data:
            self._starts.insert(i, offset)
            self._data.insert(i, bytearray(data))
            self.size += len(data)
