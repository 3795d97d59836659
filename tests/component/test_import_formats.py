"""Every supported format and compression, over loopback HTTP, byte-identical to qemu-img."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.component.conftest import (
    COMPRESSORS,
    CONVERSIONS,
    VIRTUAL,
    ImageFactory,
    Server,
    allocated,
    same_content,
)
from tests.component.helpers import import_url

MATRIX = [(kind, None) for kind in CONVERSIONS] + [
    (kind, comp) for kind in ("raw", "qcow2", "vmdk", "vdi", "vhd", "vhdx") for comp in COMPRESSORS
]


@pytest.mark.parametrize(("kind", "compression"), MATRIX)
async def test_import_is_identical_to_qemu_img_and_sparse(
    kind: str, compression: str | None, images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make(kind, compression)
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    result = await import_url(server.link("ok", image.path), target)
    assert result.succeeded, result
    assert same_content(target, image.reference)
    assert target.stat().st_size == image.reference.stat().st_size
    assert allocated(target) <= allocated(image.reference)
    expected_chain = ([compression.rstrip("1")] if compression else []) + [
        {"vhd": "vpc", "raw": "raw"}.get(kind, kind.split("-")[0])
    ]
    assert list(result.format_chain) == expected_chain
    assert result.bytes_read == image.path.stat().st_size
    assert result.scratch_used == (kind in ("vhd", "vhdx")), "only vhd/vhdx go through scratch"
    assert not list(target.parent.glob(".cdi-scratch/*")), "scratch left behind"


async def test_local_file_source(images: ImageFactory, tmp_path: Path) -> None:
    image = images.make("qcow2", "zst")
    target = tmp_path / "disk.img"
    result = await import_url(str(image.path), target, size=64 * 1024 * 1024)
    assert result.succeeded, result
    assert target.stat().st_size == 64 * 1024 * 1024  # grown to the requested size
    assert same_content(target, image.reference, VIRTUAL)
    with open(target, "rb") as fh:
        fh.seek(VIRTUAL)
        assert fh.read() == bytes(32 * 1024 * 1024)


async def test_multi_member_gzip_and_nested_compression(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """pigz/bgzip write several members; a .gz inside a .zst is peeled layer by layer."""
    import subprocess

    raw = images.make("raw")
    half = raw.reference.stat().st_size // 2
    data = raw.reference.read_bytes()
    multi = tmp_path / "multi.raw.gz"
    with open(multi, "wb") as out:
        for part in (data[:half], data[half:]):
            out.write(
                subprocess.run(
                    ["gzip", "-1", "-c"], input=part, capture_output=True, check=True
                ).stdout
            )
    nested = tmp_path / "nested.raw.gz.zst"
    nested.write_bytes(
        subprocess.run(["zstd", "-q", "-c", str(multi)], capture_output=True, check=True).stdout
    )
    for path, chain in ((multi, ["gz", "raw"]), (nested, ["zst", "gz", "raw"])):
        target = tmp_path / f"{path.name}.img"
        result = await import_url(server.link("ok", path), target)
        assert result.succeeded, result
        assert list(result.format_chain) == chain
        assert same_content(target, raw.reference)


async def test_qcow2_streams_without_scratch(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("qcow2-compressed", "xz")
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    result = await import_url(server.link("ok", image.path), target)
    assert result.succeeded and not result.scratch_used
    assert list(result.format_chain) == ["xz", "qcow2"]
    assert same_content(target, image.reference)


async def test_disordered_qcow2_spills_to_scratch_and_says_so(
    server: Server, tmp_path: Path
) -> None:
    """L1 moved after all the data (a resize): beyond a small in-memory bound the data waits
    in a scratch spill file, still in one download, and the result reports scratch_used."""

    from importer.runner import run_import
    from tests.component.conftest import run
    from tests.component.helpers import http_config

    image = tmp_path / "moved.qcow2"
    # Larger than one 4 MiB source chunk, so the data cannot all be seen with its table.
    run("qemu-img", "create", "-f", "qcow2", "-o", "cluster_size=4096", image, "16M")
    run("qemu-io", "-c", "write -P 7 0 12M", image)
    run("qemu-img", "resize", image, "256M")  # grows L1: the new table lands after the data
    reference = tmp_path / "ref.raw"
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", image, reference)
    target = tmp_path / "disk.img"
    config = http_config(server.link("ok", image), target, spill_limit=64 * 1024)
    result = await run_import(config)
    assert result.succeeded, result
    assert result.scratch_used and 0 < result.scratch_bytes < image.stat().st_size
    assert [r[0] for r in server.recorder.requests].count("GET") == 1
    assert same_content(target, reference)
