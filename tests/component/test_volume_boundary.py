"""The volume is the boundary: names a tenant planted in the volume (a symlink or FIFO called
disk.img, a .cdi-scratch link, a checkpoint link) never redirect or stall the importer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.api.errors import TargetError
from datapath import TargetSpec, checkpoint
from datapath.target import open_target
from tests.component.conftest import VIRTUAL, ImageFactory, Server, same_content
from tests.component.helpers import import_url

SIZE = 64 << 20


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the volume that a planted link points at; it must stay untouched."""
    path = tmp_path / "outside" / "secret"
    path.parent.mkdir()
    path.write_bytes(b"do not touch")
    return path


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    path = tmp_path / "vol"
    path.mkdir()
    return path


async def test_a_disk_img_symlink_is_replaced_not_followed(
    images: ImageFactory, server: Server, volume: Path, outside: Path
) -> None:
    image = images.make("qcow2")
    os.symlink(outside, volume / "disk.img")
    result = await import_url(server.link("ok", image.path), volume / "disk.img", size=SIZE)
    assert result.succeeded, result.message
    assert outside.read_bytes() == b"do not touch"
    assert not os.path.islink(volume / "disk.img")
    assert same_content(volume / "disk.img", image.reference, VIRTUAL)


def test_a_fifo_planted_as_disk_img_neither_hangs_nor_is_written(volume: Path) -> None:
    os.mkfifo(volume / "disk.img")
    fd, _ = open_target(TargetSpec(path=str(volume / "disk.img"), block=False, size=SIZE))
    os.close(fd)
    assert (volume / "disk.img").is_file()


def test_resuming_never_reopens_a_symlinked_target(volume: Path, outside: Path) -> None:
    os.symlink(outside, volume / "disk.img")
    with pytest.raises(TargetError, match="not a regular file"):
        open_target(TargetSpec(path=str(volume / "disk.img"), block=False), truncate=False)
    assert outside.read_bytes() == b"do not touch"


async def test_a_scratch_folder_symlink_is_not_followed(
    images: ImageFactory, server: Server, volume: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, volume / ".cdi-scratch")
    image = images.make("vhdx")  # staged in scratch for qemu-img
    result = await import_url(server.link("ok", image.path), volume / "disk.img", size=SIZE)
    assert result.succeeded and result.scratch_used, result.message
    assert list(elsewhere.iterdir()) == []
    assert same_content(volume / "disk.img", image.reference, VIRTUAL)


def test_checkpoint_files_are_never_written_or_read_through_links(
    volume: Path, outside: Path
) -> None:
    path = str(volume / ".cdi-import-checkpoint")
    os.symlink(outside, path + ".tmp")
    checkpoint.save(path, checkpoint.Checkpoint("http://x/y", 10, "etag", 4))
    assert outside.read_bytes() == b"do not touch"
    assert checkpoint.load(path) == checkpoint.Checkpoint("http://x/y", 10, "etag", 4)
    os.unlink(path)
    os.symlink(outside, path)
    assert checkpoint.load(path) is None  # a link is no checkpoint: start over
