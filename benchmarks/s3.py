"""S3 import benchmark (issue 27): our signed, streamed S3 import against what a user would do.

The OS image of ``benchmarks/run.py`` (the cached inputs: ``disk.qcow2`` and ``disk.raw.gz`` of
the 2 GiB disk, ~600 MB of files) is put on a real S3 server on loopback (versitygw,
``testkit/s3server.py``, built by ``hack/s3/build.sh``), and imported each way:

- ``ours``: the import pod's entry point (``python -m importer``, ``IMPORTER_SOURCE=s3``, the
  key pair as mounted Secret files) signs, reads, decompresses and decodes in one pass into
  ``disk.img``; no scratch.
- qcow2 reference: ``rclone copyto`` the object to scratch, ``qemu-img convert -O raw``, ``sync``
  (target >= 1.5, and ours must use zero scratch bytes).
- raw.gz reference: ``rclone cat | pigz -dc | dd conv=sparse,fsync`` (target >= 2.0).

rclone reads the same server with the same keys (``RCLONE_CONFIG_S3_*`` in its environment).
One run each by default (``--rounds`` for more), page cache warmed with the objects first,
output verified against ``disk.raw``'s sha256 outside the timed region; ratios (reference time
/ ours), our peak RSS and scratch bytes are printed.

    .venv/bin/python benchmarks/s3.py [--inputs DIR] [--workdir DIR] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.measure import importer_pod_argv, read_into_cache, timed_run, warm_memory
from benchmarks.registry import _inputs, sha256_of
from testkit.s3server import S3Server

BUCKET = "bench"
DD = "dd of={out} bs=1M iflag=fullblock conv=sparse,fsync status=none"
REFERENCES = {
    "disk.qcow2": (
        "rclone copyto s3:{bucket}/{key} {scratch} && qemu-img convert -O raw {scratch} {out}"
        " && sync {out} && rm -f {scratch}",
        1.5,
    ),
    "disk.raw.gz": ("rclone cat s3:{bucket}/{key} | pigz -dc | " + DD, 2.0),
}


def ours_argv(server: S3Server, key: str, out: Path, auth: Path, size: int) -> list[str]:
    """The import pod's command: ``source.s3`` with the key pair as mounted Secret files."""
    source = {
        "IMPORTER_SOURCE": "s3",
        "IMPORTER_ENDPOINT": server.url(BUCKET, key),
        "IMPORTER_ACCESS_KEY_ID_FILE": str(auth / "accessKeyId"),
        "IMPORTER_SECRET_KEY_FILE": str(auth / "secretKey"),
    }
    return importer_pod_argv(source, out, str(size))


def rclone_env(server: S3Server) -> dict[str, str]:
    return {
        "RCLONE_CONFIG_S3_TYPE": "s3",
        "RCLONE_CONFIG_S3_PROVIDER": "Other",
        "RCLONE_CONFIG_S3_ENDPOINT": server.endpoint,
        "RCLONE_CONFIG_S3_ACCESS_KEY_ID": server.access_key,
        "RCLONE_CONFIG_S3_SECRET_ACCESS_KEY": server.secret_key,
        "RCLONE_CONFIG_S3_REGION": "us-east-1",
    }


def run_once(route: str, key: str, server: S3Server, work: Path, size: int) -> dict[str, object]:
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    os.sync()
    read_into_cache(server.data / BUCKET / key)
    warm_memory(3.0)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    if route == "ours":
        argv = ours_argv(server, key, out, work / "auth", size)
        result = timed_run(argv, logs, 1800, fsync=out / "disk.img")
    else:
        template = REFERENCES[key][0]
        cmd = template.format(bucket=BUCKET, key=key, scratch=out / "scratch", out=out / "disk.img")
        env = " ".join(f"{k}={v}" for k, v in rclone_env(server).items())
        # AWS_CA_BUNDLE (a machine-wide setting for https) breaks rclone's plain-http client
        script = f"set -eo pipefail; unset AWS_CA_BUNDLE; export {env}; {cmd}"
        result = timed_run(["bash", "-c", script], logs, 1800)
    seconds, rc, _, _, rss, _, stderr = result
    row: dict[str, object] = {"route": route, "key": key, "seconds": seconds, "rc": rc}
    row["rss_mb"] = rss
    if rc:
        row["error"] = stderr.read_text()[-400:]
    if route == "ours" and (out / "termination").exists():
        row["scratch_bytes"] = json.loads((out / "termination").read_text()).get("scratch_bytes")
    row["output"] = out / "disk.img"
    return row


@dataclass(frozen=True)
class Bench:
    """What an S3 benchmark run starts from: the cached inputs (``disk.raw``'s sha256 and
    size), a fresh work directory, a started S3 server and its key pair as mounted Secret
    files under ``work/auth`` (``ours_argv``'s ``auth``)."""

    inputs: Path
    expected: str
    size: int
    work: Path
    server: S3Server


def setup(inputs_arg: str | None, work: Path) -> Bench:
    """The shared start of ``benchmarks/s3.py`` and ``benchmarks/bandwidth.py``."""
    inputs = _inputs(inputs_arg)
    manifest = json.loads((inputs / "manifest.json").read_text())
    expected, size = manifest["raw_sha256"], (inputs / "disk.raw").stat().st_size
    shutil.rmtree(work, ignore_errors=True)
    (work / "auth").mkdir(parents=True)
    server = S3Server(work / "gw").start()
    (work / "auth" / "accessKeyId").write_text(server.access_key)
    (work / "auth" / "secretKey").write_text(server.secret_key)
    return Bench(inputs, expected, size, work, server)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--inputs")
    parser.add_argument("--workdir", default="/var/tmp/cdi-bench/s3")
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    bench = setup(args.inputs, Path(args.workdir))
    inputs, expected, size, work, server = (
        bench.inputs,
        bench.expected,
        bench.size,
        bench.work,
        bench.server,
    )
    rows = []
    try:
        for key in REFERENCES:
            server.put(BUCKET, key, inputs / key)
        for _ in range(args.rounds):
            for key in REFERENCES:
                for route in ("ours", "reference"):
                    row = run_once(route, key, server, work, size)
                    output = Path(str(row.pop("output")))
                    row["verified"] = output.exists() and sha256_of(output) == expected
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        server.stop()
    return report(rows)


def report(rows: list[dict[str, object]]) -> int:
    ok = all(r["verified"] and not r["rc"] for r in rows)
    print("\n| object | ours s | reference s | ratio (target) | our peak RSS MB | our scratch |")
    print("|---|---|---|---|---|---|")
    for key, (_, target) in REFERENCES.items():
        ours = [r for r in rows if r["key"] == key and r["route"] == "ours"]
        ref = [r for r in rows if r["key"] == key and r["route"] == "reference"]
        t_ours = statistics.median(float(str(r["seconds"])) for r in ours)
        t_ref = statistics.median(float(str(r["seconds"])) for r in ref)
        scratch = max(int(str(r.get("scratch_bytes") or 0)) for r in ours)
        rss = max(float(str(r["rss_mb"])) for r in ours)
        ratio = t_ref / t_ours
        verdict = "ok" if ratio >= target and scratch == 0 else "FAIL"
        cells = [key, f"{t_ours:.2f}", f"{t_ref:.2f}", f"{ratio:.2f} (>= {target}) {verdict}"]
        print("| " + " | ".join([*cells, f"{rss:.0f}", str(scratch)]) + " |")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
