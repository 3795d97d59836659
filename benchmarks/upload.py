"""One timed upload (or N at once) for the benchmark's upload rows.

``python benchmarks/upload.py INPUT OUT [--via-proxy | --cdi-way] [--concurrent N]`` makes a
throw-away PKI and then, per mode:

- default: a real upload server (``python -m uploader``, DESTINATION=OUT) and an upload of
  INPUT with the client library (``commands.upload.client``) straight to it;
- ``--via-proxy``: the same through a real upload proxy process (``UploadProxy`` with a
  fixed PVC table; its Kubernetes lookups are the only part not exercised);
- ``--via-socat``: the same through ``socat`` (C, OpenSSL) in place of the proxy: TLS in,
  mutual TLS out, bytes relayed 256 KiB at a time, no token check. The cheapest relay this
  machine runs, a floor for what any proxy can reach here (its CPU in ``proxy_cpu_s``);
- ``--cdi-way``: CDI's route for an upload: ``curl -T`` sends INPUT over TLS to a receiver that
  writes the body to a scratch file (OpenSSL does the TLS, the loop is ``recv_into`` +
  ``write``, as thin as a Go server's), then ``qemu-img convert`` (a ``.gz`` input: ``pigz -dc
  | dd conv=sparse``) into OUT, ``sync``.

The timed region is the same in every mode: from the first byte of the upload request to a
durable OUT (``timed_seconds`` in the JSON, which the runner uses as the run's time). Starting
the server, the proxy and the receiver is not in it: the upload pod is ready before a user
uploads. The last stdout line is JSON: the server's termination message (``scratch_used``,
``duration_seconds``), ``timed_seconds``, and the peak RSS (VmHWM, sampled from /proc) of the
server and the proxy, and the CPU seconds each process spent in the timed region
(``client_cpu_s``, ``server_cpu_s``, ``proxy_cpu_s``). With ``--concurrent N``: N servers and
N uploads of INPUT at once (OUT.0 ... OUT.N-1), every server's peak RSS, and with
``--via-proxy`` all N through one proxy process, whose peak RSS is ``proxy_rss_mb`` (issue
12's "10 uploads at once").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a script: the repository root (tests/) importable
    sys.path.insert(0, str(ROOT))

from benchmarks.measure import fsync_file  # noqa: E402
from cdi.upload.token import UploadGrant, issue  # noqa: E402
from commands.upload.client import ClientSettings, upload_file  # noqa: E402
from tests.component.upload_peers import Pki, make_pki  # noqa: E402
from tests.component.upload_proxy_process import process_config  # noqa: E402

DD_SPARSE = "dd of={out} bs=1M iflag=fullblock conv=sparse,fsync status=none"


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


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live (or not yet reaped) process and of its children it has reaped
    (socat's per-connection children), from /proc/PID/stat."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _write_pki(pki: Pki, folder: Path) -> None:
    files = {"tls.crt": pki.server.cert_pem, "tls.key": pki.server.key_pem}
    files |= {"ca.crt": pki.client_ca.cert_pem, "server-ca.crt": pki.server_ca.cert_pem}
    for name, data in files.items():
        (folder / name).write_bytes(data)


async def _listening(port: int) -> None:
    for _ in range(800):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        except OSError:
            await asyncio.sleep(0.025)
    raise RuntimeError(f"nothing listens on {port}")


class Server:
    """A ``python -m uploader`` child writing OUT, sampled for its peak RSS while it runs."""

    def __init__(self, folder: Path, out: Path) -> None:
        self.port = _free_port()
        self.termination = folder / "termination-log"
        self.env = {
            "TLS_CERT_FILE": str(folder / "tls.crt"),
            "TLS_KEY_FILE": str(folder / "tls.key"),
            "CLIENT_CERT_FILE": str(folder / "ca.crt"),
            "DESTINATION": str(out),
            "UPLOAD_SERVER_ADDRESS": "127.0.0.1",
            "UPLOAD_SERVER_PORT": str(self.port),
            "UPLOAD_SCRATCH_DIR": str(folder / "no-scratch-volume"),
            "UPLOAD_TERMINATION_PATH": str(self.termination),
        }
        self.proc: subprocess.Popen[bytes] | None = None
        self.peak = 0.0
        self.cpu = 0.0  # CPU seconds: sampled while it runs, final once it has exited

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uploader"],
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await _listening(self.port)

    async def finish(self) -> dict[str, Any]:
        assert self.proc is not None
        pid = self.proc.pid
        while True:
            self.peak = max(self.peak, _peak_rss_mb(pid))
            # WNOWAIT: an exited child stays a zombie, whose /proc stat still has its CPU time
            exited = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            self.cpu = _cpu_seconds(pid)
            if exited is not None:
                self.proc.wait()
                break
            await asyncio.sleep(0.05)
        report: dict[str, Any] = json.loads(self.termination.read_text())
        return report

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _pvc(name: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "tenant",
            "uid": f"uid-{name}",
            "annotations": {
                "cdi.kubevirt.io/storage.upload.target": "",
                "cdi.kubevirt.io/storage.pod.ready": "true",
            },
        },
        "spec": {},
    }


async def _socat(pki: Pki, folder: Path, server_port: int) -> tuple[subprocess.Popen[str], int]:
    """``socat`` relaying TLS from the client to mutual TLS to the server (the floor)."""
    files = {"proxy.crt": pki.proxy.cert_pem, "proxy.key": pki.proxy.key_pem,
             "client.crt": pki.client.cert_pem, "client.key": pki.client.key_pem}  # fmt: skip
    for name, data in files.items():
        (folder / name).write_bytes(data)
    port = _free_port()
    inbound = (f"OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,verify=0,"
               f"cert={folder / 'proxy.crt'},key={folder / 'proxy.key'}")  # fmt: skip
    outbound = (f"OPENSSL:127.0.0.1:{server_port},verify=1,cafile={folder / 'server-ca.crt'},"
                f"cert={folder / 'client.crt'},key={folder / 'client.key'}")  # fmt: skip
    argv = ["socat", "-b", "262144", inbound, outbound]
    proc = subprocess.Popen(argv, text=True, stderr=subprocess.DEVNULL)  # the probe's EOF
    await _listening(port)
    return proc, port


async def _proxy(
    pki: Pki, folder: Path, server_ports: list[int]
) -> tuple[subprocess.Popen[str], int]:
    """One proxy process for every upload: PVC ``disk<n>`` lives on server ``n``."""
    peers = {f"disk{n}": f"https://127.0.0.1:{port}" for n, port in enumerate(server_ports)}
    config = process_config(pki, [_pvc(name) for name in peers], peers["disk0"], peers)
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


async def ours(
    pki: Pki, folders: list[Path], source: Path, outs: list[Path], relay: str | None
) -> dict[str, Any]:
    """N servers and N uploads at once (one ``relay``, ``proxy`` or ``socat``, for all, or
    none), timed together."""
    servers = [Server(folder, out) for folder, out in zip(folders, outs, strict=True)]
    proxy_proc, proxy_peak = None, 0.0
    try:
        await asyncio.gather(*(server.start() for server in servers))
        urls = [f"https://127.0.0.1:{server.port}" for server in servers]
        ctx = pki.upstream()
        if relay == "proxy":
            proxy_proc, port = await _proxy(pki, folders[0], [s.port for s in servers])
            urls, ctx = [f"https://127.0.0.1:{port}"] * len(servers), pki.client_trusting_proxy()
        elif relay == "socat":
            proxy_proc, port = await _socat(pki, folders[0], servers[0].port)
            urls, ctx = [f"https://127.0.0.1:{port}"], pki.client_trusting_proxy()
        now = dt.datetime.now(dt.UTC)
        tokens = [
            issue(pki.ring, UploadGrant("tenant", f"disk{n}", f"uid-disk{n}"), now)
            for n in range(len(servers))
        ]
        cpu0 = _cpu_split(servers, proxy_proc)
        started = time.perf_counter()
        # each server is sampled (peak RSS) from now until it exits, not only once it has
        finishing = [asyncio.create_task(server.finish()) for server in servers]
        await asyncio.gather(
            *(
                upload_file(str(source), ClientSettings(url, ssl=ctx), token=lambda t=t: t)
                for url, t in zip(urls, tokens, strict=True)
            )
        )
        reports = await asyncio.gather(*finishing)
        await asyncio.gather(*(asyncio.to_thread(fsync_file, out) for out in outs))
        timed = time.perf_counter() - started
        if relay == "socat":  # its per-connection child has ended: reaped, its CPU counted
            await asyncio.sleep(0.3)
        cpu = {k: round(v - cpu0[k], 2) for k, v in _cpu_split(servers, proxy_proc).items()}
        if proxy_proc is not None:  # VmHWM: the high-water mark of the whole run
            proxy_peak = _peak_rss_mb(proxy_proc.pid)
    finally:
        if proxy_proc is not None:
            proxy_proc.terminate()
            proxy_proc.wait()
        for server in servers:
            server.stop()
    return (
        reports[0]
        | cpu
        | {
            "timed_seconds": round(timed, 3),
            "server_rss_mb": round(max(s.peak for s in servers), 1),
            "proxy_rss_mb": round(proxy_peak, 1),
            "all_completed": all(r.get("reason") == "Completed" for r in reports),
            "servers_rss_mb": [round(s.peak, 1) for s in servers],
        }
    )


def _cpu_split(servers: list[Server], proxy: subprocess.Popen[str] | None) -> dict[str, float]:
    """CPU seconds so far of the uploading client (this process), the servers and the proxy;
    the difference over the timed region leaves out start-up (imports, certificates)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    server_cpu = 0.0
    for server in servers:
        running = server.proc is not None and server.proc.returncode is None
        server_cpu += _cpu_seconds(server.proc.pid) if running and server.proc else server.cpu
    return {
        "client_cpu_s": usage.ru_utime + usage.ru_stime,
        "server_cpu_s": server_cpu,
        "proxy_cpu_s": _cpu_seconds(proxy.pid) if proxy is not None else 0.0,
    }


def _sink(listener: socket.socket, ctx: ssl.SSLContext, scratch: Path) -> None:
    """Receive one HTTP upload over TLS and write its body to ``scratch`` (CDI's route)."""
    conn, _ = listener.accept()
    with ctx.wrap_socket(conn, server_side=True) as tls, open(scratch, "wb") as fh:
        head = b""
        while b"\r\n\r\n" not in head:
            head += tls.recv(65536)
        head, _, body = head.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        fh.write(body)
        left, buf = length - len(body), memoryview(bytearray(1 << 20))
        while left > 0:
            n = tls.recv_into(buf, min(left, len(buf)))
            if not n:
                raise ConnectionError("body cut")
            fh.write(buf[:n])
            left -= n
        tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


async def cdi_way(pki: Pki, folder: Path, source: Path, out: Path) -> dict[str, Any]:
    scratch = out.with_name("scratch.img")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(folder / "tls.crt", folder / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    thread = threading.Thread(target=_sink, args=(listener, ctx, scratch), daemon=True)
    thread.start()
    send = (
        f"curl -sSf --cacert {folder / 'server-ca.crt'} -T {source} "
        f"-H 'Content-Type: application/octet-stream' https://127.0.0.1:{port}/v1beta1/upload"
    )
    if source.name.endswith(".gz"):
        convert = f"pigz -dc {scratch} | " + DD_SPARSE.format(out=out)
    else:
        convert = f"qemu-img convert -O raw {scratch} {out} && sync {out}"
    started = time.perf_counter()
    cmd = f"{send} && {convert} && rm -f {scratch}"
    done = await asyncio.to_thread(subprocess.run, ["bash", "-o", "pipefail", "-c", cmd])
    timed = time.perf_counter() - started
    listener.close()
    if done.returncode:
        return {"reason": "Failed", "message": f"exit {done.returncode}"}
    return {"reason": "Completed", "timed_seconds": round(timed, 3), "scratch_used": True}


async def main_async(args: argparse.Namespace) -> int:
    n = args.concurrent
    with tempfile.TemporaryDirectory(prefix="cdi-upload-bench-") as tmp:
        pki = make_pki()
        folders = [Path(tmp) / str(i) for i in range(n)]
        for folder in folders:
            folder.mkdir()
            _write_pki(pki, folder)
        outs = [args.out] if n == 1 else [args.out.with_suffix(f".{i}") for i in range(n)]
        if args.cdi_way:
            reports = await asyncio.gather(
                *(cdi_way(pki, f, args.input, o) for f, o in zip(folders, outs, strict=True))
            )
            report = reports[0] | {
                "all_completed": all(r.get("reason") == "Completed" for r in reports)
            }
        else:
            relay = "proxy" if args.via_proxy else "socat" if args.via_socat else None
            report = await ours(pki, folders, args.input, outs, relay)
    if n > 1:
        report = {"uploads": n} | {k: v for k, v in report.items() if k != "reason"}
        print(json.dumps(report))
        return 0 if report.get("all_completed") else 1
    report.pop("servers_rss_mb", None)
    print(json.dumps(report))
    return 0 if report.get("reason") == "Completed" else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("input", type=Path)
    p.add_argument("out", type=Path)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--via-proxy", action="store_true", help="through a real upload proxy")
    mode.add_argument("--via-socat", action="store_true", help="through socat (a C floor)")
    mode.add_argument("--cdi-way", action="store_true", help="CDI's route: scratch, then convert")
    p.add_argument("--concurrent", type=int, default=1)
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
