"""The streaming VDI and VMDK decoders against real qemu-img/qemu-io images, qemu-img as oracle.

Every image is built by qemu's own tools (converted from a raw disk with data islands, zero
pages and holes, or written out of order by qemu-io so physical order differs from virtual
order), fed to the decoder in several chunk sizes and assembled into a sparse file that must
be byte-identical to ``qemu-img convert -O raw`` and allocate no more. Then the whole importer
over loopback HTTP: these formats use no scratch space; subformats whose data lives in other
files, and images naming a parent, are refused with the reason; a layout that cannot stream
falls back to scratch + qemu-img and says so.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from datapath.decode.vdi import VdiStreamDecoder
from datapath.decode.vmdk import VmdkStreamDecoder
from tests.component.conftest import Server, allocated, same_content
from tests.component.helpers import import_url
from tests.component.image_matrix import (
    MiB,
    Recipe,
    assert_decodes_like_qemu_img,
    converted,
    oracle_of,
    run,
    written,
)

MATRIX: dict[str, tuple[str, Recipe]] = {
    "vdi-dynamic": ("vdi", converted("vdi")),
    "vdi-static": ("vdi", converted("vdi", "static=on")),
    "vdi-odd-size": ("vdi", converted("vdi", size=24 * MiB + 12345)),
    "vdi-written-unordered": ("vdi", written("vdi")),
    "vdi-static-written": ("vdi", written("vdi", "static=on")),
    "vmdk-sparse": ("vmdk", converted("vmdk")),
    "vmdk-sparse-odd-size": ("vmdk", converted("vmdk", size=24 * MiB + 12345)),
    "vmdk-stream-optimized": ("vmdk", converted("vmdk", "subformat=streamOptimized")),
    "vmdk-stream-optimized-odd-size": (
        "vmdk",
        converted("vmdk", "subformat=streamOptimized", size=5 * MiB + 1000),
    ),
    "vmdk-written-unordered": ("vmdk", written("vmdk")),
    "vmdk-zeroed-grains": ("vmdk", written("vmdk", "zeroed_grain=on", zero=True)),  # GTE 1
}
DECODERS = {"vdi": VdiStreamDecoder, "vmdk": VmdkStreamDecoder}


@pytest.fixture(scope="module", params=sorted(MATRIX))
def image_and_oracle(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    fmt, recipe = MATRIX[request.param]
    image = recipe(tmp_path_factory.mktemp(request.param))
    return request.param, fmt, image, oracle_of(fmt, image)


def test_decoded_image_matches_qemu_img_convert(image_and_oracle, tmp_path: Path) -> None:
    name, fmt, image, oracle = image_and_oracle
    size = image.stat().st_size
    assert_decodes_like_qemu_img(
        name, image, oracle, tmp_path, lambda: DECODERS[fmt](file_size=size)
    )


@pytest.mark.parametrize("name", ["vdi-written-unordered", "vmdk-stream-optimized", "vmdk-sparse"])
@pytest.mark.parametrize("compression", [None, "gz", "xz", "zst"])
async def test_import_streams_without_scratch(
    name: str, compression: str | None, server: Server, tmp_path: Path
) -> None:
    fmt, recipe = MATRIX[name]
    image = recipe(tmp_path)
    reference = tmp_path / "ref.raw"
    run("qemu-img", "convert", "-f", fmt, "-O", "raw", image, reference)
    if compression:
        tool = {"gz": "gzip", "xz": "xz", "zst": "zstd"}[compression]
        run(tool, "-q", "-k", "-1", image)
        image = image.with_name(f"{image.name}.{compression}")
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    result = await import_url(server.link("ok", image), target)
    assert result.succeeded, result
    assert not result.scratch_used
    assert list(result.format_chain) == ([compression] if compression else []) + [fmt]
    assert same_content(target, reference)
    assert allocated(target) <= allocated(reference)


@pytest.mark.parametrize(
    "subformat", ["monolithicFlat", "twoGbMaxExtentSparse", "twoGbMaxExtentFlat"]
)
async def test_vmdk_with_external_extents_is_refused_with_the_reason(
    subformat: str, server: Server, tmp_path: Path
) -> None:
    image = tmp_path / "desc.vmdk"
    run("qemu-img", "create", "-f", "vmdk", "-o", f"subformat={subformat}", image, "8M")
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    result = await import_url(server.link("ok", image), target)
    assert result.reason == "UnsafeImage", result
    assert subformat in result.message and "file system" in result.message
    assert "desc-" in result.message  # the extent file it names
    assert not target.exists()


async def test_vmdk_naming_a_parent_is_refused(server: Server, tmp_path: Path) -> None:
    base = tmp_path / "base.vmdk"
    run("qemu-img", "create", "-f", "vmdk", base, "8M")
    child = tmp_path / "child.vmdk"
    run("qemu-img", "create", "-f", "vmdk", "-b", base, "-F", "vmdk", child)
    target = tmp_path / "disk.img"
    result = await import_url(server.link("ok", child), target)
    assert result.reason == "UnsafeImage", result
    assert "parent" in result.message
    assert not target.exists()


@pytest.mark.parametrize("spill_limit", [64 * MiB, 4096])
async def test_vdi_with_its_block_map_after_the_data_converts_in_one_pass(
    spill_limit: int, server: Server, tmp_path: Path
) -> None:
    """Data before its table waits in the spill: in memory within the bound, past it in a
    scratch file holding only that data (and the importer says so); one GET either way."""
    image = converted("vdi", size=8 * MiB)(tmp_path)
    reference = tmp_path / "ref.raw"
    run("qemu-img", "convert", "-f", "vdi", "-O", "raw", image, reference)
    data = bytearray(image.read_bytes())
    bmap, offset_data = struct.unpack_from("<II", data, 0x154)
    map_bytes = data[bmap:offset_data]
    struct.pack_into("<I", data, 0x154, len(data))  # the map moves to the end of the file
    moved = tmp_path / "moved.vdi"
    moved.write_bytes(bytes(data) + map_bytes)
    target = tmp_path / "disk.img"
    result = await import_url(server.link("ok", moved), target, spill_limit=spill_limit)
    assert result.succeeded, result
    assert [r[0] for r in server.recorder.requests].count("GET") == 1
    assert result.scratch_used == (spill_limit == 4096)
    assert result.scratch_bytes < moved.stat().st_size
    assert (result.scratch_bytes > 0) == result.scratch_used
    assert same_content(target, reference)
