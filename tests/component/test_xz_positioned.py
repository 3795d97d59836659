"""Multi-block .xz holding a raw image: blocks decoded on several threads, each written in place.

The images come from ``xz -T2 --block-size=4MiB`` (eight blocks for the 32 MiB test disk).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cdi.api.constants import ContentType
from cdi.api.errors import InsufficientSpace
from datapath.decode import DecodePlan, DecodeResult, decode_into
from datapath.decode.xz_parallel import STREAM_HEADER, XzBlocks
from datapath.streams import rechunk
from datapath.target import RawWriter
from tests.component.conftest import (
    VIRTUAL,
    ImageFactory,
    MiB,
    Server,
    allocated,
    loop_device,
    same_content,
)
from tests.component.helpers import import_url


def _xz(data_path: Path, out: Path, block_size: str = "4MiB") -> None:
    with open(out, "wb") as fh:
        subprocess.run(
            ["xz", "-T2", "-1", f"--block-size={block_size}", "-c", str(data_path)],
            stdout=fh,
            check=True,
        )


def _block_spans(xz_file: Path) -> list[tuple[int, int]]:
    """(file offset, length) of each block of a one-stream .xz file."""
    spans, at = [], STREAM_HEADER
    for block in XzBlocks(iter([xz_file.read_bytes()])).blocks():
        length = sum(len(part) for part in block.parts)
        spans.append((at, length))
        at += length
    return spans


async def test_multi_block_raw_xz_lands_in_place_identical_and_sparse(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw", "xz")
    assert len(_block_spans(image.path)) == VIRTUAL // (4 * MiB)
    target = tmp_path / "disk.img"
    result = await import_url(server.link("ok", image.path), target)
    assert result.succeeded, result
    assert list(result.format_chain) == ["xz", "raw"]
    assert result.virtual_size == VIRTUAL
    assert same_content(target, image.reference)
    assert allocated(target) <= allocated(image.reference)
    assert result.bytes_written == allocated(target)  # every lane's writes counted, once


async def test_multi_block_raw_xz_overwrites_every_stale_byte_of_a_block_device(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw", "xz")
    with loop_device(tmp_path / "block.img", 48 * MiB) as dev:  # full of 0xAA
        result = await import_url(
            server.link("ok", image.path), dev, block=True, scratch_dir=str(tmp_path / "s")
        )
        assert result.succeeded, result
        fd = os.open(dev, os.O_RDONLY)
        try:
            written = os.pread(fd, VIRTUAL, 0)
        finally:
            os.close(fd)
    assert written == image.reference.read_bytes()  # the zero runs too


async def test_corrupt_block_in_the_middle_fails_and_is_never_complete(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw", "xz")
    spans = _block_spans(image.path)
    at, length = spans[len(spans) // 2]
    data = bytearray(image.path.read_bytes())
    data[at + length // 2] ^= 0x55  # inside the compressed data, not a header
    bad = tmp_path / "bad.raw.xz"
    bad.write_bytes(bytes(data))
    target = tmp_path / "disk.img"
    result = await import_url(server.link("ok", bad), target)
    assert result.reason == "InvalidImage", result
    assert not result.succeeded
    assert not target.exists()  # nothing half-written is left looking like a disk


async def test_bomb_of_blocks_larger_than_the_target_is_refused(
    server: Server, tmp_path: Path
) -> None:
    zeros = tmp_path / "zeros.raw"
    with open(zeros, "wb") as fh:
        fh.truncate(256 * MiB)
    bomb = tmp_path / "bomb.raw.xz"
    _xz(zeros, bomb)
    assert bomb.stat().st_size < MiB
    target = tmp_path / "disk.img"
    result = await import_url(server.link("ok", bomb), target, size=16 * MiB)
    assert result.reason == "InsufficientSpace", result
    assert not target.exists()


def test_block_past_the_usable_size_is_refused_before_any_of_it_is_written(
    tmp_path: Path,
) -> None:
    """The positioned path checks each block's declared end before decoding it: with room
    for 2.75 blocks of 2 MiB, the third block is not written at all (writing piece by piece,
    its first 1 MiB piece would fit and land)."""
    plain = tmp_path / "pattern.raw"
    plain.write_bytes(bytes(range(256)) * (8 * MiB // 256))  # no zero page: every byte written
    packed = tmp_path / "pattern.raw.xz"
    _xz(plain, packed, "2MiB")
    fd = os.open(tmp_path / "disk.img", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        writer = RawWriter(fd, 5 * MiB + MiB // 2, zero_fill=False, direct=True)
        plan = DecodePlan(ContentType.KUBEVIRT, writer.capacity, writer, None, str(tmp_path))
        with pytest.raises(InsufficientSpace):
            decode_into(rechunk(iter([packed.read_bytes()]), MiB), plan, DecodeResult())
        writer.close()
        assert os.fstat(fd).st_size <= 4 * MiB
    finally:
        os.close(fd)


async def test_qcow2_inside_multi_block_xz_still_decodes_in_order(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    packed = tmp_path / "disk.qcow2.xz"
    _xz(image.path, packed, "512KiB")
    assert len(_block_spans(packed)) > 1
    target = tmp_path / "disk.img"
    result = await import_url(server.link("ok", packed), target)
    assert result.succeeded, result
    assert list(result.format_chain) == ["xz", "qcow2"]
    assert same_content(target, image.reference)
