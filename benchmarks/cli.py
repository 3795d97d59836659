"""Command line of the benchmark: options, preflight checks and the round-robin loop.

One run builds (or reuses) the inputs, starts the loopback server, then runs every selected
route once per round, interleaved, so that host noise hits ours and the references alike
(perf-baselines 2.3). The first round doubles as the verification pass: each output is checked
against disk.raw by size and sha256 outside the timed region. The tables go to stdout, progress
to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import inputs as inputs_mod
from benchmarks import report
from benchmarks.measure import (
    Paths,
    RunResult,
    ours_argv,
    reference_argv,
    run_route,
)
from benchmarks.routes import ROUTES, Route, inputs_for, rows_for, select_routes, split_patterns
from benchmarks.server import ServerProcess

REPO = Path(__file__).resolve().parent.parent
FULL_SIZE = 2 << 30
QUICK_SIZE = 256 << 20
DATA_FRACTION = 0.28
"""Staged data over virtual size: 600 MB in 2 GiB, like the image of perf-baselines."""

TOOLS = ("curl", "dd", "sync", "pigz", "xz", "zstd", "qemu-img", "mkfs.ext4")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """`2G`, `256M`, `256MiB` or a plain byte count (binary units)."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="benchmarks/run.py",
        description="Time `cdi import` against reference tools, round-robin, and print "
        "reference/ours ratios against the targets of issues 2 and 4.",
    )
    p.add_argument("--rounds", type=int, default=3, help="rounds of every route (default 3)")
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PATTERN",
        help="route globs, comma-separated or repeated; a bare word is a prefix "
        "(`--only gz`); `--only '*.ref-*'` runs the references only",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"small image ({QUICK_SIZE >> 20} MiB virtual) for a fast sanity run",
    )
    p.add_argument(
        "--size",
        type=parse_size,
        default=None,
        help="virtual disk size (default 2G, 256M with --quick)",
    )
    p.add_argument(
        "--data-mb",
        type=float,
        default=None,
        help=f"MB of files staged into the image (default {DATA_FRACTION * 100:.0f}%% of --size)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        default=Path("/var/tmp/cdi-bench"),
        help="input cache and output directory (default /var/tmp/cdi-bench)",
    )
    p.add_argument(
        "--json", type=Path, default=None, metavar="OUT", help="write machine-readable results here"
    )
    p.add_argument("--markdown", action="store_true", help="print markdown tables")
    p.add_argument(
        "--throttle-mbps",
        type=float,
        default=250.0,
        help="per-connection rate of the throttled raw rows, MB/s; 0 skips them",
    )
    p.add_argument(
        "--warm-gib",
        type=float,
        default=None,
        help="GiB of memory touched before each timed run (default 3, 0.5 with "
        "--quick; 0 disables)",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a run is killed")
    p.add_argument(
        "--cdi",
        type=Path,
        default=REPO / ".venv" / "bin" / "cdi",
        help="the cdi executable (default .venv/bin/cdi)",
    )
    p.add_argument(
        "--no-verify",
        action="store_true",
        help="skip the sha256 check of the first round's outputs",
    )
    p.add_argument("--build-only", action="store_true", help="build the inputs and stop")
    p.add_argument("--list", action="store_true", help="list routes and ratio rows and stop")
    return p


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse and fill the defaults that depend on --quick."""
    args = build_parser().parse_args(argv)
    if args.size is None:
        args.size = QUICK_SIZE if args.quick else FULL_SIZE
    if args.data_mb is None:
        args.data_mb = round(args.size * DATA_FRACTION / 1e6)
    if args.warm_gib is None:
        args.warm_gib = 0.5 if args.quick else 3.0
    if args.rounds < 1:
        build_parser().error("--rounds must be at least 1")
    args.only = split_patterns(args.only)
    return args


def _log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def check_ours(cdi: Path) -> str | None:
    """None if `cdi import` can run, else why not (our routes then fail, never get faked)."""
    if not os.access(cdi, os.X_OK):
        return f"{cdi} does not exist (is the `cdi import` CLI installed? pip install -e .)"
    proc = subprocess.run(
        [str(cdi), "import", "--help"], capture_output=True, text=True, timeout=60
    )
    if proc.returncode != 0:
        return f"`{cdi} import --help` exited {proc.returncode}: {proc.stderr.strip()[-300:]}"
    return None


def _tool_versions() -> dict[str, str]:
    out: dict[str, str] = {}
    for tool, flag in (
        ("qemu-img", "--version"),
        ("xz", "--version"),
        ("zstd", "--version"),
        ("pigz", "--version"),
        ("curl", "--version"),
    ):
        try:
            proc = subprocess.run([tool, flag], capture_output=True, text=True, timeout=10)
            out[tool] = (proc.stdout or proc.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            out[tool] = "missing"
    return out


def _unavailable(route: Route, rounds: int, why: str) -> list[RunResult]:
    return [
        RunResult(route.name, n, False, 0.0, 0.0, 0.0, 0.0, 127, f"not run: {why}")
        for n in range(1, rounds + 1)
    ]


def run_rounds(
    args: argparse.Namespace,
    routes: list[Route],
    inputs: inputs_mod.InputSet,
    server: ServerProcess,
    skip: dict[str, str],
) -> list[RunResult]:
    outdir = args.workdir / "out"
    outdir.mkdir(parents=True, exist_ok=True)
    paths = Paths(outdir / "disk.img", outdir / "scratch.img")
    results: list[RunResult] = []
    for name, why in skip.items():
        results += _unavailable(next(r for r in routes if r.name == name), args.rounds, why)
    for n in range(1, args.rounds + 1):
        for route in (r for r in routes if r.name not in skip):
            url = server.url(route.input_name, throttled=route.throttled)
            if route.ours and not route.upload:
                argv = ours_argv(args.cdi, url, paths.out, inputs.virtual_size)
            else:
                argv = reference_argv(route, url, paths, inputs.path(route.input_name))
            res = run_route(
                route,
                argv=argv,
                paths=paths,
                inputs=inputs,
                round_no=n,
                timeout=args.timeout,
                warm_gib=args.warm_gib,
                verify=(n == 1 and not args.no_verify),
            )
            results.append(res)
            status = "ok" if res.ok else f"FAILED: {res.error[:200]}"
            _log(
                f"round {n}/{args.rounds} {route.name:<20} {res.seconds:7.2f} s "
                f"rss {res.maxrss_mb:6.0f} MB (+{res.overhead:.0f} s untimed)  {status}"
            )
    paths.out.unlink(missing_ok=True)
    paths.scratch.unlink(missing_ok=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    routes = select_routes(args.only, throttled=args.throttle_mbps > 0)
    if args.list:
        for r in ROUTES:
            print(f"{r.name:<20} {'*' if r in routes else ' '} {r.description}")
        return 0
    if not routes:
        _log(f"no route matches {args.only}; see --list")
        return 2
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        _log(f"missing tools: {' '.join(missing)}; run `bash scripts/setup.sh --test`")
        return 2
    started = time.monotonic()
    spec = inputs_mod.BuildSpec(args.size, int(args.data_mb * 1e6))
    inputs = inputs_mod.ensure_inputs(spec, args.workdir, inputs_for(routes), _log)
    _log(f"inputs ready in {inputs.directory} ({time.monotonic() - started:.0f} s)")
    if args.build_only:
        return 0
    why = check_ours(args.cdi) if any(r.ours for r in routes) else None
    if why:
        _log(f"our routes will FAIL: {why}")
    skip = {r.name: why for r in routes if r.ours and why}
    rate = int(args.throttle_mbps * 1e6)
    with ServerProcess(inputs.directory, rate) as server:
        _log(f"server on 127.0.0.1:{server.port}; {len(routes)} routes x {args.rounds} rounds")
        results = run_rounds(args, routes, inputs, server, skip)
    summaries = [report.summarize(r, results) for r in routes]
    by_name = {s.name: s for s in summaries}
    rows = [report.evaluate(row, by_name) for row in rows_for(routes)]
    print(report.render(rows, summaries, markdown=args.markdown))
    elapsed = time.monotonic() - started
    _log(f"done in {elapsed:.0f} s")
    if args.json:
        meta = {
            "argv": sys.argv[1:],
            "virtual_size": args.size,
            "rounds": args.rounds,
            "warm_gib": args.warm_gib,
            "throttle_mbps": args.throttle_mbps,
            "elapsed_seconds": elapsed,
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "inputs": inputs.manifest,
            "tools": _tool_versions(),
        }
        args.json.write_text(
            json.dumps(report.to_json(rows, summaries, results, meta), indent=2, default=str) + "\n"
        )
    return 0 if all(r.ok for r in results) else 1
