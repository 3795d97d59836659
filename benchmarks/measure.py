"""Run one route once: prepare the machine, time the command, read its rusage, verify output.

Preparation follows perf-baselines 2.3: drop the previous output and scratch file, `sync`, read
the input into the page cache (the server then sends from RAM), and touch a few GiB of memory
so that page-cache growth during the timed run does not pay the free-page-reporting penalty of
this VM (2.4). The command runs in its own session under GNU time, which reports the peak RSS
of the largest process of the tree; `os.wait4` gives CPU time, and a timer kills the whole group
if it hangs.
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.inputs import CHUNK, InputSet, sha256_file
from benchmarks.routes import Route


@dataclass(frozen=True)
class Paths:
    """Where a run writes: the output image and the reference routes' scratch download."""

    out: Path
    scratch: Path


@dataclass
class RunResult:
    """One timed run of one route."""

    route: str
    round: int
    ok: bool
    seconds: float
    user: float
    sys: float
    maxrss_mb: float
    returncode: int
    error: str = ""
    allocated: int | None = None
    apparent: int | None = None
    verified: bool | None = None
    report: dict[str, object] = field(default_factory=dict)
    overhead: float = 0.0
    """Untimed seconds spent around the run: preparation and verification."""


def warm_memory(gib: float) -> None:
    """Touch `gib` GiB of anonymous memory, then give it back (see perf-baselines 2.4)."""
    n = int(gib * 2**30)
    if n <= 0:
        return
    block = b"\1" * (64 << 20)
    with mmap.mmap(-1, n) as m:
        for off in range(0, n, len(block)):
            m.write(block[: n - off])


def read_into_cache(path: Path) -> None:
    with path.open("rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        while f.readinto(buf):
            pass


def prepare(paths: Paths, input_path: Path, warm_gib: float) -> None:
    paths.out.unlink(missing_ok=True)
    paths.scratch.unlink(missing_ok=True)
    os.sync()
    read_into_cache(input_path)
    warm_memory(warm_gib)


def importer_pod_argv(source: dict[str, str], out: Path, size: str) -> list[str]:
    """``python -m importer`` with the import pod's environment (through env(1), so timed_run
    inherits ours): ``source``'s variables plus the pod's edges writing under ``out``."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        metrics_port = s.getsockname()[1]
    env = {
        **source,
        "IMPORTER_ALLOWED_SOURCE_CIDRS": "127.0.0.1/32",
        "IMPORTER_IMAGE_SIZE": size,
        "IMPORTER_DATA_DIR": str(out),
        "IMPORTER_SCRATCH_DIR": str(out / "scratch"),
        "IMPORTER_TERMINATION_PATH": str(out / "termination"),
        "IMPORTER_METRICS_ADDR": "127.0.0.1",
        "IMPORTER_METRICS_PORT": str(metrics_port),
    }
    return ["env", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m", "importer"]


def ours_argv(cdi: Path, url: str, out: Path, virtual_size: int) -> list[str]:
    """The `cdi import` command line whose contract the lead defined for the benchmark; the
    server is on loopback, allowed explicitly (the CLI's default allows it too)."""
    size = str(virtual_size)
    policy = ["--allow-source-cidr", "127.0.0.0/8"]
    return [str(cdi), "import", url, str(out), "--size", size, *policy, "--quiet", "--json"]


def reference_argv(route: Route, url: str, paths: Paths, input_path: Path) -> list[str]:
    cmd = route.command.format(url=url, out=paths.out, scratch=paths.scratch, input=input_path)
    return ["bash", "-o", "pipefail", "-c", cmd]


def _tail(path: Path, limit: int = 400) -> str:
    try:
        text = path.read_text(errors="replace").strip()
    except OSError:
        return ""
    return text[-limit:]


def fsync_file(path: Path) -> None:
    """Make ``path``'s data durable (a harness's own copy, or a run's output)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


TIME = "/usr/bin/time"
"""GNU time: it execs the command from its own small process and reports %M (KiB)."""


def timed_run(
    argv: list[str], logdir: Path, timeout: float, *, fsync: Path | None = None
) -> tuple[float, int, float, float, float, Path, Path]:
    """Run argv to completion; returns (seconds, rc, user, sys, maxrss_mb, stdout, stderr).

    The peak RSS comes from GNU time rather than from our own wait4: on Linux a child's
    ru_maxrss starts at the high-water mark of the process that forked it, and the harness
    has just touched gigabytes of memory for the warm-up. `fsync`, when given, is fsynced
    inside the timed region: our importer is expected to fsync itself (then this costs
    nothing), and if it does not, its time includes what it skipped.
    """
    stdout, stderr, rss = logdir / "stdout", logdir / "stderr", logdir / "maxrss"
    rss.unlink(missing_ok=True)
    with stdout.open("wb") as so, stderr.open("wb") as se:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [TIME, "-q", "-f", "%M", "-o", str(rss), *argv],
            stdout=so,
            stderr=se,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        timer = threading.Timer(timeout, _kill_group, (proc.pid,))
        timer.start()
        try:
            _, status, ru = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        if fsync is not None and proc.returncode == 0 and fsync.exists():
            fsync_file(fsync)
        seconds = time.perf_counter() - t0
    return (
        seconds,
        proc.returncode,
        ru.ru_utime,
        ru.ru_stime,
        _read_maxrss_mb(rss),
        stdout,
        stderr,
    )


def _read_maxrss_mb(path: Path) -> float:
    try:
        lines = path.read_text().split()
        return int(lines[-1]) * 1024 / 1e6 if lines else 0.0
    except (OSError, ValueError):
        return 0.0


def _parse_report(stdout: Path) -> dict[str, object]:
    lines = [ln for ln in stdout.read_text(errors="replace").splitlines() if ln.strip()]
    if not lines:
        return {}
    try:
        obj = json.loads(lines[-1])
    except ValueError:
        return {}
    return obj if isinstance(obj, dict) else {}


def run_route(
    route: Route,
    *,
    argv: list[str],
    paths: Paths,
    inputs: InputSet,
    round_no: int,
    timeout: float,
    warm_gib: float,
    verify: bool,
) -> RunResult:
    """Prepare, time and (optionally) verify one run of `route`."""
    input_path = inputs.path(route.input_name)
    started = time.monotonic()
    prepare(paths, input_path, warm_gib)
    logdir = paths.out.parent
    seconds, rc, user, sys_, rss, so, se = timed_run(
        argv, logdir, timeout, fsync=paths.out if route.ours else None
    )
    result = RunResult(route.name, round_no, rc == 0, seconds, user, sys_, rss, rc)
    if route.ours or route.upload:
        result.report = _parse_report(so)
        if rc == 0 and not result.report:
            result.ok = False
            result.error = "no JSON object on stdout"
    timed = result.report.get("timed_seconds") if route.upload else None
    if isinstance(timed, int | float):  # an upload: from its first byte (upload.py)
        result.seconds = float(timed)
    if rc != 0:
        killed = rc == -signal.SIGKILL
        result.error = (
            f"timed out after {timeout:.0f} s"
            if killed
            else str(result.report.get("message") or _tail(se) or f"exit {rc}")
        )
    if result.ok and paths.out.exists():
        st = paths.out.stat()
        result.allocated, result.apparent = st.st_blocks * 512, st.st_size
        if verify:
            result.verified = (
                st.st_size == inputs.virtual_size and sha256_file(paths.out) == inputs.raw_sha256
            )
            if not result.verified:
                result.ok = False
                result.error = "output differs from disk.raw (size or sha256)"
    elif result.ok:
        result.ok = False
        result.error = f"{paths.out} was not written"
    result.overhead = time.monotonic() - started - seconds
    return result
