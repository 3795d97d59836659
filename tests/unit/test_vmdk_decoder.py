"""Pure tests of the streaming VMDK decoder on tiny hand-built sparse extents (no qemu).

They pin the header checks (qemu's vmdk_open_vmdk4 rules), the refusal of every subformat
whose data lives in other files, grain placement through the primary grain directory,
zeroed-grain entries as holes, compressed grains behind markers (bounded inflate, LBA check),
the streaming rules (any chunking; tables after grains ask for scratch) and, with hypothesis,
that mutated images only ever fail with our typed errors.
"""

from __future__ import annotations

import random
import struct
import zlib

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
from datapath.decode.vmdk import VmdkStreamDecoder, inflate_grain, parse_header
from datapath.formats import ImageFormat, sniff
from tests.unit.disk_builders import VmdkSpec, build_vmdk
from tests.unit.stream_decoding import decode_stream

GRAIN = 4096


def grain(seed: int) -> bytes:
    return random.Random(seed).randbytes(GRAIN)


def sample(**changes: object) -> VmdkSpec:
    spec = VmdkSpec(
        capacity=61,  # sectors: not a whole number of grains or of grain tables
        grains={0: grain(1), 3: b"\x05" * 100, 7: grain(2), 4: bytes(GRAIN)},
        zeroed={5},
        order=[7, 0, 4, 3],
    )
    for name, value in changes.items():
        setattr(spec, name, value)
    return spec


def expected(spec: VmdkSpec) -> bytes:
    disk = bytearray(spec.capacity * 512)
    for index, data in spec.grains.items():
        start = index * GRAIN
        piece = data[: max(0, len(disk) - start)]
        disk[start : start + len(piece)] = piece
    return bytes(disk)


def decode(image: bytes, chunks: int | list[int] = 65536, **kwargs: int) -> bytes:
    return decode_stream(VmdkStreamDecoder(**kwargs), image, chunks)


@pytest.mark.parametrize("compressed", [False, True])
@pytest.mark.parametrize("chunk", [7, 1000, 65536])
def test_grains_land_at_their_virtual_offsets(compressed: bool, chunk: int) -> None:
    spec = sample(compressed=compressed)
    assert decode(build_vmdk(spec), chunk) == expected(spec)


def test_descriptor_files_are_sniffed_as_vmdk_and_refused_with_their_extents() -> None:
    text = (
        b'# Disk DescriptorFile\nversion=1\nCID=1\nparentCID=ffffffff\ncreateType="monolithicFlat"'
        b'\n\nRW 16384 FLAT "disk-flat.vmdk" 0\n'
    )
    assert sniff(text) is ImageFormat.VMDK
    with pytest.raises(UnsafeImage, match=r"monolithicFlat.*'disk-flat.vmdk'.*file system"):
        parse_header(text)
    with pytest.raises(UnsafeImage, match="extent"):
        decode(text)


def test_header_deferring_to_a_descriptor_is_unsafe() -> None:
    image = bytearray(build_vmdk(sample()))
    struct.pack_into("<Q", image, 12, 0)  # capacity 0 + a descriptor offset: qemu follows it
    with pytest.raises(UnsafeImage, match="descriptor"):
        decode(bytes(image))


def test_parent_file_name_hint_is_a_backing_file() -> None:
    spec = sample(descriptor=b'# Disk DescriptorFile\nCID=1\nparentFileNameHint="/etc/x.vmdk"\n')
    with pytest.raises(UnsafeImage, match="parent"):
        decode(build_vmdk(spec))


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "error", "words"),
    [
        (0, "<I", 0x12345678, InvalidImage, "magic"),
        (4, "<I", 4, UnsupportedFormat, "version 4"),
        (44, "<I", 1024, InvalidImage, "grain table size"),
        (44, "<I", 0, InvalidImage, "grain table size"),
        (20, "<Q", 0, InvalidImage, "granularity"),
        (20, "<Q", 0x200001, InvalidImage, "granularity"),
        (12, "<Q", 1 << 50, InvalidImage, "absurd"),
        (77, "<H", 2, UnsupportedFormat, "compression"),
        (74, "<B", ord("x"), InvalidImage, "newline"),
        (56, "<Q", 0, InvalidImage, "overlaps the header"),
        (12, "<Q", 1 << 40, UnsafeImage, "grain tables"),
    ],
)
def test_bad_headers_are_refused_with_the_reason(
    offset: int, fmt: str, value: int, error: type[WorkerError], words: str
) -> None:
    image = bytearray(build_vmdk(sample()))
    struct.pack_into(fmt, image, offset, value)
    with pytest.raises(error, match=words):
        decode(bytes(image))


def test_virtual_size_beyond_the_target_is_insufficient_space() -> None:
    with pytest.raises(InsufficientSpace):
        decode(build_vmdk(sample()), max_virtual_size=61 * 512 - 1)


def _gte_offset(image: bytes, index: int) -> int:
    """File offset of grain table entry ``index`` (primary directory)."""
    gd = struct.unpack_from("<Q", image, 56)[0] * 512
    gt = struct.unpack_from("<I", image, gd + index // 4 * 4)[0] * 512
    return gt + index % 4 * 4


def test_grain_outside_the_file_is_unsafe_when_the_size_is_known() -> None:
    image = bytearray(build_vmdk(sample()))
    struct.pack_into("<I", image, _gte_offset(image, 3), len(image) // 512 + 10)
    with pytest.raises(UnsafeImage, match="outside the file"):
        decode(bytes(image), file_size=len(image))
    with pytest.raises(InvalidImage, match="never arrived"):
        decode(bytes(image))


def test_two_grains_on_one_place_are_invalid() -> None:
    image = bytearray(build_vmdk(sample(order=[0, 3])))
    struct.pack_into(
        "<I",
        image,
        _gte_offset(image, 3),
        struct.unpack_from("<I", image, _gte_offset(image, 0))[0],
    )
    with pytest.raises(InvalidImage, match="overlaps"):
        decode(bytes(image))


def test_grain_inside_the_metadata_asks_for_scratch() -> None:
    image = bytearray(build_vmdk(sample()))
    struct.pack_into("<I", image, _gte_offset(image, 3), 1)  # sector 1, no zeroed-grain flag
    image[8] &= ~0x4
    with pytest.raises(LayoutNotStreamable):
        decode(bytes(image))


def test_tables_after_the_grains_ask_for_scratch() -> None:
    with pytest.raises(LayoutNotStreamable):
        decode(build_vmdk(sample(grains_first=True)))


def test_directory_only_in_the_footer_asks_for_scratch() -> None:
    with pytest.raises(LayoutNotStreamable, match="footer"):
        decode(build_vmdk(sample(compressed=True, gd_at_end=True)))


def test_compressed_grain_with_a_wrong_lba_is_invalid() -> None:
    image = bytearray(build_vmdk(sample(compressed=True, order=[0])))
    start = struct.unpack_from("<I", image, _gte_offset(image, 0))[0] * 512
    struct.pack_into("<Q", image, start, 99)
    with pytest.raises(InvalidImage, match="LBA 99"):
        decode(bytes(image))


def test_compressed_grain_output_is_bounded_by_the_grain() -> None:
    with pytest.raises(InvalidImage, match="beyond"):
        inflate_grain(zlib.compress(bytes(10 * GRAIN)), GRAIN)
    with pytest.raises(InvalidImage, match="truncated"):
        inflate_grain(zlib.compress(grain(3))[:-10], GRAIN)
    with pytest.raises(InvalidImage, match="corrupt"):
        inflate_grain(b"\x00" * 40, GRAIN)
    assert inflate_grain(zlib.compress(grain(3)), GRAIN) == grain(3)


def test_short_compressed_grain_inside_the_disk_is_invalid() -> None:
    spec = sample(compressed=True, order=[0], grains={0: b"\x01" * 100})
    image = bytearray(build_vmdk(spec))
    start = struct.unpack_from("<I", image, _gte_offset(image, 0))[0] * 512
    packed = zlib.compress(b"\x01" * 100)
    image[start + 8 : start + 12 + len(packed)] = struct.pack("<I", len(packed)) + packed
    with pytest.raises(InvalidImage, match="holds only"):
        decode(bytes(image))


def test_truncated_streams_are_invalid() -> None:
    for compressed in (False, True):
        image = build_vmdk(sample(compressed=compressed))
        for cut in (3, 300, 600, 2000, len(image) - 2 * GRAIN):
            with pytest.raises(InvalidImage):
                decode(image[:cut])


SEEDS = [build_vmdk(sample()), build_vmdk(sample(compressed=True))]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.sampled_from(range(len(SEEDS))),
    flips=st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=8),
    chunk=st.integers(1, 5000),
)
def test_mutated_images_fail_only_with_typed_errors(seed: int, flips, chunk: int) -> None:
    image = bytearray(SEEDS[seed])
    for position, value in flips:
        # Bias towards the header and tables at the front, where mutations are interesting.
        image[position % min(len(image), 4096 if position & 1 else len(image))] = value
    try:
        decode(bytes(image), chunk, max_virtual_size=1 << 30)
    except WorkerError:
        pass


@settings(max_examples=200, deadline=None)
@given(tail=st.binary(min_size=0, max_size=700))
def test_header_parser_on_arbitrary_bytes(tail: bytes) -> None:
    try:
        parse_header(b"KDMV" + tail)
    except WorkerError:
        pass
