"""Real targets: loop block devices, blank disks, preallocation, filesystem overhead."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.api.termination import TerminationMessage
from datapath.target import TargetSpec, usable_space
from importer.config import BlankOptions, ImportConfig, WorkerEdges, build_plan
from importer.runner import run_import
from tests.component.conftest import VIRTUAL, ImageFactory, MiB, Server, allocated, same_content
from tests.component.helpers import import_url


def _device_bytes(dev: str, length: int) -> bytes:
    fd = os.open(dev, os.O_RDONLY)
    try:
        return os.pread(fd, length, 0)
    finally:
        os.close(fd)


@pytest.mark.parametrize(("kind", "comp"), [("raw", "gz"), ("qcow2", "xz"), ("vmdk", None)])
async def test_block_device_gets_the_image_and_zeroes_stale_data(
    kind: str,
    comp: str | None,
    images: ImageFactory,
    server: Server,
    loopdev: str,
    tmp_path: Path,
) -> None:
    image = images.make(kind, comp)
    result = await import_url(
        server.link("ok", image.path), loopdev, block=True, scratch_dir=str(tmp_path / "scratch")
    )
    assert result.succeeded, result
    # The device was full of 0xAA: every byte of the image range must now match, zeros too.
    assert _device_bytes(loopdev, VIRTUAL) == image.reference.read_bytes()


async def test_block_device_too_small_is_refused(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    from tests.component.conftest import loop_device

    image = images.make("qcow2")
    with loop_device(tmp_path / "small.img", 8 * MiB) as dev:
        result = await import_url(
            server.link("ok", image.path), dev, block=True, scratch_dir=str(tmp_path)
        )
        assert result.reason == "InsufficientSpace"
        assert _device_bytes(dev, MiB) == b"\xaa" * MiB  # untouched


async def test_blank_file_is_sparse_and_sized(tmp_path: Path) -> None:
    target = tmp_path / "disk.img"
    source = BlankOptions()
    config = ImportConfig(
        plan=build_plan(source, TargetSpec(str(target), False, size=256 * MiB), scratch_dir=None),
        source=source,
        edges=WorkerEdges(termination_path=str(tmp_path / "term")),
    )
    result = await run_import(config)
    assert result.succeeded
    assert target.stat().st_size == 256 * MiB
    assert allocated(target) == 0
    on_disk = TerminationMessage.from_json((tmp_path / "term").read_text())
    assert on_disk == result


async def test_preallocation_allocates_everything(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw", "zst")
    target = tmp_path / "disk.img"
    config_result = await import_url(server.link("ok", image.path), target, size=48 * MiB)
    assert config_result.succeeded
    from tests.component.helpers import http_config, with_target

    cfg = with_target(
        http_config(server.link("ok", image.path), tmp_path / "p.img", size=48 * MiB),
        preallocate=True,
    )
    result = await run_import(cfg)
    assert result.succeeded and result.preallocation_applied
    assert (tmp_path / "p.img").stat().st_blocks * 512 >= 48 * MiB
    assert same_content(tmp_path / "p.img", target)


def test_usable_space_matches_cdi_rounding() -> None:
    assert usable_space(10 * 1024 * MiB, 0.055) == 9676 * MiB  # floor(10240 * 0.945) MiB
    assert usable_space(10 * 1024 * MiB, 0.0) == 10 * 1024 * MiB
