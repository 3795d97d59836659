"""What the upload server's component tests share: a PKI made by our own certs code (files, as
the pod mounts them), the server run in-process or as a real ``python -m uploader`` child, a
client TLS context, and a TCP relay that cuts a connection after a number of bytes (a real
network cut between the client library and the server, not a mocked one)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from cdi.pki.certs import KeyPair, issue_client, issue_serving, new_ca
from commands.upload.client import ClientSettings
from uploader.__main__ import serve
from uploader.config import UploadConfig, from_env
from uploader.server import make_app, serving_context
from uploader.session import Uploads

CLIENT_NAME = "client.upload-server.cdi.kubevirt.io"
NOW = dt.datetime.now(dt.UTC)
MiB = 1024 * 1024


@dataclass(frozen=True)
class Pki:
    folder: Path
    server_ca: KeyPair
    client: KeyPair
    stranger: KeyPair  # signed by the right CA, wrong CN

    def env(self) -> dict[str, str]:
        return {
            "TLS_CERT_FILE": str(self.folder / "tls.crt"),
            "TLS_KEY_FILE": str(self.folder / "tls.key"),
            "CLIENT_CERT_FILE": str(self.folder / "ca.crt"),
            "CLIENT_NAME": CLIENT_NAME,
        }

    def client_context(self, pair: KeyPair | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cadata=self.server_ca.cert_pem.decode())
        pair = pair or self.client
        cert, key = self.folder / "c.crt", self.folder / "c.key"
        cert.write_bytes(pair.cert_pem)
        key.write_bytes(pair.key_pem)
        ctx.load_cert_chain(cert, key)
        cert.unlink()
        key.unlink()
        return ctx


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    server_ca, client_ca = new_ca("test-uploadserver-ca", NOW), new_ca("test-client-ca", NOW)
    serving = issue_serving(server_ca, ("127.0.0.1",), NOW)
    (folder / "tls.crt").write_bytes(serving.cert_pem)
    (folder / "tls.key").write_bytes(serving.key_pem)
    (folder / "ca.crt").write_bytes(client_ca.cert_pem)
    return Pki(
        folder,
        server_ca,
        issue_client(client_ca, CLIENT_NAME, NOW),
        issue_client(client_ca, "someone-else", NOW),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_env(
    pki: Pki, destination: Path | str, size: str, port: int, **extra: str
) -> dict[str, str]:
    env = {
        **pki.env(),
        "DESTINATION": str(destination),
        "UPLOAD_IMAGE_SIZE": size,
        "UPLOAD_SERVER_ADDRESS": "127.0.0.1",
        "UPLOAD_SERVER_PORT": str(port),
        "UPLOAD_SCRATCH_DIR": str(Path(destination).parent / "no-scratch-volume"),
        "UPLOAD_TERMINATION_PATH": str(pki.folder / "termination-log"),
        "UPLOAD_CHECKPOINT_INTERVAL": str(MiB),
        "UPLOAD_IDLE_TIMEOUT": "30",
    }
    return env | extra


@dataclass
class Running:
    url: str
    config: UploadConfig
    task: asyncio.Task  # type: ignore[type-arg]
    termination: Path

    def settings(self, pki: Pki, **kw: object) -> ClientSettings:
        kw.setdefault("backoff_initial", 0.05)
        return ClientSettings(self.url, ssl=pki.client_context(), **kw)  # type: ignore[arg-type]


@contextlib.asynccontextmanager
async def running_server(env: dict[str, str]) -> AsyncIterator[Running]:
    """``uploader.__main__.serve`` in this process, on the env's port; waits until it listens."""
    config = from_env(env)
    task = asyncio.ensure_future(serve(config))
    url = f"https://127.0.0.1:{config.port}"
    await _wait_listening(config.port, task)
    try:
        yield Running(url, config, task, Path(env["UPLOAD_TERMINATION_PATH"]))
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


async def _wait_listening(port: int, task: asyncio.Future[object] | None = None) -> None:
    for _ in range(300):
        if task is not None and task.done():
            task.result()  # it ended already (e.g. a deadline in the past), or failed
            return
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the upload server never listened on {port}")


@dataclass
class Child:
    """A real ``python -m uploader`` process."""

    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None
    logs: list[bytes] = field(default_factory=list)

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uploader"],
            env={**os.environ, **self.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        await _wait_listening(int(self.env["UPLOAD_SERVER_PORT"]))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.logs.append(self.proc.communicate()[0])

    def wait(self, timeout: float = 60) -> int:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.proc.poll() is None:
            self.proc.kill()
        self.logs.append(self.proc.communicate()[0])
        return self.proc.returncode


class CuttingRelay:
    """127.0.0.1 TCP relay to ``port`` that, on its first connection carrying more than
    ``cut_after`` bytes upstream, closes both sides at that byte (later ones pass)."""

    def __init__(self, port: int, cut_after: int) -> None:
        self.port, self.cut_after = port, cut_after
        self.cuts = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"https://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)
        back = asyncio.ensure_future(_copy(up_reader, writer, None))
        budget = self.cut_after if not self.cuts else None
        cut = await _copy(reader, up_writer, budget)
        if cut:
            self.cuts += 1
            for w in (writer, up_writer):
                w.transport.abort()
        await asyncio.wait([back])


async def _copy(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, budget: int | None
) -> bool:
    """Copy until EOF (False) or until ``budget`` bytes went through (True)."""
    moved = 0
    try:
        while data := await reader.read(256 * 1024):
            if budget is not None and moved + len(data) > budget:
                writer.write(data[: budget - moved])
                await writer.drain()
                return True
            moved += len(data)
            writer.write(data)
            await writer.drain()
        writer.close()
    except (ConnectionError, OSError):
        pass
    return False


@contextlib.asynccontextmanager
async def running_app(config: UploadConfig) -> AsyncIterator[tuple[str, Uploads]]:
    """The app alone (no exit when the upload ends): what a request sees after completion."""
    from aiohttp import web

    uploads = Uploads(config)
    tls = serving_context(config.tls.cert, config.tls.key, config.tls.client_ca)
    runner = web.AppRunner(make_app(uploads, config.tls.client_name))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", config.port, ssl_context=tls)
    await site.start()
    try:
        yield f"https://127.0.0.1:{config.port}", uploads
    finally:
        await runner.cleanup()


def data_target(root: Path) -> Path:
    """``<root>/data/disk.img``, its folder made: a filesystem volume's DESTINATION."""
    (root / "data").mkdir(exist_ok=True)
    return root / "data" / "disk.img"
