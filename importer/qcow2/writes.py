"""Raw-image writes out of the qcow2 decoder: zero pages dropped, neighbours coalesced.

The decoder does its own zero detection, because it is the only layer that still knows the
virtual offset of every byte and because qemu-img's output (our oracle) is sparse at 4 KiB
granularity: every 4 KiB-aligned virtual page that is entirely zero is left out, and so are
zero fragments at the ends of a write. This relies on one contract with the sink: **the target
reads as zeros wherever nothing is written** (a fresh sparse file, or a device the pipeline has
zeroed or discarded).

Zero pages are found with ``bytes.find`` of a 4 KiB zero needle, which skips through non-zero
data at memory speed, and confirmed with ``bytes == bytes`` compares (a memcmp), never with a
memoryview compare or a per-byte loop (perf-baselines section 5). Surviving pieces that are
contiguous on the virtual disk are joined into writes of up to ``MAX_WRITE`` bytes.
"""

from __future__ import annotations

PAGE = 4096
BIG = 64 * 1024
ZERO_PAGE = bytes(PAGE)
ZERO_BIG = bytes(BIG)
FLUSH_AT = 4 * 1024 * 1024
MAX_WRITE = 8 * 1024 * 1024

Write = tuple[int, bytes]


def nonzero_pieces(virt: int, data: bytes) -> list[Write]:
    """Split ``data`` (at virtual offset ``virt``) into pieces that skip all-zero pages."""
    n = len(data)
    if n <= PAGE:
        return [] if data == ZERO_PAGE[:n] else _trim_edges([(virt, data)])
    pieces: list[Write] = []
    start = 0
    hit = data.find(ZERO_PAGE)
    while hit != -1:
        first = hit + (-(virt + hit) % PAGE)
        stop = _zero_pages_end(data, first)
        if stop > first:
            if first > start:
                pieces.append((virt + start, data[start:first]))
            start = stop
            hit = data.find(ZERO_PAGE, stop)
        else:
            hit = data.find(ZERO_PAGE, first + 1)
    if start == 0:
        pieces.append((virt, data))
    elif start < n:
        pieces.append((virt + start, data[start:]))
    return _trim_edges(pieces)


def _zero_pages_end(data: bytes, pos: int) -> int:
    """End of the run of whole zero pages starting at ``pos`` (``pos`` if none)."""
    n = len(data)
    while pos + PAGE <= n:
        if pos % BIG == 0 and pos + BIG <= n and data[pos : pos + BIG] == ZERO_BIG:
            pos += BIG
        elif data[pos : pos + PAGE] == ZERO_PAGE:
            pos += PAGE
        else:
            break
    if pos < n and n - pos < PAGE and data[pos:] == ZERO_PAGE[: n - pos]:
        return n  # a zero fragment that ends the buffer is a hole too
    return pos


def _trim_edges(pieces: list[Write]) -> list[Write]:
    """Drop zero fragments of partial pages at both ends: a neighbouring write (or nothing)
    covers the rest of those pages, so writing the zeros could only allocate a block."""
    if pieces:
        virt, data = pieces[0]
        head = min(-virt % PAGE, len(data))
        if head and data[:head] == ZERO_PAGE[:head]:
            virt, data = virt + head, data[head:]
        tail = (virt + len(data)) % PAGE
        if data and tail and len(data) >= tail and data[-tail:] == ZERO_PAGE[:tail]:
            data = data[:-tail]
        if data:
            pieces[0] = (virt, data)
        else:
            pieces.pop(0)
    if len(pieces) > 1:
        pieces[-1:] = _trim_edges(pieces[-1:])
    return pieces


class WriteCoalescer:
    """Collects pieces and hands back writes of up to ``MAX_WRITE`` contiguous bytes.

    Holds at most ``FLUSH_AT`` bytes between calls, so output lags input by a bounded amount;
    ``drain(final=True)`` returns everything.
    """

    def __init__(self, virtual_size: int) -> None:
        self._size = virtual_size
        self._ready: list[Write] = []
        self._start = 0
        self._parts: list[bytes] = []
        self._len = 0

    def add(self, virt: int, data: bytes) -> None:
        """Queue the raw bytes at ``virt``; zero pages and bytes past the disk end vanish."""
        if virt >= self._size or not data:
            return
        if virt + len(data) > self._size:
            data = data[: self._size - virt]
        for off, piece in nonzero_pieces(virt, data):
            self._append(off, piece)

    def _append(self, virt: int, piece: bytes) -> None:
        if self._len and (virt != self._start + self._len or self._len + len(piece) > MAX_WRITE):
            self._flush()
        if not self._len:
            self._start = virt
        self._parts.append(piece)
        self._len += len(piece)
        if self._len >= FLUSH_AT:
            self._flush()

    def _flush(self) -> None:
        if self._len:
            parts = self._parts
            self._ready.append((self._start, parts[0] if len(parts) == 1 else b"".join(parts)))
            self._parts = []
            self._len = 0

    def drain(self, *, final: bool = False) -> list[Write]:
        if final:
            self._flush()
        ready, self._ready = self._ready, []
        return ready
