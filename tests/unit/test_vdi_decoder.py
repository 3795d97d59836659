"""Pure tests of the streaming VDI decoder on tiny hand-built images (no qemu involved).

They pin the header checks (qemu's vdi_open rules), the block map inversion (physical order
differs from virtual order), holes for unallocated and zero blocks, the streaming rules (any
chunking; a map after the data asks for scratch) and, with hypothesis, that mutated images
only ever fail with our typed errors.
"""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cdi.api.errors import (
    InsufficientSpace,
    InvalidImage,
    UnsafeImage,
    UnsupportedFormat,
    WorkerError,
)
from datapath.decode.rawpieces import LayoutNotStreamable
from datapath.decode.vdi import VdiStreamDecoder, parse_header
from tests.unit.disk_builders import MiB, VdiSpec, build_vdi
from tests.unit.stream_decoding import decode_stream


def block(seed: int) -> bytes:
    rng = random.Random(seed)
    # Random data with a zero page inside, so zero skipping inside a block is exercised too.
    return rng.randbytes(300_000) + bytes(8192) + rng.randbytes(100_000)


def sample() -> VdiSpec:
    return VdiSpec(
        disk_size=4 * MiB + 1000,  # odd size: the last block is partly outside the disk
        blocks={0: block(1), 2: block(2), 4: b"\x7f" * 4096},
        zero={3},
        order=[4, 0, 2],  # written out of order, as a VM fills a dynamic image
    )


def expected(spec: VdiSpec) -> bytes:
    size = -(-spec.disk_size // 512) * 512
    disk = bytearray(size)
    for virt, data in spec.blocks.items():
        chunk = data[: max(0, size - virt * MiB)]
        disk[virt * MiB : virt * MiB + len(chunk)] = chunk
    return bytes(disk)


def decode(image: bytes, chunks: int | list[int] = 65536, **kwargs: int) -> bytes:
    return decode_stream(VdiStreamDecoder(**kwargs), image, chunks)


@pytest.mark.parametrize("chunk", [1000, 65536, 4 * MiB])
def test_blocks_land_at_their_virtual_offsets_whatever_the_chunking(chunk: int) -> None:
    spec = sample()
    assert decode(build_vdi(spec), chunk) == expected(spec)


def test_virtual_size_is_rounded_up_to_sectors_like_qemu() -> None:
    decoder = VdiStreamDecoder()
    decode_stream(decoder, build_vdi(sample()))
    assert decoder.virtual_size == 4 * MiB + 1024


def test_static_image_with_zero_blocks_writes_no_zero_pages() -> None:
    spec = VdiSpec(disk_size=2 * MiB, blocks={0: bytes(MiB), 1: b"\x01" * 10})
    assert decode(build_vdi(spec)) == expected(spec)


def test_empty_disk_decodes_to_holes() -> None:
    assert decode(build_vdi(VdiSpec(disk_size=2 * MiB))) == bytes(2 * MiB)


def _patched(offset: int, fmt: str, value: int) -> bytes:
    image = bytearray(build_vdi(sample()))
    struct.pack_into(fmt, image, offset, value)
    return bytes(image)


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "error", "words"),
    [
        (0x40, "<I", 0x12345678, InvalidImage, "signature"),
        (0x44, "<I", 0x00010000, UnsupportedFormat, "version 1.0"),
        (0x154, "<I", 513, UnsupportedFormat, "aligned"),
        (0x158, "<I", 1000, UnsupportedFormat, "aligned"),
        (0x168, "<I", 4096, UnsupportedFormat, "sector size"),
        (0x178, "<I", 2 * MiB, UnsupportedFormat, "block size"),
        (0x170, "<Q", 100 * MiB, InvalidImage, "covers"),
        (0x180, "<I", 0x40000000, UnsupportedFormat, "blocks"),
        (0x154, "<I", 0, InvalidImage, "header"),
    ],
)
def test_bad_headers_are_refused_with_the_reason(
    offset: int, fmt: str, value: int, error: type[WorkerError], words: str
) -> None:
    with pytest.raises(error, match=words):
        decode(_patched(offset, fmt, value))


def test_block_map_running_into_the_data_is_invalid() -> None:
    image = bytearray(build_vdi(VdiSpec(disk_size=200 * MiB)))  # an 800-byte map at 512
    struct.pack_into("<I", image, 0x158, 1024)
    with pytest.raises(InvalidImage, match="runs into the data"):
        decode(bytes(image))


def test_differencing_image_is_unsafe() -> None:
    with pytest.raises(UnsafeImage, match="parent"):
        decode(build_vdi(VdiSpec(parent=True)))


def test_virtual_size_beyond_the_target_is_insufficient_space() -> None:
    with pytest.raises(InsufficientSpace):
        parse_header(build_vdi(sample()), max_virtual_size=4 * MiB)
    with pytest.raises(InsufficientSpace):
        decode(build_vdi(sample()), max_virtual_size=MiB)


def test_map_entry_past_the_image_blocks_is_invalid() -> None:
    image = bytearray(build_vdi(sample()))
    struct.pack_into("<I", image, 512 + 4, 1000)
    with pytest.raises(InvalidImage, match="past the image"):
        decode(bytes(image))


def test_block_outside_the_file_is_unsafe_when_the_size_is_known() -> None:
    image = bytearray(build_vdi(sample()))
    struct.pack_into("<I", image, 512 + 4, 4)  # the 5th physical block does not exist
    with pytest.raises(UnsafeImage, match="outside the file"):
        decode(bytes(image), file_size=len(image))
    with pytest.raises(InvalidImage, match="never arrived"):
        decode(bytes(image))


def test_two_virtual_blocks_on_one_physical_block_are_invalid() -> None:
    image = bytearray(build_vdi(sample()))
    struct.pack_into("<I", image, 512 + 8, 0)  # block 2 -> physical 0, like block 4
    with pytest.raises(InvalidImage, match="overlaps"):
        decode(bytes(image))


def test_truncated_streams_are_invalid() -> None:
    image = build_vdi(sample())
    for cut in (0, 100, 511, 600, len(image) - MiB, len(image) - 1):
        with pytest.raises(InvalidImage):
            decode(image[:cut] if cut else b"\0")


def test_block_map_after_the_data_asks_for_scratch() -> None:
    with pytest.raises(LayoutNotStreamable):
        decode(build_vdi(VdiSpec(blocks={0: b"x"}, map_after_data=True)))


SEED = build_vdi(
    VdiSpec(disk_size=3 * MiB, blocks={0: b"\x11" * 5000, 2: b"\x22" * 3000}, order=[2, 0])
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    flips=st.lists(st.tuples(st.integers(0, 2047), st.integers(0, 255)), max_size=8),
    chunk=st.integers(512, 300_000),
)
def test_mutated_headers_and_maps_fail_only_with_typed_errors(flips, chunk: int) -> None:
    image = bytearray(SEED)
    for position, value in flips:
        image[position] = value  # the header and the block map
    try:
        decode(bytes(image), chunk, max_virtual_size=64 * MiB)
    except WorkerError:
        pass


@settings(max_examples=200, deadline=None)
@given(tail=st.binary(min_size=0, max_size=600))
def test_header_parser_on_arbitrary_bytes(tail: bytes) -> None:
    data = bytearray(SEED[:0x40]) + b"\x7f\x10\xda\xbe" + tail
    try:
        parse_header(bytes(data))
    except WorkerError:
        pass
