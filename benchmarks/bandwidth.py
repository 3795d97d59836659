"""Bandwidth cap accuracy (issue 28): how close an import's network rate stays to its cap.

The cached OS image of ``benchmarks/run.py`` (``disk.qcow2``, 677 MB, and ``disk.raw.gz``, 238
MB, of the 2 GiB disk) is imported by the import pod's entry point (``python -m importer``) with
``IMPORTER_BANDWIDTH_LIMIT`` set, from the loopback HTTP server (``benchmarks/server.py``, with
ranges: the parallel range requests share the one cap) and from a real S3 server (versitygw,
``testkit/s3server.py``). Each row prints the cap, the bytes the source read
(``bytes_read`` of the termination message: the bytes on the wire) over the import's own
duration (``duration_seconds``: from the importer's start to a durable ``disk.img``), that
rate's ratio to the cap (target 0.9-1.1) and, for scale, the same import uncapped. Outputs
are verified against ``disk.raw``'s sha256 outside the timing.

    .venv/bin/python benchmarks/bandwidth.py [--inputs DIR] [--workdir DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.measure import importer_pod_argv, read_into_cache, timed_run
from benchmarks.registry import sha256_of
from benchmarks.s3 import setup
from benchmarks.server import ServerProcess
from testkit.s3server import S3Server

MiB = 1024 * 1024
BUCKET = "bench"


@dataclass(frozen=True)
class Row:
    source: str  # "http" or "s3"
    key: str
    cap: int | None  # bytes per second; None: uncapped


ROWS = [
    Row("http", "disk.qcow2", 64 * MiB),
    Row("http", "disk.qcow2", None),
    Row("http", "disk.raw.gz", 16 * MiB),
    Row("http", "disk.raw.gz", None),
    Row("s3", "disk.qcow2", 64 * MiB),
    Row("s3", "disk.qcow2", None),
]


def source_env(row: Row, http_port: int, s3: S3Server, auth: Path) -> dict[str, str]:
    if row.source == "http":
        env = {"IMPORTER_SOURCE": "http",
               "IMPORTER_ENDPOINT": f"http://127.0.0.1:{http_port}/{row.key}"}  # fmt: skip
    else:
        env = {
            "IMPORTER_SOURCE": "s3",
            "IMPORTER_ENDPOINT": s3.url(BUCKET, row.key),
            "IMPORTER_ACCESS_KEY_ID_FILE": str(auth / "accessKeyId"),
            "IMPORTER_SECRET_KEY_FILE": str(auth / "secretKey"),
        }
    if row.cap is not None:
        env["IMPORTER_BANDWIDTH_LIMIT"] = str(row.cap)
    return env


def run_once(
    row: Row, env: dict[str, str], inputs: Path, work: Path, size: int
) -> dict[str, object]:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    read_into_cache(inputs / row.key)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    seconds, rc, *_, stderr = timed_run(
        importer_pod_argv(env, out, str(size)), logs, 1800, fsync=out / "disk.img"
    )
    result: dict[str, object] = {"source": row.source, "key": row.key, "cap": row.cap,
                                 "seconds": seconds, "rc": rc}  # fmt: skip
    if rc:
        result["error"] = stderr.read_text()[-400:]
        return result
    message = json.loads((out / "termination").read_text())
    result["bytes_read"] = message["bytes_read"]
    result["duration"] = message["duration_seconds"]
    result["rate"] = message["bytes_read"] / message["duration_seconds"]
    result["output"] = str(out / "disk.img")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--inputs")
    parser.add_argument("--workdir", default="/var/tmp/cdi-bench/bandwidth")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    bench = setup(args.inputs, Path(args.workdir))
    inputs, expected, size, work, s3 = (
        bench.inputs,
        bench.expected,
        bench.size,
        bench.work,
        bench.server,
    )
    results: list[dict[str, object]] = []
    try:
        s3.put(BUCKET, "disk.qcow2", inputs / "disk.qcow2")
        with ServerProcess(inputs, 0) as http:
            for _ in range(args.rounds):
                for row in ROWS:
                    env = source_env(row, http.port, s3, work / "auth")
                    result = run_once(row, env, inputs, work, size)
                    output = result.pop("output", None)
                    result["verified"] = bool(output) and sha256_of(Path(str(output))) == expected
                    results.append(result)
                    print(json.dumps(result), flush=True)
    finally:
        s3.stop()
    return report(results)


def report(results: list[dict[str, object]]) -> int:
    ok = all(r["verified"] and not r["rc"] for r in results)
    print("\n| source | object | cap MiB/s | read MB | rate MiB/s | rate / cap (0.9-1.1) "
          "| uncapped MiB/s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in ROWS:
        if row.cap is None:
            continue
        mine = [
            r
            for r in results
            if (r["source"], r["key"], r["cap"]) == (row.source, row.key, row.cap)
        ]
        free = [
            r for r in results if (r["source"], r["key"], r["cap"]) == (row.source, row.key, None)
        ]
        rates = [float(str(r["rate"])) for r in mine if "rate" in r]
        if not rates:
            print(f"| {row.source} | {row.key} | {row.cap / MiB:.0f} | - | failed | - | - |")
            continue
        rate = statistics.median(rates)
        ratio = rate / row.cap
        verdict = "ok" if 0.9 <= ratio <= 1.1 else "MISS"
        free_rates = [float(str(r["rate"])) for r in free if "rate" in r]
        uncapped = f"{statistics.median(free_rates) / MiB:.0f}" if free_rates else "-"
        read = int(str(mine[0]["bytes_read"])) / 1e6
        print(f"| {row.source} | {row.key} | {row.cap / MiB:.0f} | {read:.0f} | {rate / MiB:.1f} "
              f"| {ratio:.3f} {verdict} | {uncapped} |")  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
