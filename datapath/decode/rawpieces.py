"""What the streaming image decoders (qcow2, vdi, vmdk) hand the pipeline: raw writes with zero
pages dropped and neighbours coalesced, or the one signal that a layout cannot be streamed.

Each decoder does its own zero detection, because it is the only layer that still knows the
virtual offset of every byte and because qemu-img's output (our oracle) is sparse at 4 KiB
granularity: every 4 KiB-aligned virtual page that is entirely zero is left out, and so are
zero fragments at the ends of a write. This relies on one contract with the sink: **the target
reads as zeros wherever nothing is written** (a fresh sparse file, or a device the pipeline has
zeroed or discarded).

Zero pages are found by ``datapath.target.page_segments`` (sampled bytes per page, memcmp only
where the samples are all zero; never a memoryview compare or a per-byte loop, perf-baselines
section 5). Pieces are zero-copy views of the decoder's chunk: every copy of the image costs
~0.1 s of GIL-held CPU per 600 MB. Neighbours on the virtual disk that are whole pages go out
as they are, because the O_DIRECT writer gathers contiguous pieces into its aligned buffers
anyway; runs with unaligned parts (512-byte clusters, the disk's last page) are joined into
writes of up to ``MAX_WRITE`` bytes so the page cache path sees few, larger writes.
"""

from __future__ import annotations

from cdi.api.errors import WorkerError
from datapath.target.zeros import page_segments

PAGE = 4096
FLUSH_AT = 4 * 1024 * 1024
MAX_WRITE = 8 * 1024 * 1024

Write = tuple[int, bytes | memoryview]


class LayoutNotStreamable(WorkerError):
    """The image is valid as far as we can tell, but its layout cannot be decoded front to back
    within our bounds (a table after the data it maps, too much to hold): the phase machine
    downloads again through scratch space and lets qemu-img convert it."""

    reason = "ImageLayoutUnordered"
    transient = False


def nonzero_pieces(virt: int, data: bytes, lo: int = 0, hi: int | None = None) -> list[Write]:
    """Split ``data[lo:hi]`` (``data[lo]`` at virtual offset ``virt``) into pieces that skip
    all-zero pages and zero fragments of partial pages at its ends, as views (no copy)."""
    hi = len(data) if hi is None else hi
    pieces: list[Write] = []
    for start, stop, zero in page_segments(data, virt, lo, hi):
        if not zero:
            whole = start == 0 and stop == len(data)
            pieces.append((virt + start - lo, data if whole else memoryview(data)[start:stop]))
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
        self._parts: list[bytes | memoryview] = []
        self._len = 0

    def add(self, virt: int, data: bytes, lo: int = 0, hi: int | None = None) -> None:
        """Queue the raw bytes ``data[lo:hi]`` at ``virt``; zero pages and bytes past the
        disk end vanish."""
        hi = len(data) if hi is None else hi
        if virt >= self._size or hi <= lo:
            return
        hi = min(hi, lo + self._size - virt)
        for off, piece in nonzero_pieces(virt, data, lo, hi):
            self._append(off, piece)

    def _append(self, virt: int, piece: bytes | memoryview) -> None:
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
            if len(parts) == 1:
                self._ready.append((self._start, parts[0]))
            elif self._start % PAGE == 0 and all(len(p) % PAGE == 0 for p in parts):
                at = self._start
                for part in parts:  # whole pages: the writer gathers them without a join
                    self._ready.append((at, part))
                    at += len(part)
            else:
                self._ready.append((self._start, b"".join(parts)))
            self._parts = []
            self._len = 0

    def drain(self, *, final: bool = False) -> list[Write]:
        if final:
            self._flush()
        ready, self._ready = self._ready, []
        return ready
