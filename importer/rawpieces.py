"""What the streaming image decoders (qcow2, vdi, vmdk) hand the pipeline: raw writes with zero
pages dropped and neighbours coalesced, or the one signal that a layout cannot be streamed.

Each decoder does its own zero detection, because it is the only layer that still knows the
virtual offset of every byte and because qemu-img's output (our oracle) is sparse at 4 KiB
granularity: every 4 KiB-aligned virtual page that is entirely zero is left out, and so are
zero fragments at the ends of a write. This relies on one contract with the sink: **the target
reads as zeros wherever nothing is written** (a fresh sparse file, or a device the pipeline has
zeroed or discarded).

Zero pages are found by ``importer.target.page_segments``: one memcmp per aligned 64 KiB, then
per 4 KiB page only where data is (a memcmp fails at the first non-zero byte); never a
memoryview compare or a per-byte loop (perf-baselines section 5). A ``bytes.find`` of a 4 KiB
zero needle, tried first, cost 0.36 s per 2 GiB image on data full of short zero runs.
Surviving pieces that are contiguous on the virtual disk are joined into writes of up to
``MAX_WRITE`` bytes.
"""

from __future__ import annotations

from cdi.api.errors import WorkerError
from importer.target import page_segments

PAGE = 4096
FLUSH_AT = 4 * 1024 * 1024
MAX_WRITE = 8 * 1024 * 1024

Write = tuple[int, bytes]


class LayoutNotStreamable(WorkerError):
    """The image is valid as far as we can tell, but its layout cannot be decoded front to back
    within our bounds (a table after the data it maps, too much to hold): the phase machine
    downloads again through scratch space and lets qemu-img convert it."""

    reason = "ImageLayoutUnordered"
    transient = False


def nonzero_pieces(virt: int, data: bytes) -> list[Write]:
    """Split ``data`` (at virtual offset ``virt``) into pieces that skip all-zero pages and
    zero fragments of partial pages at its ends."""
    pieces: list[Write] = []
    run = -1
    for start, _stop, zero in page_segments(data, virt):
        if zero and run >= 0:
            pieces.append((virt + run, data[run:start]))
            run = -1
        elif not zero and run < 0:
            run = start
    if run >= 0:
        pieces.append((virt + run, data if run == 0 else data[run:]))
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
