"""Verified volumes (issue 28): real imports of qcow2, raw.gz, vmdk and multi-block xz into a
file and into a real loop block device, read back from the device and compared; a target
corrupted between the final fsync and the read-back (the processor's ``before_read_back``
hook, given to its constructor) fails the run with ``VerificationFailed`` and is never
reported complete; uploads and a host-assisted clone's streams (sparse block frames, a
filesystem volume's tar: each extracted file read back) are verified the same way."""

from __future__ import annotations

import asyncio
import io
import os
import tarfile
from dataclasses import replace
from pathlib import Path

import aiohttp
import blake3
import pytest

from cdi.api.constants import ContentType
from cdi.api.termination import VERIFICATION_NOT_SUPPORTED, VERIFIED, TerminationMessage
from commands.upload.client import upload_file
from datapath import FileSource, Processor, ProcessPlan, TargetSpec
from datapath.decode.sparseraw import end_frame, frames_of
from datapath.verify import BLOCK, read_back
from importer.runner import run_import
from tests.component.conftest import VIRTUAL, ImageFactory, MiB, Server, loop_device, same_content
from tests.component.helpers import http_config
from tests.component.test_checkpoint_binding import _config, _junk, _plant
from tests.component.test_cli_and_pod import CDI, _run
from tests.component.uploader_harness import (
    Pki,
    data_target,
    free_port,
    make_pki,
    running_server,
    server_env,
)

FORMATS = [("qcow2", None), ("raw", "gz"), ("vmdk", None), ("raw", "xz")]


def plan_for(target: str, *, block: bool, size: int | None, scratch: Path) -> ProcessPlan:
    spec = TargetSpec(path=target, block=block, size=size)
    return ProcessPlan(target=spec, scratch_dir=str(scratch), verify=True)


def flip_a_data_byte(spec: TargetSpec) -> None:
    """What a storage fault does after the fsync: one byte of written data changes."""
    with open(spec.path, "r+b") as fh:
        data = fh.read(VIRTUAL)
        at = len(data) - len(data.lstrip(b"\0"))  # the first non-zero byte
        fh.seek(at)
        fh.write(bytes([data[at] ^ 0x5A]))
        fh.flush()
        os.fsync(fh.fileno())


def dirty_a_hole(spec: TargetSpec) -> None:
    """Stale bytes appear where the image has zeros (a hole, or a range the run zeroed)."""
    with open(spec.path, "r+b") as fh:
        data = fh.read(VIRTUAL)
        block = next(i for i in range(0, len(data), BLOCK) if not data[i : i + BLOCK].strip(b"\0"))
        fh.seek(block + 1234)
        fh.write(b"stale")
        fh.flush()
        os.fsync(fh.fileno())


@pytest.mark.parametrize(("kind", "comp"), FORMATS)
async def test_an_import_into_a_file_is_read_back_and_verified(
    kind: str, comp: str | None, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make(kind, comp)
    target = tmp_path / "disk.img"
    plan = plan_for(str(target), block=False, size=VIRTUAL, scratch=tmp_path / "scratch")
    result = await Processor(plan, FileSource(str(image.path))).run()
    assert result.succeeded, result
    check = result.verification
    assert check is not None and check.result == VERIFIED, check
    assert check.blocks > 0 and check.digest and check.digest.startswith("xxh3-128")
    assert "verified" in result.message
    assert same_content(target, image.reference)
    # what the run read back is what the module reads back from the finished file
    assert str(read_back(str(target), block_device=False).digest) == check.digest
    # and it travels in the termination message
    assert TerminationMessage.from_json(result.to_json()).verification == check


@pytest.mark.parametrize(("kind", "comp"), FORMATS)
async def test_an_import_into_a_block_device_is_read_back_and_verified(
    kind: str, comp: str | None, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make(kind, comp)
    with loop_device(tmp_path / "block.img", 40 * MiB) as dev:  # full of 0xAA: zeroed first
        plan = plan_for(dev, block=True, size=None, scratch=tmp_path / "scratch")
        result = await Processor(plan, FileSource(str(image.path))).run()
        assert result.succeeded, result
        assert result.verification is not None and result.verification.result == VERIFIED
        # a device has no holes: read whole, up to the image's end (the rest is not the image's)
        assert result.verification.bytes_read == VIRTUAL
        with open(dev, "rb") as fh:
            assert fh.read(VIRTUAL) == image.reference.read_bytes()


@pytest.mark.parametrize("corrupt", [flip_a_data_byte, dirty_a_hole])
@pytest.mark.parametrize(("kind", "comp"), [("qcow2", None), ("raw", "gz")])
async def test_a_target_corrupted_before_the_read_back_fails_the_import(
    kind: str, comp: str | None, corrupt, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make(kind, comp)
    target = tmp_path / "disk.img"
    plan = plan_for(str(target), block=False, size=VIRTUAL, scratch=tmp_path / "scratch")
    processor = Processor(plan, FileSource(str(image.path)), before_read_back=corrupt)
    result = await processor.run()
    assert result.reason == "VerificationFailed", result
    assert not result.transient  # never retried over: the volume cannot be trusted
    assert "does not hold what was written" in result.message
    assert result.verification is None
    assert not target.exists()  # a failed run never leaves a target that looks complete


async def test_a_corrupted_block_device_fails_the_import(
    images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    with loop_device(tmp_path / "block.img", 40 * MiB) as dev:
        plan = plan_for(dev, block=True, size=None, scratch=tmp_path / "scratch")
        # a zero range of the image (the device was 0xAA: the run zeroed it), dirty again
        result = await Processor(
            plan, FileSource(str(image.path)), before_read_back=dirty_a_hole
        ).run()
        assert result.reason == "VerificationFailed", result


async def test_unverified_runs_say_so_and_are_not_read_back(
    images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    target = tmp_path / "disk.img"
    plan = replace(
        plan_for(str(target), block=False, size=VIRTUAL, scratch=tmp_path / "s"), verify=False
    )
    result = await Processor(plan, FileSource(str(image.path)), before_read_back=dirty_a_hole).run()
    assert result.succeeded and result.verification is None  # the hook never ran


async def test_a_qemu_img_conversion_is_reported_not_verified(
    images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("vhd")
    target = tmp_path / "disk.img"
    plan = plan_for(str(target), block=False, size=VIRTUAL + 8 * MiB, scratch=tmp_path / "s")
    result = await Processor(plan, FileSource(str(image.path))).run()
    assert result.succeeded, result
    assert result.verification is not None
    assert result.verification.result == VERIFICATION_NOT_SUPPORTED
    assert "qemu-img" in result.verification.message


async def test_the_importer_verifies_an_http_import(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """The import pod's path: IMPORTER_VERIFY gives ``plan.verify`` (importer.config)."""
    from importer.config import from_env

    env = {"IMPORTER_SOURCE": "http", "IMPORTER_ENDPOINT": "x", "IMPORTER_VERIFY": "true"}
    assert from_env(env).plan.verify
    image = images.make("qcow2", "xz")
    config = http_config(server.link("ok", image.path), tmp_path / "disk.img", size=VIRTUAL)
    config = replace(config, plan=replace(config.plan, verify=True))
    result = await run_import(config)
    assert result.succeeded, result
    assert result.verification is not None and result.verification.result == VERIFIED


# -- the upload server, and so a host-assisted clone's target -----------------------------------


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


async def test_an_upload_is_read_back_and_verified(
    pki: Pki, tmp_path: Path, images: ImageFactory
) -> None:
    image = images.make("qcow2")
    target = data_target(tmp_path)
    env = server_env(pki, target, "32Mi", free_port(), UPLOAD_VERIFY="true")
    async with running_server(env) as srv:
        await upload_file(str(image.path), srv.settings(pki))
        outcome = await asyncio.wait_for(srv.task, 60)
    assert outcome.succeeded, outcome.message
    assert outcome.verification is not None and outcome.verification.result == VERIFIED
    assert same_content(target, image.reference)


async def test_a_sparse_clone_stream_into_a_block_device_is_verified(
    pki: Pki, tmp_path: Path, images: ImageFactory
) -> None:
    """The clone target's side: our cloner's ``blockdevice-clone-sparse`` frames."""
    volume = images.make("raw").path.read_bytes()
    frames = b"".join(bytes(p) for p in frames_of(volume, 0)) + end_frame(len(volume))
    with loop_device(tmp_path / "block.img", 40 * MiB) as dev:
        env = server_env(pki, dev, "40Mi", free_port(), UPLOAD_VERIFY="true")
        async with running_server(env) as srv:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    srv.url + "/v1beta1/upload",
                    data=frames,
                    headers={"x-cdi-content-type": "blockdevice-clone-sparse"},
                    ssl=pki.client_context(),
                ) as resp,
            ):
                assert resp.status == 200, await resp.text()
            outcome = await asyncio.wait_for(srv.task, 60)
        assert outcome.succeeded, outcome.message
        assert outcome.verification is not None and outcome.verification.result == VERIFIED
        with open(dev, "rb") as fh:
            assert fh.read(len(volume)) == volume


# -- an archive, a host-assisted clone of a filesystem volume ------------------------------------


def make_tree_tar(tmp_path: Path, images: ImageFactory, compression: str | None) -> Path:
    """A filesystem volume as a tar: disk.img (sparse, PAX), a file in a folder, a link; a
    file overwritten by a later member of its name, and one replaced by a link."""
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "notes.txt").write_bytes(b"notes\n" * 5000)
    (tree / "old").write_bytes(b"stale")
    (tree / "gone").write_bytes(b"replaced by a link")
    tar_path = tmp_path / ("tree.tar" + (f".{compression}" if compression else ""))
    with tarfile.open(tar_path, f"w:{compression or ''}", format=tarfile.PAX_FORMAT) as tar:
        tar.add(images.make("raw").path, "disk.img")
        tar.add(tree / "sub", "sub")
        tar.add(tree / "old", "old")
        tar.add(tree / "gone", "gone")
        newer = tarfile.TarInfo("old")
        newer.size = 9
        tar.addfile(newer, io.BytesIO(b"new bytes"))
        link = tarfile.TarInfo("gone")
        link.type, link.linkname = tarfile.SYMTYPE, "sub/notes.txt"
        tar.addfile(link)
    return tar_path


@pytest.mark.parametrize("compression", [None, "gz"])
async def test_an_archives_files_are_read_back_and_verified(
    compression: str | None, images: ImageFactory, tmp_path: Path
) -> None:
    tar_path = make_tree_tar(tmp_path, images, compression)
    volume = tmp_path / "volume"
    spec = TargetSpec(path=str(volume), block=False, size=VIRTUAL * 2)
    plan = ProcessPlan(target=spec, content_type=ContentType.FILESYSTEM_CLONE, verify=True)
    result = await Processor(plan, FileSource(str(tar_path))).run()
    assert result.succeeded, result
    assert result.verification is not None and result.verification.result == VERIFIED
    assert "(3 files)" in result.verification.message  # disk.img, sub/notes.txt, old
    assert (volume / "old").read_bytes() == b"new bytes"
    assert same_content(volume / "disk.img", images.make("raw").reference)


async def test_a_corrupted_file_of_an_archive_fails_it(
    images: ImageFactory, tmp_path: Path
) -> None:
    tar_path = make_tree_tar(tmp_path, images, None)
    volume = tmp_path / "volume"
    spec = TargetSpec(path=str(volume), block=False, size=VIRTUAL * 2)
    plan = ProcessPlan(target=spec, content_type=ContentType.ARCHIVE, verify=True)

    def corrupt(target: TargetSpec) -> None:
        with open(Path(target.path) / "sub" / "notes.txt", "r+b") as fh:
            fh.write(b"N")

    result = await Processor(plan, FileSource(str(tar_path)), before_read_back=corrupt).run()
    assert result.reason == "VerificationFailed", result
    assert "'notes.txt'" in result.message


async def test_a_resumed_import_is_verified_over_the_whole_volume(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """The prefix an earlier attempt wrote (attested) is read into the digest first, so the
    read-back covers all of it (without that, the prefix's blocks would be a mismatch)."""
    image = images.make("raw")
    data = image.path.read_bytes()
    half = len(data) // 2 + 1000  # not on a block boundary: a block is part old, part new
    attested = (half, blake3.blake3(data[:half]).hexdigest())
    url = server.link("ok", image.path)
    config, identity = await _config(url, tmp_path, require=True, attested=attested)
    config = replace(config, plan=replace(config.plan, verify=True))
    _plant(tmp_path, data[:half] + _junk(len(data) - half), identity, half)
    result = await run_import(config)
    assert result.succeeded and result.resumed_from == half, result
    assert result.verification is not None and result.verification.result == VERIFIED
    assert same_content(tmp_path / "disk.img", image.reference, len(data))


async def test_cdi_import_verify_reports_the_read_back(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("vmdk")
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    link = server.link("ok", image.path)
    code, out, err = await _run(*CDI, "import", link, str(target), "--verify", "--json")
    assert code == 0, err
    check = TerminationMessage.from_json(out).verification
    assert check is not None and check.result == VERIFIED and check.blocks > 0
