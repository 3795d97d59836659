"""Verified volumes (issue 28): what reading the volume back costs an import.

The OS image of ``benchmarks/run.py`` (the cached inputs: ``disk.qcow2``, 632 MB of the 2 GiB
disk, and ``disk.raw.gz``; built here if missing) is imported by the import pod's entry point
(``python -m importer``) from the loopback HTTP server (``benchmarks/server.py``) into a
``disk.img`` on this machine's disk, once without and once with ``IMPORTER_VERIFY=true`` per
round, alternating. Before every run: the output removed, ``sync``, the input read into the
page cache and memory touched (``--warm-gib``, perf-baselines 2.4). Timed: from the start of
the process to a durable ``disk.img`` (the harness fsyncs it too, free when the importer did);
the importer's own ``duration_seconds`` is shown beside it. Each output is checked against
``disk.raw``'s sha256 outside the timing (first round), and a verified run must report
``Verified``. The row prints the medians and the ratio with / without (target < 1.3).

``--beside`` adds a third run per round that asks whether a read-back overlapping the transfer
could be cheaper: the import without verification while another process reads back a durable
copy of an earlier output (the same 676 MB of data extents) with ``datapath.verify.read_back``
itself, started ``--beside-delay`` seconds after the importer (its start-up, before the
transfer). A separate process takes no GIL from the importer, so this is the best case of any
overlap: it shows what the device and the CPUs give the two at once.

    .venv/bin/python benchmarks/verify.py [--inputs DIR] [--workdir DIR] [--rounds N] [--beside]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import inputs as inputs_mod
from benchmarks.cli import DATA_FRACTION, FULL_SIZE
from benchmarks.measure import (
    fsync_file,
    importer_pod_argv,
    read_into_cache,
    timed_run,
    warm_memory,
)
from benchmarks.registry import sha256_of
from benchmarks.server import ServerProcess

KEYS = ("disk.qcow2", "disk.raw.gz")
TARGET = 1.3


def _inputs(given: str | None, workdir: Path) -> inputs_mod.InputSet | Path:
    if given:
        return Path(given)
    spec = inputs_mod.BuildSpec(FULL_SIZE, int(FULL_SIZE * DATA_FRACTION))
    log = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
    return inputs_mod.ensure_inputs(spec, workdir, KEYS, log)


READER = (
    "import sys, time; from datapath.verify import read_back; time.sleep(float(sys.argv[2])); "
    "t = time.perf_counter(); r = read_back(sys.argv[1], block_device=False); "
    "print(r.bytes_read, round(time.perf_counter() - t, 3))"
)


def start_reader(copy: Path, delay: float) -> subprocess.Popen[str]:
    """Another process reading ``copy`` back from the device, ``delay`` seconds from now."""
    root = Path(__file__).resolve().parent.parent
    argv = [sys.executable, "-c", READER, str(copy), str(delay)]
    return subprocess.Popen(argv, cwd=root, stdout=subprocess.PIPE, text=True)


def run_once(
    key: str,
    verify: bool,
    port: int,
    inputs: Path,
    work: Path,
    size: int,
    warm: float,
    beside: tuple[Path, float] | None = None,
) -> dict[str, object]:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    env = {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": f"http://127.0.0.1:{port}/{key}"}
    if verify:
        env["IMPORTER_VERIFY"] = "true"
    os.sync()
    read_into_cache(inputs / key)
    warm_memory(warm)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    reader = start_reader(*beside) if beside else None
    seconds, rc, user, system, rss, _, stderr = timed_run(
        importer_pod_argv(env, out, str(size)), logs, 600, fsync=out / "disk.img"
    )
    result: dict[str, object] = {
        "key": key,
        "verify": verify,
        "beside": bool(beside),
        "seconds": round(seconds, 3),
        "rc": rc,
        "cpu": round(user + system, 3),
        "rss_mb": rss,
    }
    if reader is not None:
        read, reader_s = (reader.communicate(timeout=600)[0].split() or ["0", "0"])[:2]
        result["beside_read_mb"], result["beside_s"] = int(read) / 1e6, float(reader_s)
        rc = rc or reader.returncode
        result["rc"] = rc
    if rc:
        result["error"] = stderr.read_text()[-400:]
        return result
    message = json.loads((out / "termination").read_text())
    result["self_s"] = message["duration_seconds"]
    check = message.get("verification") or {}
    result["result"] = check.get("result")
    result["blocks"] = check.get("blocks")
    result["bytes_read_back"] = check.get("bytes_read")
    result["output"] = str(out / "disk.img")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--inputs", help="a built input directory (default: the cache)")
    parser.add_argument("--workdir", default="/var/tmp/cdi-bench")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warm-gib", type=float, default=3.0)
    parser.add_argument("--only", choices=KEYS, help="one input instead of both")
    parser.add_argument("--beside", action="store_true", help="also: a read-back beside it")
    parser.add_argument("--beside-delay", type=float, default=0.15)
    args = parser.parse_args()
    built = _inputs(args.inputs, Path(args.workdir))
    inputs = built.directory if isinstance(built, inputs_mod.InputSet) else built
    manifest = json.loads((inputs / "manifest.json").read_text())
    expected, size = manifest["raw_sha256"], (inputs / "disk.raw").stat().st_size
    work = Path(args.workdir) / "verify"
    keys = [args.only] if args.only else list(KEYS)
    results: list[dict[str, object]] = []
    variants = [(False, False), (True, False)] + ([(False, True)] if args.beside else [])
    copies: dict[str, Path] = {}
    with ServerProcess(inputs, 0) as http:
        for round_ in range(args.rounds):
            for key in keys:
                turn = round_ % len(variants)  # the first of a round changes every round
                for verify, beside in variants[turn:] + variants[:turn]:
                    if beside and key not in copies:
                        continue  # no earlier output to read yet: a later round has one
                    copy = (copies[key], args.beside_delay) if beside else None
                    result = run_once(
                        key, verify, http.port, inputs, work, size, args.warm_gib, copy
                    )
                    output = result.pop("output", None)
                    if round_ == 0 and output:
                        result["identical"] = sha256_of(Path(str(output))) == expected
                    if output and args.beside and key not in copies:
                        copies[key] = keep_copy(Path(str(output)), work / f"beside-{key}.img")
                    results.append(result)
                    print(json.dumps(result), flush=True)
    return report(results, keys)


def keep_copy(output: Path, copy: Path) -> Path:
    """A durable sparse copy of an output, for the reader beside a later run."""
    subprocess.run(["cp", "--sparse=always", str(output), str(copy)], check=True)
    fsync_file(copy)
    return copy


def report(results: list[dict[str, object]], keys: list[str]) -> int:
    ok = all(not r["rc"] and r.get("identical", True) for r in results) and all(
        r.get("result") == "Verified" for r in results if r["verify"]
    )
    columns = [
        "input",
        "without s (self)",
        "with s (self)",
        "ratio with / without (< 1.3)",
        "ratio of self s",
        "read back MB",
        "CPU s without / with",
        "RSS MB without / with",
    ]
    print("\n| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for key in keys:
        off, on, beside = (
            [r for r in results if r["key"] == key and not r["rc"] and want(r)]
            for want in (_plain, lambda r: r["verify"], lambda r: r.get("beside"))
        )
        if not off or not on:
            print(f"| {key} | failed | failed | - | - | - | - | - |")
            continue

        ratio = med(on, "seconds") / med(off, "seconds")
        verdict = "ok" if ratio < TARGET else "MISS"
        read = med(on, "bytes_read_back") / 1e6
        own = med(on, "self_s") / med(off, "self_s")
        print(f"| {key} | {med(off, 'seconds'):.2f} ({med(off, 'self_s'):.2f}) "
              f"| {med(on, 'seconds'):.2f} ({med(on, 'self_s'):.2f}) | {ratio:.2f} {verdict} "
              f"| {own:.2f} | {read:.0f} | {med(off, 'cpu'):.2f} / {med(on, 'cpu'):.2f} "
              f"| {med(off, 'rss_mb'):.0f} / {med(on, 'rss_mb'):.0f} |")  # fmt: skip
        if beside:
            print(f"\n{key} without verification, beside a read-back in another process: "
                  f"{med(beside, 'seconds'):.2f} s ({med(beside, 'self_s'):.2f}), "
                  f"{med(beside, 'seconds') / med(off, 'seconds'):.2f}x the import alone; "
                  f"the read-back took {med(beside, 'beside_s'):.2f} s "
                  f"({med(beside, 'beside_read_mb'):.0f} MB)")  # fmt: skip
    return 0 if ok else 1


def _plain(result: dict[str, object]) -> bool:
    return not result["verify"] and not result.get("beside")


def med(rows: list[dict[str, object]], field: str) -> float:
    return statistics.median(float(str(r[field])) for r in rows)


if __name__ == "__main__":
    raise SystemExit(main())
