"""Zero detection at 4 KiB page granularity: which runs of a chunk are all zeros.

Shared by the raw writer (zero pages become holes, or are zeroed on a block device) and the
image decoders (``decode.rawpieces``), which leave zero pages out of their writes. Zero tests use
``bytes.startswith`` on a zero constant, a memcmp, never ``memoryview == bytes``, which runs
element by element at 0.5 GB/s (perf-baselines T6d).
"""

from __future__ import annotations

import re

ZERO_BLOCK = 64 * 1024
FINE_BLOCK = 4096  # the allocation unit of ext4/xfs: finer detection saves nothing
_ZERO = bytes(ZERO_BLOCK)
_ZERO_FINE = bytes(FINE_BLOCK)
# Bytes looked at in every page before it is memcmp'd: first, last, and spread in between.
_SAMPLES = (0, 512, 1024, 1536, 2048, 2560, 3072, 3584, FINE_BLOCK - 1)
_NONZERO = re.compile(b"[^\\x00]")


def page_segments(
    data: bytes, offset: int, lo: int = 0, hi: int | None = None
) -> list[tuple[int, int, bool]]:
    """Alternating maximal (start, stop, all_zero) runs of ``data[lo:hi]`` whose boundaries
    fall on absolute 4 KiB pages (``offset`` is where ``data[lo]`` sits in the image); a
    partial page at either end is a run of its own. Positions index ``data`` itself, so a
    caller can look at part of a chunk without slicing (copying) it first.

    The cost is per run, not per page: a per-page Python loop cost ~0.3 s per 600 MB of data.
    Every aligned page contributes a few sampled bytes (one strided slice per sample position,
    OR-ed as big integers); a page with any non-zero sample holds data. Only the stretches
    whose samples are all zero are checked, each with one memcmp against a zero constant
    (never a memoryview compare, perf-baselines T6d), and page by page only if that fails.
    """
    n = len(data) if hi is None else hi
    head = min(n, lo + -offset % FINE_BLOCK)
    tail_start = head + (n - head) // FINE_BLOCK * FINE_BLOCK
    runs: list[tuple[int, int, bool]] = []
    if head > lo:
        _add_run(runs, lo, head, data.startswith(_ZERO[: head - lo], lo))
    if tail_start > head:
        _aligned_runs(data, head, tail_start, runs)
    if tail_start < n:
        _add_run(runs, tail_start, n, data.startswith(_ZERO[: n - tail_start], tail_start))
    return runs


def _aligned_runs(data: bytes, lo: int, hi: int, runs: list[tuple[int, int, bool]]) -> None:
    pages = (hi - lo) // FINE_BLOCK
    sampled = 0
    for at in _SAMPLES:
        sampled |= int.from_bytes(data[lo + at : hi : FINE_BLOCK], "little")
    flags = sampled.to_bytes(pages, "little")  # 0: the page's samples are all zero
    page = 0
    while page < pages:
        quiet = flags.find(0, page)  # next page that might be all zeros
        if quiet < 0:
            quiet = pages
        if quiet > page:
            _add_run(runs, lo + page * FINE_BLOCK, lo + quiet * FINE_BLOCK, False)
        if quiet == pages:
            return
        match = _NONZERO.search(flags, quiet)
        loud = match.start() if match else pages
        _zero_or_mixed(data, lo + quiet * FINE_BLOCK, lo + loud * FINE_BLOCK, runs)
        page = loud


def _zero_or_mixed(data: bytes, lo: int, hi: int, runs: list[tuple[int, int, bool]]) -> None:
    """Pages [lo, hi) whose samples were all zero: usually all zero (one memcmp per 64 KiB)."""
    pos = lo
    while pos < hi:
        step = min(hi - pos, ZERO_BLOCK)
        if data.startswith(_ZERO if step == ZERO_BLOCK else _ZERO[:step], pos):
            _add_run(runs, pos, pos + step, True)
        else:
            for at in range(pos, pos + step, FINE_BLOCK):
                _add_run(runs, at, at + FINE_BLOCK, data.startswith(_ZERO_FINE, at))
        pos += step


def _add_run(runs: list[tuple[int, int, bool]], start: int, stop: int, zero: bool) -> None:
    if runs and runs[-1][2] == zero and runs[-1][1] == start:
        runs[-1] = (runs[-1][0], stop, zero)
    else:
        runs.append((start, stop, zero))
