"""Host-assisted clone's data path against the copy a user would make by hand, one run each.

Routes, on the benchmark's 2 GiB OS image (``disk.raw`` of ``benchmarks/run.py``'s input cache,
601 MB of files in ext4, the rest holes):

- ``fs.ref-cp``: ``cp --sparse=always src/disk.img out/disk.img`` then ``sync``;
- ``fs.ours``: ``python -m cloner`` (filesystem source) -> mutual TLS on loopback -> the
  receiver: ``--receiver uploader`` (default) the upload server itself (``python -m uploader``,
  as the target pod runs it), ``--receiver stand-in`` ``benchmarks.clone_receiver`` (the data
  path behind a bare aiohttp route), ``--receiver threaded-stand-in`` the same data path fed
  from a thread reading a blocking TLS socket (no asyncio in the byte path); each writes
  ``out/disk.img`` through the data path;
- ``fs.ref-tar-socat``: the same route in C tools (``benchmarks.clone_tools``): GNU ``tar -S``
  | ``socat`` (OpenSSL, mutual TLS) -> ``socat`` | ``tar -x``, then ``sync``, as CDI's clone
  does it: what the TLS hop and two processes cost on this machine without any Python;
- ``block.ref-dd``: ``dd if=<src loop> of=<dst loop> bs=1M conv=sparse,fsync``;
- ``block.ours``: the cloner reading the source loop device -> the receiver writing the target
  loop device.

Printed: ``seconds`` (ours: from starting the receiver to both processes exited, so the
receiver's start-up is in) and the ratio reference/seconds; ``transfer s`` (ours: from the
receiver listening to both processes exited: in the cluster the target's upload server runs
before the source pod starts) and the ratio reference/transfer (>= 0.8 wanted); allocated
bytes of the output against the source's (<= 1.01 wanted), the peak RSS of the clone source
and of the receiver (< 150 MB each wanted) and their CPU seconds. Outputs are checked byte for
byte (outside the timing). Needs root (loop devices). ``--code DIR`` runs the cloner and the
receiver from another checkout (with its ``.venv`` if it has one; ``python -m`` finds the
checkout's modules first either way), e.g. main's, for before/after runs; ``--only fs|block``.
``.venv/bin/python -m benchmarks.clone [--image PATH] [--workdir DIR] [--receiver KIND]
[--code DIR]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.clone_tools import tar_socat
from benchmarks.inputs import sha256_file
from cdi.pki.certs import issue_client, issue_serving, new_ca

REPO = Path(__file__).resolve().parents[1]
DEFAULT_IMAGE = Path("/var/tmp/cdi-bench/inputs-2147483648-601MB-v1/disk.raw")
CLIENT_NAME = "golden/os-tenant/os"


@dataclass(frozen=True)
class Run:
    route: str
    seconds: float
    allocated: int
    rss_mb: tuple[float, ...]
    cpu: tuple[float, ...] = ()  # user+sys seconds of each process
    transfer: float | None = None  # ours: from the receiver listening to both exited


_HASHES: dict[Path, str] = {}


def image_hash(image: Path) -> str:
    if image not in _HASHES:
        _HASHES[image] = sha256_file(image)
    return _HASHES[image]


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def timed(argv: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one child."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(
            f"{argv[:3]} failed: {proc.stderr.read().decode()[-400:] if proc.stderr else ''}"
        )
    return time.monotonic() - t0, usage.ru_maxrss / 1024


def certificates(work: Path) -> dict[str, str]:
    now = dt.datetime.now(dt.UTC)
    ca = new_ca("clone-bench-ca", now)
    server = issue_serving(ca, ("localhost", "127.0.0.1"), now)
    client = issue_client(ca, CLIENT_NAME, now)
    files = {"ca": ca.cert_pem, "srv.crt": server.cert_pem, "srv.key": server.key_pem,
             "cl.crt": client.cert_pem, "cl.key": client.key_pem}  # fmt: skip
    for name, data in files.items():
        (work / name).write_bytes(data)
    return {name: str(work / name) for name in files}


@dataclass(frozen=True)
class Setup:
    work: Path
    certs: dict[str, str]
    receiver: str  # "uploader", "stand-in" or "threaded-stand-in"
    code: Path = REPO  # the checkout the cloner and the receiver run from
    python: str = sys.executable


def stand_in(setup: Setup, target: str, block: bool, threaded: bool) -> tuple[Any, int]:
    work, certs = setup.work, setup.certs
    port_file = work / "port"
    port_file.unlink(missing_ok=True)
    receiver = [setup.python, "-m", "benchmarks.clone_receiver", "--target", target,
                "--cert", certs["srv.crt"], "--key", certs["srv.key"], "--client-ca", certs["ca"],
                "--client-name", CLIENT_NAME, "--port-file", str(port_file)]  # fmt: skip
    flags = (["--block"] if block else []) + (["--threaded"] if threaded else [])
    proc = subprocess.Popen(receiver + flags, cwd=setup.code,
                            stdout=subprocess.DEVNULL)  # fmt: skip
    while not port_file.exists() or not port_file.read_text():
        time.sleep(0.01)
    return proc, int(port_file.read_text())


def upload_server(setup: Setup, target: str) -> tuple[Any, int]:
    """``python -m uploader`` with the target pod's environment, on a free loopback port."""
    work, certs = setup.work, setup.certs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PATH": os.environ["PATH"], "TLS_CERT_FILE": certs["srv.crt"],
           "TLS_KEY_FILE": certs["srv.key"], "CLIENT_CERT_FILE": certs["ca"],
           "CLIENT_NAME": CLIENT_NAME, "DESTINATION": target,
           "UPLOAD_SERVER_ADDRESS": "127.0.0.1", "UPLOAD_SERVER_PORT": str(port),
           "UPLOAD_SCRATCH_DIR": str(work / "scratch"),
           "UPLOAD_TERMINATION_PATH": str(work / "server-termination")}  # fmt: skip
    proc = subprocess.Popen([setup.python, "-m", "uploader"], env=env, cwd=setup.code,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError("the upload server exited before it listened") from None
            time.sleep(0.02)


def ours(route: str, setup: Setup, source: str, target: str, block: bool) -> Run:
    work, certs = setup.work, setup.certs
    t0 = time.monotonic()
    if setup.receiver == "uploader":
        proc, port = upload_server(setup, target)
    else:
        threaded = setup.receiver == "threaded-stand-in"
        proc, port = stand_in(setup, target, block, threaded)
    listening = time.monotonic()
    env = {**os.environ, "UPLOAD_URL": f"https://127.0.0.1:{port}/v1beta1/upload",
           "CLIENT_CERT_FILE": certs["cl.crt"], "CLIENT_KEY_FILE": certs["cl.key"],
           "SERVER_CA_CERT_FILE": certs["ca"], "MOUNT_POINT": source,
           "VOLUME_MODE": "block" if block else "filesystem",
           "CLONER_TERMINATION_PATH": str(work / "termination")}  # fmt: skip
    cloner = subprocess.Popen([setup.python, "-m", "cloner"], env=env, cwd=setup.code,
                              stdout=subprocess.DEVNULL)  # fmt: skip
    _, cstatus, cusage = os.wait4(cloner.pid, 0)
    _, rstatus, rusage = os.wait4(proc.pid, 0)
    end = time.monotonic()
    if os.waitstatus_to_exitcode(cstatus) or os.waitstatus_to_exitcode(rstatus):
        raise RuntimeError(f"{route}: {(work / 'termination').read_text()}")
    rss = (cusage.ru_maxrss / 1024, rusage.ru_maxrss / 1024)
    cpu = (cusage.ru_utime + cusage.ru_stime, rusage.ru_utime + rusage.ru_stime)
    return Run(route, end - t0, 0, rss, cpu, end - listening)


@contextmanager
def loop(backing: Path, size: int) -> Iterator[str]:
    with open(backing, "wb") as fh:
        fh.truncate(size)
    dev = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


def filesystem_routes(image: Path, setup: Setup) -> list[Run]:
    work = setup.work
    src = work / "src"
    src.mkdir(exist_ok=True)
    (src / "disk.img").unlink(missing_ok=True)
    os.link(image, src / "disk.img")
    out = work / "out"
    out.mkdir(exist_ok=True)
    target = out / "disk.img"
    runs = []
    for route in ("fs.ref-cp", "fs.ours", "fs.ref-tar-socat"):
        target.unlink(missing_ok=True)
        subprocess.run(["sync"], check=True)
        if route == "fs.ref-tar-socat":  # CDI's route in C tools: what TLS + 2 processes cost
            seconds, *cpu = tar_socat(src, out, setup.certs)
            run = Run(route, seconds, 0, (), tuple(cpu), transfer=seconds)
        elif route == "fs.ref-cp":
            seconds, rss = timed(
                ["sh", "-c", f"cp --sparse=always {src}/disk.img {target} && sync {target}"]
            )
            run = Run(route, seconds, 0, (rss,))
        else:
            run = ours(route, setup, str(src), str(target), block=False)
        assert sha256_file(target) == image_hash(image), f"{route}: output differs"
        runs.append(replace(run, allocated=allocated(target)))
    return runs


def block_routes(image: Path, setup: Setup) -> list[Run]:
    work = setup.work
    size = image.stat().st_size
    runs = []
    with loop(work / "src.blk", size) as src:
        subprocess.run(["dd", f"if={image}", f"of={src}", "bs=1M", "conv=sparse,fsync",
                        "status=none"], check=True)  # fmt: skip
        for route in ("block.ref-dd", "block.ours"):
            backing = work / "dst.blk"
            backing.unlink(missing_ok=True)
            with loop(backing, size) as dst:
                subprocess.run(["sync"], check=True)
                if route == "block.ref-dd":
                    seconds, rss = timed(["dd", f"if={src}", f"of={dst}", "bs=1M",
                                          "conv=sparse,fsync", "status=none"])  # fmt: skip
                    run = Run(route, seconds, 0, (rss,))
                else:
                    run = ours(route, setup, src, dst, block=True)
                assert sha256_file(Path(dst)) == image_hash(image), f"{route}: output differs"
            runs.append(replace(run, allocated=allocated(backing)))
    return runs


def report(runs: list[Run], source_allocated: int) -> str:
    """One row per route; ours also against the reference in transfer time (receiver up)."""
    by = {r.route: r for r in runs}
    lines = ["| route | seconds | ratio ref/seconds | transfer s | ratio ref/transfer | "
             "allocated / source | peak RSS MB | CPU s |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in runs:
        kind = r.route.split(".")[0]
        ref = next(v for k, v in by.items() if k.startswith(f"{kind}.ref"))
        compared = r.route.endswith("ours") or r.route.endswith("tar-socat")
        ratio = f"{ref.seconds / r.seconds:.2f}" if compared else "-"
        transfer = f"{r.transfer:.2f}" if r.transfer is not None else "-"
        t_ratio = f"{ref.seconds / r.transfer:.2f}" if r.transfer else "-"
        rss = " / ".join(f"{m:.0f}" for m in r.rss_mb) or "-"
        cpu = " / ".join(f"{c:.2f}" for c in r.cpu) or "-"
        lines.append(f"| {r.route} | {r.seconds:.2f} | {ratio} | {transfer} | {t_ratio} | "
                     f"{r.allocated / source_allocated:.3f} | {rss} | {cpu} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--image", type=Path, default=DEFAULT_IMAGE)
    p.add_argument("--workdir", type=Path, default=Path("/var/tmp/cdi-bench/clone"))
    p.add_argument(
        "--receiver", choices=("uploader", "stand-in", "threaded-stand-in"), default="uploader"
    )
    p.add_argument("--code", type=Path, default=REPO, help="run the workers from this checkout")
    p.add_argument("--only", choices=("fs", "block"), help="one kind of route")
    a = p.parse_args(argv)
    a.workdir.mkdir(parents=True, exist_ok=True)
    certs = certificates(a.workdir)
    own = a.code / ".venv" / "bin" / "python"  # else ours: the checkout's modules come first
    python = str(own) if a.code != REPO and own.exists() else sys.executable
    setup = Setup(a.workdir, certs, a.receiver, a.code, python)
    runs = [] if a.only == "block" else filesystem_routes(a.image, setup)
    runs += [] if a.only == "fs" else block_routes(a.image, setup)
    print(report(runs, allocated(a.image)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
