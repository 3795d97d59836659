"""One timed upload (or N at once) for the benchmark's upload rows.

``python benchmarks/upload.py INPUT OUT [--size BYTES] [--via-proxy] [--concurrent N]`` makes a
throw-away PKI, starts a real upload server (``python -m uploader``, DESTINATION=OUT) and
uploads INPUT with the client library (``cdi.upload.client``), straight to the server or
through a real upload proxy process (``make_proxy_app`` with a fixed PVC table: the proxy's
Kubernetes lookups are the only thing not exercised). It waits for the server to exit and
prints the server's termination message as the last line of JSON (the runner reads
``duration_seconds`` and ``scratch_used`` from it), plus ``server_rss_mb`` (VmHWM of each
server, sampled from /proc while it runs) and ``proxy_rss_mb``.

With ``--concurrent N`` it runs N servers and N uploads of INPUT at once (OUT.0 ... OUT.N-1)
and reports every server's peak RSS: the "10 uploads at once" check of issue 12.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: the repository root (tests/) importable
    sys.path.insert(0, str(ROOT))

from cdi.upload.client import ClientSettings, upload_file  # noqa: E402
from cdi.upload.token import UploadGrant, issue  # noqa: E402
from tests.component.test_upload_proxy import pvc  # noqa: E402
from tests.component.upload_peers import Pki, make_pki  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return 0.0


class Server:
    def __init__(self, pki: Pki, folder: Path, out: Path, size: int | None) -> None:
        self.port = _free_port()
        self.termination = folder / f"termination-{self.port}"
        files = {"tls.crt": pki.server.cert_pem, "tls.key": pki.server.key_pem}
        files["ca.crt"] = pki.client_ca.cert_pem
        for name, data in files.items():
            (folder / name).write_bytes(data)
        self.env = {
            "TLS_CERT_FILE": str(folder / "tls.crt"),
            "TLS_KEY_FILE": str(folder / "tls.key"),
            "CLIENT_CERT_FILE": str(folder / "ca.crt"),
            "DESTINATION": str(out),
            "UPLOAD_IMAGE_SIZE": str(size or ""),  # none: the image's own size
            "UPLOAD_SERVER_ADDRESS": "127.0.0.1",
            "UPLOAD_SERVER_PORT": str(self.port),
            "UPLOAD_SCRATCH_DIR": str(folder / "no-scratch-volume"),
            "UPLOAD_TERMINATION_PATH": str(self.termination),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak = 0.0

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uploader"],
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(400):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                return
            except OSError:
                await asyncio.sleep(0.025)
        raise RuntimeError("the upload server did not start")

    async def finish(self) -> dict[str, Any]:
        assert self.proc is not None
        while self.proc.poll() is None:
            self.peak = max(self.peak, _peak_rss_mb(self.proc.pid))
            await asyncio.sleep(0.05)
        report: dict[str, Any] = json.loads(self.termination.read_text())
        return report


async def _proxy(pki: Pki, folder: Path, server_port: int) -> tuple[subprocess.Popen[str], int]:
    config = {
        "proxy_cert": pki.proxy.cert_pem.decode(),
        "proxy_key": pki.proxy.key_pem.decode(),
        "server_ca": pki.server_ca.cert_pem.decode(),
        "client_cert": pki.client.cert_pem.decode(),
        "client_key": pki.client.key_pem.decode(),
        "public_keys": {k: v.decode() for k, v in pki.ring.public_keys().items()},
        "pvcs": [pvc("disk")],
        "peer": f"https://127.0.0.1:{server_port}",
    }
    (folder / "proxy.json").write_text(json.dumps(config))
    argv = [
        sys.executable,
        "-m",
        "tests.component.upload_proxy_process",
        str(folder / "proxy.json"),
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout is not None
    line = await asyncio.to_thread(proc.stdout.readline)
    return proc, int(line)


async def one(
    pki: Pki, folder: Path, source: Path, out: Path, size: int, proxy: bool
) -> dict[str, Any]:
    server = Server(pki, folder, out, size)
    await server.start()
    ctx = pki.client_trusting_proxy() if proxy else pki.upstream()
    proxy_proc, proxy_peak = None, 0.0
    url = f"https://127.0.0.1:{server.port}"
    if proxy:
        proxy_proc, port = await _proxy(pki, folder, server.port)
        url = f"https://127.0.0.1:{port}"
    try:
        token = issue(pki.ring, UploadGrant("tenant", "disk", "uid-disk"), dt.datetime.now(dt.UTC))
        await upload_file(str(source), ClientSettings(url, ssl=ctx), token=lambda: token)
        report = await server.finish()
        if proxy_proc is not None:
            proxy_peak = _peak_rss_mb(proxy_proc.pid)
    finally:
        if proxy_proc is not None:
            proxy_proc.terminate()
            proxy_proc.wait()
        if server.proc is not None and server.proc.poll() is None:
            server.proc.kill()
    return report | {"server_rss_mb": round(server.peak, 1), "proxy_rss_mb": round(proxy_peak, 1)}


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="cdi-upload-bench-") as tmp:
        pki = make_pki()
        jobs = []
        for n in range(args.concurrent):
            folder = Path(tmp) / str(n)
            folder.mkdir()
            out = args.out if args.concurrent == 1 else args.out.with_suffix(f".{n}")
            jobs.append(one(pki, folder, args.input, out, args.size, args.via_proxy))
        reports = await asyncio.gather(*jobs)
    if args.concurrent > 1:
        rss = [r["server_rss_mb"] for r in reports]
        ok = all(r.get("reason") == "Completed" for r in reports)
        print(json.dumps({"uploads": len(reports), "all_completed": ok, "server_rss_mb": rss}))
        return 0 if ok else 1
    print(json.dumps(reports[0]))
    return 0 if reports[0].get("reason") == "Completed" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("input", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--size", type=int, help="the volume's bytes (default: the image's size)")
    p.add_argument("--via-proxy", action="store_true")
    p.add_argument("--concurrent", type=int, default=1)
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
