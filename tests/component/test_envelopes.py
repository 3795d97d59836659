"""Envelopes: a block clone is copied byte for byte whatever its first bytes look like; a
registry layer's disk is taken out of its tar and decoded; a filesystem clone is extracted
with the archive rules."""

from __future__ import annotations

import gzip
import io
import os
import random
import subprocess
import tarfile
from pathlib import Path

import pytest

from cdi.api.constants import ContentType
from cdi.api.termination import TerminationMessage
from datapath import BlockSource, Processor, ProcessPlan, StreamSource, TargetSpec
from tests.component.conftest import ImageFactory, MiB, allocated, same_content
from tests.component.onesource import OneShotBody, process_body

DISK = 16 * MiB


def raw_disk_starting_with_gzip(path: Path) -> bytes:
    """A guest disk whose first sector happens to be a gzip stream, with data islands and
    long zero runs (holes) around them."""
    rng = random.Random(5)
    data = bytearray(DISK)
    head = gzip.compress(b"not an image, just a file the guest wrote" * 100)
    data[: len(head)] = head
    data[3 * MiB : 3 * MiB + 300_000] = rng.randbytes(300_000)
    data[DISK - 8192 :] = b"\x07" * 8192
    path.write_bytes(data)
    return bytes(data)


async def test_blockdevice_clone_is_copied_verbatim_with_holes(tmp_path: Path) -> None:
    source = tmp_path / "guest.raw"
    data = raw_disk_starting_with_gzip(source)
    target = tmp_path / "disk.img"
    body = OneShotBody(data)
    result = await process_body(body, target, content_type=ContentType.BLOCKDEVICE_CLONE)
    assert result.succeeded, result
    assert list(result.format_chain) == ["raw"]
    assert target.read_bytes() == data
    assert allocated(target) <= 512 * 1024, "zero pages must stay holes"
    sniffed = await process_body(OneShotBody(data), tmp_path / "sniffed.img")
    assert list(sniffed.format_chain)[:1] == ["gz"], "kubevirt content would have been decoded"


async def test_blockdevice_clone_onto_a_dirty_block_device_zeroes_the_holes(
    loopdev: str, tmp_path: Path
) -> None:
    data = raw_disk_starting_with_gzip(tmp_path / "guest.raw")
    spec = TargetSpec(path=loopdev, block=True)
    plan = ProcessPlan(target=spec, content_type=ContentType.BLOCKDEVICE_CLONE)
    result = await Processor(plan, StreamSource(OneShotBody(data))).run()
    assert result.succeeded, result
    with open(loopdev, "rb") as dev:
        assert dev.read(DISK) == data  # the device held 0xaa garbage before


async def test_block_source_reports_the_device_size_and_clones_it(tmp_path: Path) -> None:
    backing = tmp_path / "source-volume"
    data = raw_disk_starting_with_gzip(backing)
    dev = subprocess.run(
        ["losetup", "--find", "--show", str(backing)], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        source = BlockSource(dev)
        info = await source.probe()
        assert info.size == DISK and info.replayable
        target = tmp_path / "disk.img"
        plan = ProcessPlan(
            target=TargetSpec(str(target), block=False),
            content_type=ContentType.BLOCKDEVICE_CLONE,
        )
        result = await Processor(plan, source).run()
    finally:
        subprocess.run(["losetup", "-d", dev], check=False)
    assert result.succeeded and result.bytes_read == DISK, result
    assert target.read_bytes() == data


def layer(members: dict[str, bytes | None], *, compress: bool = True) -> bytes:
    """A container image layer: a tar (gzip-compressed by default); None is a directory."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return gzip.compress(out.getvalue(), compresslevel=1) if compress else out.getvalue()


async def _layer_import(data: bytes, target: Path) -> TerminationMessage:
    return await process_body(OneShotBody(data), target, tar_member="disk/")


async def test_registry_layer_disk_is_taken_from_the_tar_and_decoded(
    images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    members = {
        "etc/": None,
        "etc/hostname": b"builder\n",
        "disk/": None,
        "disk/x.qcow2": image.path.read_bytes(),
        "README": b"a containerDisk",
    }
    target = tmp_path / "disk.img"
    result = await _layer_import(layer(members), target)
    assert result.succeeded, result
    assert list(result.format_chain) == ["gz", "tar", "qcow2"]
    assert same_content(target, image.reference)
    assert sorted(os.listdir(tmp_path)) == ["disk.img"], "nothing else is extracted"


@pytest.mark.parametrize(
    ("members", "reason", "words"),
    [
        (
            {"disk/a.qcow2": b"x" * 1000, "disk/b.img": b"y" * 1000},
            "InvalidImage",
            ["2 files under disk/", "disk/a.qcow2", "disk/b.img"],
        ),
        ({"etc/hostname": b"h", "disk/": None}, "InvalidImage", ["no file under disk/"]),
        ({"disk/sub/": None, "disk/sub/x.img": b"x"}, "UnsafeImage", ["disk/sub", "not a file"]),
    ],
    ids=["two-disks", "no-disk", "a-directory"],
)
async def test_registry_layer_without_exactly_one_disk_is_refused(
    members: dict[str, bytes | None], reason: str, words: list[str], tmp_path: Path
) -> None:
    target = tmp_path / "disk.img"
    result = await _layer_import(layer(members), target)
    assert result.reason == reason, result
    for word in words:
        assert word in result.message, result.message
    assert not target.exists()


async def test_filesystem_clone_is_extracted_with_the_archive_rules(tmp_path: Path) -> None:
    volume = tmp_path / "volume"
    tree = layer({"data/": None, "data/a.txt": b"alpha", "b.bin": bytes(5000)}, compress=False)
    result = await process_body(
        OneShotBody(tree), volume, content_type=ContentType.FILESYSTEM_CLONE
    )
    assert result.succeeded, result
    assert (volume / "data" / "a.txt").read_bytes() == b"alpha"
    assert (volume / "b.bin").read_bytes() == bytes(5000)
    escape = layer({"../outside.txt": b"x"}, compress=False)
    other = tmp_path / "other"
    result = await process_body(
        OneShotBody(escape), other, content_type=ContentType.FILESYSTEM_CLONE
    )
    assert result.reason == "UnsafeImage", result
    assert not (tmp_path / "outside.txt").exists()
