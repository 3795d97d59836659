"""Turn run results into medians, ratio rows and the printed tables (text, markdown, JSON).

Pure functions over `RunResult`s, so the unit tests can check the formatting without timing
anything. A ratio is reference median / our median over the successful runs; allocation and
peak RSS come from our runs (peak RSS is the maximum over all of them).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

from benchmarks.measure import RunResult
from benchmarks.routes import ALLOC_RATIO_LIMIT, PEAK_RSS_LIMIT_MB, RatioRow, Route


@dataclass(frozen=True)
class RouteSummary:
    """Medians and facts of one route over all its rounds."""

    name: str
    description: str
    runs: int
    failures: int
    median: float | None
    low: float | None
    high: float | None
    user: float | None
    sys: float | None
    peak_rss_mb: float | None
    allocated: int | None
    verified: bool | None
    scratch_used: object = None
    self_reported: float | None = None
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class RowResult:
    """One ratio row: the comparison the issues set a target for."""

    key: str
    label: str
    target: float
    issue: int
    ratio: float | None
    ours_s: float | None
    reference_s: float | None
    alloc_ratio: float | None
    peak_rss_mb: float | None
    passed: bool | None
    notes: tuple[str, ...] = field(default_factory=tuple)


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def summarize(route: Route, results: Iterable[RunResult]) -> RouteSummary:
    runs = [r for r in results if r.route == route.name]
    ok = [r for r in runs if r.ok]
    verified = [r.verified for r in runs if r.verified is not None]
    allocated = [r.allocated for r in ok if r.allocated is not None]
    scratch = [r.report.get("scratch_used") for r in ok if "scratch_used" in r.report]
    durations = [
        float(d) for r in ok if isinstance(d := r.report.get("duration_seconds"), int | float)
    ]
    return RouteSummary(
        name=route.name,
        description=route.description,
        runs=len(runs),
        failures=len(runs) - len(ok),
        median=_median([r.seconds for r in ok]),
        low=min((r.seconds for r in ok), default=None),
        high=max((r.seconds for r in ok), default=None),
        user=_median([r.user for r in ok]),
        sys=_median([r.sys for r in ok]),
        peak_rss_mb=max((r.maxrss_mb for r in runs if r.returncode == 0), default=None),
        allocated=int(statistics.median(allocated)) if allocated else None,
        verified=all(verified) if verified else None,
        scratch_used=next((s for s in scratch if s), scratch[0] if scratch else None),
        self_reported=_median(durations),
        errors=tuple(dict.fromkeys(r.error for r in runs if r.error)),
    )


def evaluate(row: RatioRow, summaries: dict[str, RouteSummary]) -> RowResult:
    ours, ref = summaries.get(row.ours), summaries.get(row.reference)
    notes: list[str] = []
    for side, s in (("ours", ours), ("reference", ref)):
        if s is None:
            notes.append(f"{side} not selected")
        elif s.median is None:
            notes.append(f"{side} failed: {s.errors[0] if s.errors else 'no successful run'}")
        elif s.failures:
            notes.append(f"{side}: {s.failures}/{s.runs} runs failed")
        if s is not None and s.verified is False:
            notes.append(f"{side}: output did not verify")
    ratio = (
        ref.median / ours.median
        if ours and ref and ours.median and ref.median is not None
        else None
    )
    alloc = (
        ours.allocated / ref.allocated
        if ours and ref and ours.allocated is not None and ref.allocated
        else None
    )
    rss = ours.peak_rss_mb if ours else None
    passed: bool | None = None
    if ratio is not None:
        passed = ratio >= row.target
        if alloc is not None and alloc > ALLOC_RATIO_LIMIT:
            passed = False
            notes.append(f"allocated {alloc:.3f}x the reference (limit {ALLOC_RATIO_LIMIT})")
        if rss is not None and rss >= PEAK_RSS_LIMIT_MB:
            passed = False
            notes.append(f"peak RSS {rss:.0f} MB (limit {PEAK_RSS_LIMIT_MB:.0f})")
    if row.floor:
        notes.append("floor: C tools in our place, not ours")
    if ours is not None and ours.scratch_used:
        notes.append(f"ours used scratch: {ours.scratch_used}")
        if row.needs_zero_scratch and passed:
            passed = False
    return RowResult(
        row.key,
        row.label,
        row.target,
        row.issue,
        ratio,
        ours.median if ours else None,
        ref.median if ref else None,
        alloc,
        rss,
        passed,
        tuple(notes),
    )


def _f(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _verdict(p: bool | None) -> str:
    return {True: "PASS", False: "FAIL", None: "n/a"}[p]


ROW_HEADERS = (
    "comparison",
    "issue",
    "ref s",
    "ours s",
    "ratio",
    "target",
    "alloc o/r",
    "ours RSS MB",
    "result",
    "notes",
)
ROUTE_HEADERS = (
    "route",
    "median s",
    "range s",
    "usr/sys s",
    "self s",
    "alloc MiB",
    "peak RSS MB",
    "ok",
    "sha256",
    "what",
)


def row_cells(r: RowResult) -> list[str]:
    return [
        r.label,
        f"#{r.issue}",
        _f(r.reference_s, ".2f"),
        _f(r.ours_s, ".2f"),
        _f(r.ratio, ".2f"),
        f">= {r.target:g}",
        _f(r.alloc_ratio, ".3f"),
        _f(r.peak_rss_mb, ".0f"),
        _verdict(r.passed),
        "; ".join(r.notes),
    ]


def route_cells(s: RouteSummary) -> list[str]:
    rng = "-" if s.low is None else f"{s.low:.2f}-{s.high:.2f}"
    cpu = "-" if s.user is None else f"{s.user:.2f} / {s.sys:.2f}"
    alloc = "-" if s.allocated is None else f"{s.allocated / 2**20:.1f}"
    sha = {True: "OK", False: "BAD", None: "-"}[s.verified]
    what = s.description + (f" [{s.errors[0][:80]}]" if s.errors else "")
    return [
        s.name,
        _f(s.median, ".2f"),
        rng,
        cpu,
        _f(s.self_reported, ".2f"),
        alloc,
        _f(s.peak_rss_mb, ".0f"),
        f"{s.runs - s.failures}/{s.runs}",
        sha,
        what,
    ]


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned, space-padded columns; the last column is not padded."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells[:-1], widths[:-1], strict=True)]
        return "  ".join([*padded, cells[-1]]).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    def esc(c: str) -> str:
        return c.replace("|", "\\|")

    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def render(rows: Sequence[RowResult], summaries: Sequence[RouteSummary], *, markdown: bool) -> str:
    table = markdown_table if markdown else text_table
    return "\n\n".join(
        [
            table(ROW_HEADERS, [row_cells(r) for r in rows]),
            table(ROUTE_HEADERS, [route_cells(s) for s in summaries]),
        ]
    )


def to_json(
    rows: Sequence[RowResult],
    summaries: Sequence[RouteSummary],
    results: Sequence[RunResult],
    meta: dict[str, object],
) -> dict[str, object]:
    return {
        "meta": meta,
        "ratios": [asdict(r) for r in rows],
        "routes": [asdict(s) for s in summaries],
        "runs": [asdict(r) for r in results],
    }
