"""Uploads of every mode (sync, async, form, form-async) and the formats users send (qcow2,
qcow2.xz, raw.gz, vmdk) into a file target and a real loop block device, plus archives: the
result is byte-identical to ``qemu-img convert -O raw`` and no less sparse, and qcow2 never
touches scratch."""

from __future__ import annotations

import asyncio
import tarfile
from pathlib import Path

import aiohttp
import pytest

from commands.upload.client import upload_file
from datapath.decode.sparseraw import end_frame, frames_of
from tests.component.conftest import (
    VIRTUAL,
    ImageFactory,
    allocated,
    loop_device,
    same_content,
)
from tests.component.uploader_harness import (
    Pki,
    Running,
    data_target,
    free_port,
    make_pki,
    running_server,
    server_env,
)

MiB = 1024 * 1024
FORMATS = [("qcow2", None), ("qcow2", "xz"), ("raw", "gz"), ("vmdk", None)]
MODES = ["sync", "async", "form", "form-async"]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


async def send(srv: Running, pki: Pki, mode: str, image: Path) -> None:
    if mode in ("sync", "async"):
        settings = srv.settings(pki, detect_async=mode == "async")
        result = await upload_file(str(image), settings)
        assert result.path.endswith("upload-async" if mode == "async" else "upload")
        return
    path = "/v1beta1/upload-form" + ("-async" if mode.endswith("async") else "")
    with open(image, "rb") as fh:
        form = aiohttp.FormData()
        form.add_field("name", "disk")
        form.add_field("file", fh, filename=image.name)
        async with (
            aiohttp.ClientSession() as session,
            session.post(srv.url + path, data=form, ssl=pki.client_context()) as resp,
        ):
            assert resp.status == 200, await resp.text()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("kind", "compression"), FORMATS)
async def test_upload_into_a_file_is_identical_and_sparse(
    pki: Pki, tmp_path: Path, images: ImageFactory, mode: str, kind: str, compression: str | None
) -> None:
    image = images.make(kind, compression)
    target = data_target(tmp_path)
    async with running_server(server_env(pki, target, "32Mi", free_port())) as srv:
        await send(srv, pki, mode, image.path)
        outcome = await asyncio.wait_for(srv.task, 60)
    assert outcome.succeeded, outcome.message
    assert target.stat().st_size == image.reference.stat().st_size
    assert same_content(target, image.reference)
    assert allocated(target) <= allocated(image.reference)
    assert not outcome.scratch_used
    assert not (tmp_path / "data" / ".cdi-scratch").exists()


BLOCK_CASES = list(zip(MODES, FORMATS, strict=True))  # every mode and every format once


@pytest.mark.parametrize(("mode", "fmt"), BLOCK_CASES, ids=[f"{m}-{f[0]}" for m, f in BLOCK_CASES])
async def test_upload_into_a_block_device_is_identical(
    pki: Pki, tmp_path: Path, images: ImageFactory, mode: str, fmt: tuple[str, str | None]
) -> None:
    image = images.make(*fmt)
    with loop_device(tmp_path / "block.img", 40 * MiB) as dev:
        async with running_server(server_env(pki, dev, "40Mi", free_port())) as srv:
            await send(srv, pki, mode, image.path)
            outcome = await asyncio.wait_for(srv.task, 60)
        assert outcome.succeeded, outcome.message
        with open(dev, "rb") as fh:
            assert fh.read(VIRTUAL) == image.reference.read_bytes()


@pytest.mark.parametrize("compression", [None, "gz"])
async def test_archive_upload_extracts_the_files(
    pki: Pki, tmp_path: Path, images: ImageFactory, compression: str | None
) -> None:
    disk = images.make("raw").reference
    notes = tmp_path / "notes.txt"
    notes.write_text("hello from the archive\n")
    archive = tmp_path / ("in.tar" + (".gz" if compression else ""))
    with tarfile.open(archive, "w:gz" if compression else "w") as tar:
        tar.add(disk, arcname="disk.raw")
        tar.add(notes, arcname="docs/notes.txt")
    target = data_target(tmp_path)
    async with running_server(server_env(pki, target, "64Mi", free_port())) as srv:
        await upload_file(str(archive), srv.settings(pki, archive=True))
        outcome = await asyncio.wait_for(srv.task, 60)
    assert outcome.succeeded, outcome.message
    assert same_content(tmp_path / "data" / "disk.raw", disk)
    assert (tmp_path / "data" / "docs" / "notes.txt").read_text() == notes.read_text()
    assert not target.exists()


async def test_clone_header_selects_the_clone_content_types(
    pki: Pki, tmp_path: Path, images: ImageFactory
) -> None:
    """``x-cdi-content-type``: a host-assisted clone stream (block: verbatim, so even a qcow2
    source volume's bytes are kept as they are; filesystem: a tar of the source volume)."""
    disk = images.make("raw").reference
    volume = images.make("qcow2").path  # a block volume that holds a qcow2
    target = data_target(tmp_path)
    async with running_server(server_env(pki, target, "32Mi", free_port())) as srv:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                srv.url + "/v1beta1/upload",
                data=volume.read_bytes(),
                headers={"x-cdi-content-type": "blockdevice-clone"},
                ssl=pki.client_context(),
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
        outcome = await asyncio.wait_for(srv.task, 60)
    assert outcome.succeeded
    assert same_content(target, volume, volume.stat().st_size)

    tree = tmp_path / "tree"
    tree.mkdir()
    with tarfile.open(tmp_path / "volume.tar", "w") as tar:
        tar.add(disk, arcname="disk.img")
    env = server_env(pki, tree / "disk.img", "64Mi", free_port())
    async with running_server(env) as srv:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                srv.url + "/v1beta1/upload",
                data=(tmp_path / "volume.tar").read_bytes(),
                headers={"x-cdi-content-type": "filesystem-clone"},
                ssl=pki.client_context(),
            ) as resp,
        ):
            assert resp.status == 200, await resp.text()
        assert (await asyncio.wait_for(srv.task, 60)).succeeded
    assert same_content(tree / "disk.img", disk)


async def test_a_sparse_block_clone_stream_lands_verbatim_and_a_cut_one_fails(
    pki: Pki, tmp_path: Path, images: ImageFactory
) -> None:
    """``blockdevice-clone-sparse`` (our cloner's): the volume's non-zero pages in frames, the
    rest holes; the bytes kept as they are (a qcow2 inside stays a qcow2). Cut before its end
    frame, it is a typed failure, not a shorter disk."""
    volume = images.make("qcow2").path.read_bytes()
    chunk = 1 << 20
    frames = b"".join(
        bytes(p)
        for at in range(0, len(volume), chunk)
        for p in frames_of(volume[at : at + chunk], at)
    )
    target = data_target(tmp_path)
    for body, status in ((frames, 500), (frames + end_frame(len(volume)), 200)):
        async with running_server(server_env(pki, target, "32Mi", free_port())) as srv:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    srv.url + "/v1beta1/upload",
                    data=body,
                    headers={"x-cdi-content-type": "blockdevice-clone-sparse"},
                    ssl=pki.client_context(),
                ) as resp,
            ):
                assert resp.status == status, await resp.text()
                if status == 500:
                    assert "cut before its end frame" in await resp.text()
                    continue
            assert (await asyncio.wait_for(srv.task, 60)).succeeded
    assert target.read_bytes()[: len(volume)] == volume
    assert len(frames) < len(volume)  # qcow2's zero padding did not travel


async def test_preallocation_allocates_the_whole_disk(
    pki: Pki, tmp_path: Path, images: ImageFactory
) -> None:
    image = images.make("qcow2")
    target = data_target(tmp_path)
    env = server_env(pki, target, "32Mi", free_port(), PREALLOCATION="true")
    async with running_server(env) as srv:
        await upload_file(str(image.path), srv.settings(pki))
        outcome = await asyncio.wait_for(srv.task, 60)
    assert outcome.succeeded and outcome.preallocation_applied
    assert same_content(target, image.reference)
    assert allocated(target) == target.stat().st_size
