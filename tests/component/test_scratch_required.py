"""A block target without writable scratch space (issue 27): the importer says
``scratchSpaceRequired`` (CDI's ``Scratch space required``) exactly when the source needs staging
(vhdx; a qcow2 too disordered for the in-memory spill), and never for a streamable image. Real
loop devices, a real read-only mount where ``/scratch`` would be, real qemu-img."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.api.errors import ScratchSpaceRequired
from tests.component.conftest import ImageFactory, MiB, Server, run
from tests.component.helpers import import_url


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a read-only filesystem: what a pod with a read-only root sees at
    ``/scratch`` when no volume is mounted there (root ignores file modes, not ``ro``)."""
    where = tmp_path / "ro"
    where.mkdir()
    run("mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", where)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=False)


def disordered_qcow2(d: Path) -> Path:
    """12 MiB of data before the L1 table that maps it (a resize moved the table)."""
    image = d / "moved.qcow2"
    run("qemu-img", "create", "-f", "qcow2", "-o", "cluster_size=4096", image, "16M")
    run("qemu-io", "-c", "write -P 7 0 12M", image)
    run("qemu-img", "resize", image, "40M")
    return image


async def test_vhdx_into_block_without_scratch_asks_for_scratch(
    images: ImageFactory, server: Server, loopdev: str, read_only_dir: Path
) -> None:
    image = images.make("vhdx")
    result = await import_url(
        server.link("ok", image.path), loopdev, block=True, scratch_dir=str(read_only_dir)
    )
    assert not result.succeeded
    assert result.scratch_space_required and result.reason == ScratchSpaceRequired.reason
    assert result.message.startswith("scratch space required and none found"), result.message
    assert not result.transient  # the controller's answer is a scratch claim, not a retry


async def test_streamable_qcow2_into_block_needs_no_scratch(
    images: ImageFactory, server: Server, loopdev: str, read_only_dir: Path
) -> None:
    image = images.make("qcow2")
    result = await import_url(
        server.link("ok", image.path), loopdev, block=True, scratch_dir=str(read_only_dir)
    )
    assert result.succeeded, result
    assert not result.scratch_space_required and not result.scratch_used


async def test_disordered_qcow2_asks_only_past_the_memory_spill_and_then_imports(
    server: Server, loopdev: str, read_only_dir: Path, tmp_path: Path
) -> None:
    image = disordered_qcow2(tmp_path)
    url = server.link("ok", image)
    # within the in-memory spill bound: streamed, no scratch at all
    held = await import_url(url, loopdev, block=True, scratch_dir=str(read_only_dir))
    assert held.succeeded and not held.scratch_space_required, held
    # past it: scratch space is required ...
    asked = await import_url(
        url, loopdev, block=True, scratch_dir=str(read_only_dir), spill_limit=MiB
    )
    assert asked.scratch_space_required and not asked.succeeded, asked
    # ... and with a writable scratch folder (the scratch claim) the same import succeeds
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    done = await import_url(url, loopdev, block=True, scratch_dir=str(scratch), spill_limit=MiB)
    assert done.succeeded and done.scratch_used and not done.scratch_space_required, done
    reference = tmp_path / "ref.raw"
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", image, reference)
    with open(loopdev, "rb") as dev:
        assert dev.read(40 * MiB) == reference.read_bytes()
    assert not list(scratch.iterdir()), "scratch left behind"


async def test_vhdx_into_block_with_scratch_matches_qemu_img(
    images: ImageFactory, server: Server, loopdev: str, tmp_path: Path
) -> None:
    """With scratch space (the scratch claim) the staged vhdx is converted onto the device: the
    target is reopened as the block device it is, not as a file (it used to fail there)."""
    image = images.make("vhdx")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = await import_url(
        server.link("ok", image.path), loopdev, block=True, scratch_dir=str(scratch)
    )
    assert result.succeeded and result.scratch_used, result
    reference = image.reference.read_bytes()
    with open(loopdev, "rb") as dev:
        assert dev.read(len(reference)) == reference
    assert not list(scratch.iterdir()), "scratch left behind"
