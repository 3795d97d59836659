"""The upload proxy's memory under slow clients (security review 3, N3): not timed.

``python benchmarks/proxy_slow_clients.py [--clients 512] [--pad 60000] [--seconds 40]``
starts a real upload proxy process (``tests.component.upload_proxy_process``: ``UploadProxy``
with its default ``ProxyConfig``, a fixed PVC table, our own throw-away PKI) and opens
``--clients`` slow connections from ``--addresses`` loopback addresses (127.0.1.x, enough of
them that the per-address cap does not hide the total): half trickle a TLS ClientHello, half
finish the handshake, send a request head of ``--pad`` bytes at once and then one more byte
a second (``tests/component/slow_clients.py``; a closed connection is opened again). It
samples the proxy's VmRSS and thread count every 0.5 s and asks ``GET /healthz`` from
127.0.0.1 every 5 s. The last stdout line is JSON: idle and peak RSS (MB), peak threads,
and how many health checks were answered. Run it on a checkout to compare code versions (the
numbers for issue 23 are in docs/security.md, N3).
"""

from __future__ import annotations

import argparse
import json
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: the repository root (tests/) importable
    sys.path.insert(0, str(ROOT))

from tests.component.slow_clients import SlowClients  # noqa: E402
from tests.component.upload_peers import make_pki  # noqa: E402
from tests.component.upload_proxy_process import process_config  # noqa: E402


def _status(pid: int) -> dict[str, int]:
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            found[key] = int(value.split()[0])
    return found


def _healthz(port: int, ctx: ssl.SSLContext) -> bool:
    try:
        with urllib.request.urlopen(
            f"https://127.0.0.1:{port}/healthz", timeout=3, context=ctx
        ) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--clients", type=int, default=512)
    p.add_argument("--addresses", type=int, default=32)
    p.add_argument("--pad", type=int, default=60000)
    p.add_argument("--seconds", type=float, default=40.0)
    args = p.parse_args(argv)
    pki = make_pki()
    config = process_config(pki, [], "https://127.0.0.1:9")  # no upload is admitted
    sources = [f"127.0.1.{i}" for i in range(1, args.addresses + 1)]
    ctx = pki.client_trusting_proxy()
    with tempfile.TemporaryDirectory(prefix="cdi-proxy-slow-") as tmp:
        (Path(tmp) / "proxy.json").write_text(json.dumps(config))
        argv_ = [sys.executable, "-m", "tests.component.upload_proxy_process", f"{tmp}/proxy.json"]
        proc = subprocess.Popen(argv_, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        try:
            time.sleep(1)
            idle = _status(proc.pid)
            peak, checks, answered = dict(idle), 0, 0
            half = args.clients // 2
            with (
                SlowClients(port, sources, half, kind="handshake", interval=1.0),
                SlowClients(
                    port,
                    sources,
                    args.clients - half,
                    kind="head",
                    tls=ctx,
                    interval=1.0,
                    pad=args.pad,
                ),  # fmt: skip
            ):
                started = last_check = time.monotonic()
                while time.monotonic() - started < args.seconds:
                    now = _status(proc.pid)
                    peak = {k: max(v, peak[k]) for k, v in now.items()}
                    if time.monotonic() - last_check >= 5:
                        checks, answered = checks + 1, answered + _healthz(port, ctx)
                        last_check = time.monotonic()
                    time.sleep(0.5)
        finally:
            proc.terminate()
            proc.wait(30)
    report = {
        "clients": args.clients,
        "pad_bytes": args.pad,
        "rss_idle_mb": round(idle["VmRSS"] / 1024, 1),
        "rss_peak_mb": round(peak["VmRSS"] / 1024, 1),
        "threads_peak": peak["Threads"],
        "healthz_answered": f"{answered}/{checks}",
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
