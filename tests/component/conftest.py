"""Fixtures for component tests: images made by real qemu-img, a misbehaving loopback server,
real loop block devices."""

from __future__ import annotations

import contextlib
import os
import random
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from testkit.pki import CertificateAuthority
from testkit.registry import Tls
from tests.component.badserver import Recorder, make_app

MiB = 1024 * 1024
VIRTUAL = 32 * MiB


def run(*cmd: str | Path) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed: {proc.stderr}")


def write_base_raw(path: Path, size: int = VIRTUAL, seed: int = 7) -> None:
    """A disk with data islands (random, text, sparse patterns) and long zero runs."""
    rng = random.Random(seed)
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset in (0, 3 * MiB + 4096, 9 * MiB - 700, 17 * MiB, size - MiB):
            fh.seek(offset)
            fh.write(rng.randbytes(MiB // 2) + b"text block " * 5000)
        fh.seek(12 * MiB)
        fh.write((b"\x00" * 4095 + b"\x01") * 64)  # zero 4K blocks with one set byte each


CONVERSIONS: dict[str, list[str]] = {
    "raw": [],
    "qcow2": ["-O", "qcow2"],
    "qcow2-512": ["-O", "qcow2", "-o", "cluster_size=512"],
    "qcow2-2M": ["-O", "qcow2", "-o", "cluster_size=2M"],
    "qcow2-compressed": ["-O", "qcow2", "-c"],
    "qcow2-v2": ["-O", "qcow2", "-o", "compat=0.10"],
    "vmdk": ["-O", "vmdk"],
    "vdi": ["-O", "vdi"],
    "vhd": ["-O", "vpc", "-o", "force_size=on"],
    "vhdx": ["-O", "vhdx"],
}
QEMU_FORMAT = {"raw": "raw", "vmdk": "vmdk", "vdi": "vdi", "vhd": "vpc", "vhdx": "vhdx"}

COMPRESSORS: dict[str, list[str]] = {
    "gz": ["gzip", "-1", "-c"],
    "xz": ["xz", "-T2", "-1", "--block-size=4MiB", "-c"],  # multi-block: parallel decode
    "xz1": ["xz", "-T1", "-1", "-c"],  # single block, sizes absent: sequential decode
    "zst": ["zstd", "-q", "-1", "-c"],
    "bz2": ["bzip2", "-1", "-c"],
}


@dataclass(frozen=True)
class Image:
    path: Path
    reference: Path  # qemu-img convert -O raw of the same image


class ImageFactory:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.base = root / "base.raw"
        write_base_raw(self.base)

    def make(self, kind: str, compression: str | None = None) -> Image:
        name = f"disk.{kind}" + (f".{compression}" if compression else "")
        path = self.root / name
        plain = self.root / f"disk.{kind}"
        if not plain.exists():
            if kind == "raw":
                run("cp", "--sparse=always", self.base, plain)
            else:
                run("qemu-img", "convert", "-f", "raw", *CONVERSIONS[kind], self.base, plain)
        reference = self.root / f"ref.{kind}.raw"
        if not reference.exists():
            fmt = QEMU_FORMAT.get(kind, "qcow2")
            run("qemu-img", "convert", "-f", fmt, "-O", "raw", plain, reference)
        if compression and not path.exists():
            with open(path, "wb") as out:
                subprocess.run([*COMPRESSORS[compression], str(plain)], stdout=out, check=True)
        return Image(path, reference)


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> ImageFactory:
    return ImageFactory(tmp_path_factory.mktemp("images"))


@dataclass
class Server:
    url: str
    root: Path
    recorder: Recorder

    def link(self, mode: str, path: Path) -> str:
        target = self.root / path.name
        if not target.exists():
            os.symlink(path, target)
        return f"{self.url}/{mode}/{path.name}"


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    root = tmp_path / "served"
    root.mkdir()
    rec = Recorder()
    runner = web.AppRunner(make_app(root, rec))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield Server(f"http://127.0.0.1:{port}", root, rec)
    await runner.cleanup()


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[str, Handler], Awaitable[str]]]:
    """Start servers with one handler for every path, on a loopback host; their origins."""
    runners: list[web.AppRunner] = []

    async def start(host: str, handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://{host}:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


@contextlib.contextmanager
def loop_device(backing: Path, size: int, fill: bytes = b"\xaa") -> Iterator[str]:
    """A real loop block device over a file pre-filled with garbage (so zeroing is tested)."""
    with open(backing, "wb") as fh:
        block = fill * MiB
        for _ in range(size // MiB):
            fh.write(block)
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)


@pytest.fixture
def loopdev(tmp_path: Path) -> Iterator[str]:
    with loop_device(tmp_path / "block.img", 48 * MiB) as dev:
        yield dev


def allocated(path: Path) -> int:
    """Bytes in data extents (SEEK_DATA/SEEK_HOLE), not st_blocks: st_blocks also counts ext4
    extent-tree blocks, which depend on write order rather than on what was written."""
    total = offset = 0
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        while offset < size:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:
                break
            offset = os.lseek(fd, start, os.SEEK_HOLE)
            total += offset - start
    finally:
        os.close(fd)
    return total


def same_content(a: Path, b: Path, length: int | None = None) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        remaining = length
        while True:
            n = MiB if remaining is None else min(MiB, remaining)
            x, y = fa.read(n), fb.read(n)
            if x != y:
                return False
            if not x or (remaining is not None and (remaining := remaining - n) <= 0):
                return True


# image servers behind a proxy (test_proxy_tls.py, test_proxy_auth.py)
@pytest.fixture
def target_tls(tmp_path: Path) -> Tls:
    return Tls.make(tmp_path / "target-tls", CertificateAuthority("images-ca"))


@pytest.fixture
async def origins(
    images: ImageFactory, target_tls: Tls
) -> AsyncIterator[dict[str, tuple[str, list[str]]]]:
    """kind -> (origin, request paths seen) of an http and an https image server, and of an
    https one that closes each connection after its answer (``Connection: close``: the
    response is read after ``http.client`` closed the connection, through its reader)."""
    found: dict[str, tuple[str, list[str]]] = {}
    runners: list[web.AppRunner] = []
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(target_tls.cert, target_tls.key)
    for kind, tls in (("http", None), ("https", ctx), ("https-close", ctx)):
        seen: list[str] = []

        async def handler(
            request: web.Request, seen: list[str] = seen, close: bool = kind == "https-close"
        ) -> web.StreamResponse:
            seen.append(f"{request.method} {request.path}")
            response = web.FileResponse(images.root / request.path.lstrip("/"))
            if close:
                response.force_close()
            return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        port = runner.addresses[0][1]
        scheme = "http" if tls is None else "https"
        found[kind] = (f"{scheme}://127.0.0.1:{port}", seen)
        runners.append(runner)
    yield found
    for runner in runners:
        await runner.cleanup()
