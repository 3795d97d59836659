"""The clone source (``python -m cloner``) against a real loopback mutual-TLS receiver that
writes through the data path, as the upload server does: a sparse ``disk.img`` and a loop block
device arrive byte-identical and as sparse as they were (filesystem -> block and back, the
device's zero pages left out of the stream), an
archive volume arrives as its files, a client certificate with the wrong CN is refused, and a
bad environment or an unreachable target end in typed termination messages."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from benchmarks.clone_receiver import KINDS, make_app, serving_context
from cdi.api.termination import TerminationMessage
from cdi.pki.certs import KeyPair, issue_client, issue_serving, new_ca
from tests.component.conftest import loop_device, write_base_raw

MiB = 1024 * 1024
REPO = Path(__file__).resolve().parents[2]
CLIENT_NAME = "golden/fedora-tenant/mine"


@dataclass
class Receiver:
    """The upload server's stand-in (``benchmarks.clone_receiver``) on a loopback port, in a
    thread: ``POST /v1beta1/upload`` into ``target`` through the data path, only from a client
    certificate with CN ``CLIENT_NAME``."""

    target: str
    block: bool
    ca: KeyPair
    port: int = 0
    _loop: asyncio.AbstractEventLoop | None = None
    _app: web.Application | None = None

    @property
    def seen(self) -> list[str]:
        assert self._app is not None
        return list(self._app[KINDS])

    def start(self, tmp: Path) -> Receiver:
        now = dt.datetime.now(dt.UTC)
        serving = issue_serving(self.ca, ("localhost", "127.0.0.1"), now)
        (tmp / "srv.crt").write_bytes(serving.cert_pem)
        (tmp / "srv.key").write_bytes(serving.key_pem)
        (tmp / "ca.crt").write_bytes(self.ca.cert_pem)
        ctx = serving_context(str(tmp / "srv.crt"), str(tmp / "srv.key"), str(tmp / "ca.crt"))
        ready = threading.Event()

        async def main() -> None:
            self._app = make_app(self.target, self.block, CLIENT_NAME)
            runner = web.AppRunner(self._app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()

        def thread() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(main())
            self._loop.run_forever()

        threading.Thread(target=thread, daemon=True).start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)


def client_files(tmp: Path, ca: KeyPair, cn: str) -> dict[str, str]:
    pair = issue_client(ca, cn, dt.datetime.now(dt.UTC))
    (tmp / "client.crt").write_bytes(pair.cert_pem)
    (tmp / "client.key").write_bytes(pair.key_pem)
    return {"CLIENT_CERT_FILE": str(tmp / "client.crt"),
            "CLIENT_KEY_FILE": str(tmp / "client.key"),
            "SERVER_CA_CERT_FILE": str(tmp / "ca.crt")}  # fmt: skip


def run_cloner(env: dict[str, str], tmp: Path) -> TerminationMessage:
    term = tmp / "termination"
    full = {"PATH": os.environ["PATH"], "CLONER_TERMINATION_PATH": str(term), **env}
    subprocess.run([sys.executable, "-m", "cloner"], env=full, cwd=REPO, timeout=60,
                   capture_output=True, check=False)  # fmt: skip
    return TerminationMessage.from_json(term.read_text())


@pytest.fixture
def ca() -> KeyPair:
    return new_ca("cdi-uploadserver-client-ca", dt.datetime.now(dt.UTC))


@pytest.fixture
def source_fs(tmp_path: Path) -> Path:
    """A filesystem volume's mount point with a sparse 32 MiB ``disk.img``."""
    root = tmp_path / "source"
    root.mkdir()
    write_base_raw(root / "disk.img")
    return root


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def receiver(target: str, block: bool, ca: KeyPair, tmp: Path) -> Iterator[Receiver]:
    r = Receiver(target, block, ca).start(tmp)
    try:
        yield r
    finally:
        r.stop()


def test_a_sparse_disk_image_arrives_identical_and_as_sparse(
    tmp_path: Path, ca: KeyPair, source_fs: Path
) -> None:
    with open(source_fs / "disk.img", "r+b") as fh:  # zeros written out: allocated, not data
        fh.seek(20 * MiB)
        fh.write(bytes(MiB))
        os.fsync(fh.fileno())
    target = tmp_path / "target" / "disk.img"
    target.parent.mkdir()
    for r in receiver(str(target), False, ca, tmp_path):
        env = {"UPLOAD_URL": f"https://127.0.0.1:{r.port}/v1beta1/upload",
               "VOLUME_MODE": "filesystem", "MOUNT_POINT": str(source_fs),
               **client_files(tmp_path, ca, CLIENT_NAME)}  # fmt: skip
        message = run_cloner(env, tmp_path)
        assert message.succeeded and message.message == "Clone Complete", message
        assert r.seen == ["filesystem-clone"]
    assert target.read_bytes() == (source_fs / "disk.img").read_bytes()
    # a sparse tar member: only the data extents less their zero pages (and headers)
    # travelled, not the holes nor the written zeros, which are holes on the target
    assert message.bytes_read < allocated(source_fs / "disk.img") - MiB + 64 * 1024
    assert allocated(target) <= allocated(source_fs / "disk.img") - MiB + 64 * 1024


def test_filesystem_to_block_and_block_to_filesystem(
    tmp_path: Path, ca: KeyPair, source_fs: Path
) -> None:
    with loop_device(tmp_path / "block.img", 32 * MiB) as dev:
        for r in receiver(dev, True, ca, tmp_path):
            url = f"https://127.0.0.1:{r.port}/v1beta1/upload"
            files = client_files(tmp_path, ca, CLIENT_NAME)
            env = {"UPLOAD_URL": url, "MOUNT_POINT": str(source_fs), "CLONE_STREAM": "raw",
                   **files}  # fmt: skip
            assert run_cloner(env, tmp_path).succeeded
            assert r.seen == ["blockdevice-clone-sparse"]
        with open(dev, "rb") as fh:
            assert fh.read() == (source_fs / "disk.img").read_bytes()
        back = tmp_path / "back" / "disk.img"
        back.parent.mkdir()
        for r in receiver(str(back), False, ca, tmp_path):
            env = {"UPLOAD_URL": f"https://127.0.0.1:{r.port}/v1beta1/upload",
                   "VOLUME_MODE": "block", "MOUNT_POINT": dev,
                   **client_files(tmp_path, ca, CLIENT_NAME)}  # fmt: skip
            message = run_cloner(env, tmp_path)
            assert message.succeeded, message
    # the device's zero pages did not travel: its ~3 MB of data and the frames' headers did
    assert message.bytes_read < 8 * MiB
    assert back.read_bytes() == (source_fs / "disk.img").read_bytes()
    assert allocated(back) <= 1.01 * allocated(source_fs / "disk.img")


def test_a_volume_of_files_arrives_as_its_files(tmp_path: Path, ca: KeyPair) -> None:
    src = tmp_path / "files"
    (src / "lost+found").mkdir(parents=True)
    (src / "etc" / "deep").mkdir(parents=True)
    (src / "etc" / "motd").write_text("hello from the golden namespace\n")
    (src / "etc" / "deep" / "holes").write_bytes(b"")
    with open(src / "etc" / "deep" / "holes", "r+b") as fh:
        fh.truncate(8 * MiB)
        fh.seek(5 * MiB)
        fh.write(b"island")
    target = tmp_path / "unpacked" / "disk.img"
    target.parent.mkdir()
    for r in receiver(str(target), False, ca, tmp_path):
        env = {"UPLOAD_URL": f"https://127.0.0.1:{r.port}/v1beta1/upload",
               "MOUNT_POINT": str(src),
               **client_files(tmp_path, ca, CLIENT_NAME)}  # fmt: skip
        assert run_cloner(env, tmp_path).succeeded
        assert r.seen == ["filesystem-clone"]
    assert (target.parent / "etc" / "motd").read_text() == "hello from the golden namespace\n"
    holes = target.parent / "etc" / "deep" / "holes"
    assert holes.read_bytes() == (src / "etc" / "deep" / "holes").read_bytes()
    assert allocated(holes) < MiB
    assert not (target.parent / "lost+found").exists()


def test_a_client_certificate_for_another_clone_is_refused(
    tmp_path: Path, ca: KeyPair, source_fs: Path
) -> None:
    target = tmp_path / "t" / "disk.img"
    target.parent.mkdir()
    for r in receiver(str(target), False, ca, tmp_path):
        env = {"UPLOAD_URL": f"https://127.0.0.1:{r.port}/v1beta1/upload",
               "MOUNT_POINT": str(source_fs),
               **client_files(tmp_path, ca, "other/src-tenant/theirs")}  # fmt: skip
        message = run_cloner(env, tmp_path)
    assert (message.reason, message.transient) == ("TargetError", False)
    assert "401" in message.message
    assert not target.exists()


@pytest.mark.parametrize(
    ("env", "reason"),
    [
        ({"UPLOAD_URL": "http://127.0.0.1:1/v1beta1/upload"}, "InvalidConfig"),
        (
            {"UPLOAD_URL": "https://127.0.0.1:1/v1beta1/upload", "VOLUME_MODE": "tape"},
            "InvalidConfig",
        ),
        ({"UPLOAD_URL": "https://127.0.0.1:1/v1beta1/upload"}, "SourceUnavailable"),
        (
            {
                "UPLOAD_URL": "https://127.0.0.1:1/u",
                "MOUNT_POINT": "/nonexistent",
                "CLONE_STREAM": "raw",
            },
            "SourceNotFound",
        ),
    ],
    ids=["http", "mode", "unreachable", "no source"],
)
def test_failures_end_in_typed_termination_messages(
    tmp_path: Path, ca: KeyPair, source_fs: Path, env: dict[str, str], reason: str
) -> None:
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    full = {"MOUNT_POINT": str(source_fs), **client_files(tmp_path, ca, CLIENT_NAME), **env}
    message = run_cloner(full, tmp_path)
    assert message.reason == reason, message
