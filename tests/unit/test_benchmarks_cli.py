"""The benchmark harness's options, route table and report formatting (nothing is timed here).

These keep `benchmarks/` from rotting between the rare full runs: the parser accepts the
documented options, route selection can leave our importer out, every ratio row points at real
routes, and the tables render results (including failures) without running a command.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from benchmarks import cli, report
from benchmarks.measure import Paths, RunResult, reference_argv
from benchmarks.routes import RATIO_ROWS, ROUTES, rows_for, select_routes, split_patterns
from benchmarks.server import make_app, parse_range


def test_defaults_are_the_full_run() -> None:
    args = cli.parse_args([])
    assert args.rounds == 3
    assert args.size == 2 << 30
    assert args.warm_gib == 3.0
    assert args.workdir == Path("/var/tmp/cdi-bench")
    assert 550 <= args.data_mb <= 650


def test_quick_shrinks_the_image_and_the_warm_up() -> None:
    args = cli.parse_args(["--quick", "--rounds", "2", "--json", "o.json", "--markdown"])
    assert args.size == 256 << 20
    assert args.warm_gib < 1
    assert args.rounds == 2 and args.markdown and args.json == Path("o.json")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2G", 2 << 30), ("256M", 256 << 20), ("256MiB", 256 << 20), ("4096", 4096)],
)
def test_sizes_use_binary_units(text: str, expected: int) -> None:
    assert cli.parse_size(text) == expected


def test_a_bad_size_is_rejected() -> None:
    with pytest.raises(SystemExit):
        cli.parse_args(["--size", "lots"])


def test_only_references_leaves_our_importer_out() -> None:
    chosen = select_routes(split_patterns(["*.ref-*"]))
    assert chosen and not any(r.ours for r in chosen)
    assert len(chosen) == sum(not r.ours for r in ROUTES)


def test_a_bare_word_selects_a_whole_comparison() -> None:
    names = [r.name for r in select_routes(split_patterns(["gz,qcow2"]))]
    assert names == ["gz.ours", "gz.ref-pigz", "qcow2.ours", "qcow2.ref-scratch", "qcow2.ref-local"]


def test_throttle_off_drops_the_throttled_rows() -> None:
    chosen = select_routes([], throttled=False)
    assert not any(r.throttled for r in chosen)
    assert "rawslow" not in {row.key for row in rows_for(chosen)}


def test_every_ratio_row_compares_ours_with_a_reference() -> None:
    by_name = {r.name: r for r in ROUTES}
    for row in RATIO_ROWS:
        assert by_name[row.ours].ours != row.floor and not by_name[row.reference].ours
        assert by_name[row.ours].input_name == by_name[row.reference].input_name


def test_reference_commands_fill_every_placeholder(tmp_path: Path) -> None:
    paths = Paths(tmp_path / "disk.img", tmp_path / "scratch")
    for route in (r for r in ROUTES if not r.ours):
        argv = reference_argv(route, "http://127.0.0.1:1/x", paths, tmp_path / "in")
        assert argv[:3] == ["bash", "-o", "pipefail"]
        assert "{" not in argv[-1] and str(paths.out) in argv[-1]


def _run(route: str, seconds: float, *, ok: bool = True, rss: float = 90.0) -> RunResult:
    return RunResult(
        route,
        1,
        ok,
        seconds,
        1.0,
        0.5,
        rss,
        0 if ok else 1,
        "" if ok else "boom",
        allocated=630_710_272,
        verified=ok or None,
    )


def test_report_shows_ratio_target_and_failures() -> None:
    results = [
        _run("gz.ours", 2.0),
        _run("gz.ref-pigz", 5.5),
        _run("gz.ref-pigz", 5.3),
        _run("zst.ours", 1.0, ok=False),
        _run("zst.ref-zstd", 1.3),
    ]
    chosen = select_routes(["gz", "zst"])
    summaries = [report.summarize(r, results) for r in chosen]
    rows = [report.evaluate(row, {s.name: s for s in summaries}) for row in rows_for(chosen)]
    gz, zst = rows
    assert gz.ratio == pytest.approx(5.4 / 2.0) and gz.passed is True
    assert gz.alloc_ratio == pytest.approx(1.0) and gz.peak_rss_mb == 90.0
    assert zst.ratio is None and zst.passed is None and "ours failed: boom" in zst.notes[0]
    text = report.render(rows, summaries, markdown=False)
    assert "2.70" in text and "PASS" in text and ">= 2.5" in text
    md = report.render(rows, summaries, markdown=True)
    assert md.splitlines()[1].startswith("|---|") and "curl\\|pigz" in md


def test_too_much_memory_fails_a_row_that_is_fast_enough() -> None:
    results = [_run("raw.ours", 1.0, rss=400.0), _run("raw.ref-curl", 2.0)]
    chosen = select_routes(["raw"])
    summaries = {s.name: s for s in (report.summarize(r, results) for r in chosen)}
    (row,) = [report.evaluate(r, summaries) for r in rows_for(chosen)]
    assert row.ratio == 2.0 and row.passed is False


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, None),
        ("bytes=0-9", (0, 10)),
        ("bytes=90-", (90, 100)),
        ("bytes=-5", (95, 100)),
        ("bytes=50-1000", (50, 100)),
    ],
)
def test_server_ranges(header: str | None, expected: tuple[int, int] | None) -> None:
    assert parse_range(header, 100) == expected


def test_server_rejects_unsatisfiable_ranges() -> None:
    with pytest.raises(ValueError):
        parse_range("bytes=100-", 100)


async def test_server_serves_ranges_and_throttles(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1024
    (tmp_path / "disk.raw").write_bytes(data)
    async with TestClient(TestServer(make_app(tmp_path, rate=1 << 20))) as client:
        resp = await client.get("/disk.raw", headers={"Range": "bytes=10-19"})
        assert resp.status == 206 and await resp.read() == data[10:20]
        assert resp.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
        head = await client.head("/slow/disk.raw")
        assert head.headers["Content-Length"] == str(len(data))
        assert head.headers["Accept-Ranges"] == "bytes"
        resp = await client.get("/slow/disk.raw")
        assert await resp.read() == data


def test_a_scratch_download_fails_the_qcow2_row() -> None:
    ours = _run("qcow2.ours", 0.5)
    ours.report = {"scratch_used": True, "duration_seconds": 0.4}
    results = [ours, _run("qcow2.ref-scratch", 1.0)]
    chosen = select_routes(["qcow2.ours", "qcow2.ref-scratch"])
    summaries = {s.name: s for s in (report.summarize(r, results) for r in chosen)}
    (row,) = [report.evaluate(r, summaries) for r in rows_for(chosen) if r.key == "qcow2"]
    assert row.ratio == 2.0 and row.passed is False
    assert "ours used scratch: True" in row.notes
    assert summaries["qcow2.ours"].self_reported == 0.4
