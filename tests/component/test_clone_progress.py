"""The clone source's progress, as the controller reads it: a real ``python -m cloner`` sends a
32 MiB volume to a loopback mutual-TLS peer that stops reading after 2 MiB, so the transfer
stalls part-way; the controller's own scraper and parser (``cdi.controller.progress``) read the
cloner's metrics endpoint and must see a value strictly between 0 and 100. Released, the peer
reads the rest, which decodes (``datapath.decode.sparseraw``) to the volume byte for byte."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from cdi.api.termination import TerminationMessage
from cdi.controller.progress import HttpScraper, Progress, parse_metrics
from cdi.pki.certs import KeyPair, issue_client, issue_serving, new_ca
from datapath.decode.sparseraw import write_sparse
from datapath.target import RawWriter

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[2]
CN = "golden/os-tenant/mine"


class PacedPeer:
    """One chunked POST read in full, but only ``head`` bytes of body until ``release``."""

    def __init__(self, ctx: ssl.SSLContext, head: int) -> None:
        self.ctx, self.head = ctx, head
        self.release = threading.Event()
        self.body = bytearray()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with self.ctx.wrap_socket(conn, server_side=True) as tls, tls.makefile("rb") as rfile:
            while rfile.readline() not in (b"\r\n", b""):
                pass  # request line and headers
            while size := int(rfile.readline().strip() or b"0", 16):
                if len(self.body) >= self.head:
                    self.release.wait(60)
                self.body += rfile.read(size)
                rfile.readline()
            rfile.readline()
            tls.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")


def certificates(tmp: Path) -> tuple[ssl.SSLContext, dict[str, str]]:
    now = dt.datetime.now(dt.UTC)
    ca: KeyPair = new_ca("clone-progress-ca", now)
    server, client = issue_serving(ca, ("127.0.0.1",), now), issue_client(ca, CN, now)
    for name, data in {"ca.crt": ca.cert_pem, "srv.crt": server.cert_pem,
                       "srv.key": server.key_pem, "cl.crt": client.cert_pem,
                       "cl.key": client.key_pem}.items():  # fmt: skip
        (tmp / name).write_bytes(data)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tmp / "ca.crt"))
    ctx.load_cert_chain(tmp / "srv.crt", tmp / "srv.key")
    ctx.verify_mode = ssl.CERT_REQUIRED
    files = {"CLIENT_CERT_FILE": str(tmp / "cl.crt"), "CLIENT_KEY_FILE": str(tmp / "cl.key"),
             "SERVER_CA_CERT_FILE": str(tmp / "ca.crt")}  # fmt: skip
    return ctx, files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def readings(port: int, want: int) -> list[Progress]:
    """Scrapes until ``want`` readings with bytes done came in (20 s at most)."""
    scraper, seen = HttpScraper(), []
    try:
        for _ in range(200):
            text = await scraper("127.0.0.1", port)
            progress = parse_metrics(text, "t-uid", kind="clone") if text else None
            if progress is not None and progress.bytes_done:
                seen.append(progress)
                if len(seen) >= want:
                    break
            await asyncio.sleep(0.1)
    finally:
        await scraper.close()
    return seen


def decoded(body: bytes, tmp: Path) -> bytes:
    fd = os.open(tmp / "out.img", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        writer = RawWriter(fd, None, zero_fill=False)
        size = write_sparse(iter([body]), writer)
        writer.finish(size, preallocate=False, block=False)
    finally:
        os.close(fd)
    return (tmp / "out.img").read_bytes()


def cloner(env: dict[str, str], tmp: Path) -> Iterator[subprocess.Popen[bytes]]:
    full = {"PATH": os.environ["PATH"], "CLONER_TERMINATION_PATH": str(tmp / "term"), **env}
    proc = subprocess.Popen([sys.executable, "-m", "cloner"], env=full, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_a_stalled_clone_shows_progress_strictly_between_0_and_100(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    volume = os.urandom(32 * MiB)
    (source / "disk.img").write_bytes(volume)
    ctx, files = certificates(tmp_path)
    peer = PacedPeer(ctx, head=2 * MiB)
    metrics = free_port()
    env = {"UPLOAD_URL": f"https://127.0.0.1:{peer.port}/v1beta1/upload",
           "MOUNT_POINT": str(source), "CLONE_STREAM": "raw", "OWNER_UID": "t-uid",
           "CLONER_METRICS_PORT": str(metrics), "CLONER_METRICS_ADDR": "127.0.0.1",
           **files}  # fmt: skip
    for proc in cloner(env, tmp_path):
        stalled = asyncio.run(readings(metrics, want=3))
        assert stalled, "the clone source served no progress"
        assert all(0 < p.percent < 100 for p in stalled), [p.text for p in stalled]
        assert stalled[-1].bytes_total == len(volume)
        peer.release.set()
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    message = TerminationMessage.from_json((tmp_path / "term").read_text())
    assert message.succeeded, message
    assert decoded(bytes(peer.body), tmp_path) == volume
