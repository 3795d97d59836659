"""Resumable uploads (tus 1.0 core, beyond CDI), through the client library:

- the connection cut at 50% by a real TCP relay: the client HEADs the offset and PATCHes the
  rest; the pod's decoder state survived, so raw and qcow2 both finish identical;
- the server process (a real ``python -m uploader`` child) killed mid-upload and restarted:
  a raw upload continues from the data path's durable checkpoint, a qcow2 one is told to
  start over (offset 0 and a ``Cdi-Upload-Restart`` note) and the client does;
- a cut upload not continued in time is abandoned, and a fresh one from 0 may start.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
from pathlib import Path

import aiohttp
import pytest

from cdi.api.termination import TerminationMessage
from commands.upload.client import ClientSettings, upload_file
from datapath import checkpoint
from tests.component.conftest import Image, ImageFactory, same_content
from tests.component.uploader_harness import (
    Child,
    CuttingRelay,
    Pki,
    data_target,
    free_port,
    make_pki,
    running_server,
    server_env,
)
from uploader.config import CHECKPOINT_NAME

MiB = 1024 * 1024


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.mark.parametrize("kind", ["raw", "qcow2"])
async def test_cut_at_half_resumes_where_the_server_stopped(
    pki: Pki, tmp_path: Path, images: ImageFactory, kind: str
) -> None:
    image = images.make(kind)
    target = data_target(tmp_path)
    env = server_env(pki, target, "32Mi", free_port())
    size = image.path.stat().st_size
    async with running_server(env) as srv, CuttingRelay(srv.config.port, size // 2) as via:
        settings = ClientSettings(via, ssl=pki.client_context(), backoff_initial=0.05)
        result = await upload_file(str(image.path), settings)
        outcome = await asyncio.wait_for(srv.task, 60)
    assert result.resumed == 1 and not result.restarted
    assert outcome.succeeded, outcome.message
    assert same_content(target, image.reference)


def big_image(folder: Path, kind: str) -> Image:
    raw = folder / "big.raw"
    with open(raw, "wb") as fh:
        fh.truncate(24 * MiB)
        fh.seek(4 * MiB)
        fh.write(random.Random(5).randbytes(12 * MiB))
    if kind == "raw":
        return Image(raw, raw)
    converted = folder / f"big.{kind}"
    subprocess.run(["qemu-img", "convert", "-O", kind, raw, converted], check=True)
    return Image(converted, raw)


@pytest.mark.parametrize("kind", ["raw", "qcow2"])
async def test_killed_server_raw_resumes_from_checkpoint_qcow2_starts_over(
    pki: Pki, tmp_path: Path, images: ImageFactory, kind: str
) -> None:
    image = big_image(tmp_path, kind)  # more than the socket buffers hold
    target = data_target(tmp_path)
    port = free_port()
    child = Child(server_env(pki, target, "24Mi", port))
    await child.start()
    size = image.path.stat().st_size
    restarted: list[asyncio.Future[None]] = []

    def progress(done: int, rate: float) -> None:
        saved = checkpoint.load(str(tmp_path / "data" / CHECKPOINT_NAME))
        began = saved is not None and (saved.offset > 0 or kind != "raw")  # mid-upload
        if done >= size // 2 and began and not restarted:
            child.kill()
            restarted.append(asyncio.ensure_future(child.start()))

    settings = ClientSettings(
        f"https://127.0.0.1:{port}", ssl=pki.client_context(), backoff_initial=0.2, attempts=10
    )
    try:
        result = await upload_file(str(image.path), settings, progress=progress)
        assert child.wait() == 0, b"".join(child.logs).decode()
    finally:
        if child.proc is not None and child.proc.poll() is None:
            child.kill()
    outcome = TerminationMessage.from_json((pki.folder / "termination-log").read_text())
    assert outcome.succeeded and outcome.message.startswith("Upload Complete")
    assert same_content(target, image.reference)
    if kind == "raw":
        assert result.resumed == 1 and not result.restarted
        assert outcome.resumed_from > 0
    else:
        assert result.resumed == 0 and len(result.restarted) == 1
        assert "start again from byte 0" in result.restarted[0]
        assert outcome.resumed_from == 0


async def test_cut_upload_not_continued_is_abandoned_and_a_new_one_starts(
    pki: Pki, tmp_path: Path, images: ImageFactory
) -> None:
    image = images.make("qcow2")
    target = data_target(tmp_path)
    env = server_env(pki, target, "32Mi", free_port(), UPLOAD_IDLE_TIMEOUT="0.5")
    size = image.path.stat().st_size
    async with running_server(env) as srv:
        async with CuttingRelay(srv.config.port, size // 2) as via:
            settings = ClientSettings(via, ssl=pki.client_context(), attempts=0)
            with pytest.raises(Exception, match="kept failing"):
                await upload_file(str(image.path), settings)
        await asyncio.sleep(1.5)  # past the idle timeout: the partial target is discarded
        async with aiohttp.ClientSession() as session:
            url = srv.url + "/v1beta1/upload"
            async with session.head(url, ssl=pki.client_context()) as resp:
                assert resp.headers["Upload-Offset"] == "0"
        assert not target.exists()
        await upload_file(str(image.path), srv.settings(pki))
        outcome = await asyncio.wait_for(srv.task, 60)
    assert outcome.succeeded
    assert same_content(target, image.reference)
