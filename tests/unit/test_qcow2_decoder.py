"""Pure tests of the streaming qcow2 decoder on tiny hand-built images (no qemu involved).

They pin the parsing rules (header vetting, L1/L2 bit layouts, compressed descriptors,
extended L2 bitmaps), the streaming machinery (any chunking, spill, out-of-order layouts),
the output contract (no overlapping writes, no all-zero writes, holes for zero clusters). What
every decoder owes (any chunking, truncation, corruption -> typed errors, qemu-img's bytes) is
pinned once for all formats in test_decoder_contract.py.
"""

from __future__ import annotations

import random
import struct

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi.api.errors import (
    InsufficientSpace,
    InvalidImage,
    UnsafeImage,
    UnsupportedFormat,
    WorkerError,
)
from datapath.decode.qcow2 import Qcow2StreamDecoder, SpillLimitExceeded, parse_header
from datapath.decode.qcow2.tables import _bit_ranges, compressed_extent
from datapath.decode.rawpieces import LayoutNotStreamable, WriteCoalescer, nonzero_pieces
from tests.unit.qcow2_builder import Spec, build
from tests.unit.stream_decoding import decode_stream


def cluster(seed: int, size: int = 512) -> bytes:
    return random.Random(seed).randbytes(size)


def decode(image: bytes, chunks: int | list[int] = 65536, **kwargs: int) -> bytes:
    """Feed ``image`` in the given chunking; return the raw disk, checking the write contract."""
    return decode_stream(Qcow2StreamDecoder(**kwargs), image, chunks)


def expected(spec: Spec) -> bytes:
    disk = bytearray(spec.virtual_size)
    for i, data in spec.data.items():
        if i not in spec.zero:
            disk[i * spec.cluster_size : (i + 1) * spec.cluster_size] = data
    return bytes(disk)


def sample_spec(**overrides: object) -> Spec:
    spec = Spec(**overrides)  # type: ignore[arg-type]
    n = spec.virtual_size // spec.cluster_size
    if not spec.data:
        picks = [0, 1, 2, 5, n // 2, n // 2 + 1, n - 1]
        spec.data = {i: cluster(i, spec.cluster_size) for i in picks}
    return spec


# -- header ----------------------------------------------------------------------------------


def header_bytes(**overrides: object) -> bytearray:
    return bytearray(build(sample_spec(**overrides))[:512])


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "error", "match"),
    [
        (0, ">4s", b"QFI\x00", InvalidImage, "magic"),
        (4, ">I", 1, UnsupportedFormat, "version"),
        (20, ">I", 8, InvalidImage, "cluster_bits"),
        (20, ">I", 22, InvalidImage, "cluster_bits"),
        (32, ">I", 2, UnsafeImage, "encrypted"),
        (36, ">I", 0x7FFFFFFF, UnsafeImage, "32 MiB"),
        (36, ">I", 0, InvalidImage, "too small"),
        (40, ">Q", 0, UnsafeImage, "overlaps the header"),
        (40, ">Q", 1000, InvalidImage, "offset"),
        (72, ">Q", 1 << 5, UnsafeImage, "unknown incompatible"),
        (72, ">Q", 1 << 2, UnsafeImage, "external data file"),
        (72, ">Q", 1 << 1, InvalidImage, "corrupt"),
        (72, ">Q", 1 << 3, InvalidImage, "compression"),
        (72, ">Q", 1 << 4, InvalidImage, "16 KiB"),
        (96, ">I", 7, InvalidImage, "refcount_order"),
        (100, ">I", 100, InvalidImage, "header_length"),
    ],
)
def test_header_field_is_vetted(offset, fmt, value, error, match) -> None:
    data = header_bytes()
    struct.pack_into(fmt, data, offset, value)
    with pytest.raises(error, match=match):
        parse_header(bytes(data))


def test_backing_file_is_refused() -> None:
    data = header_bytes()
    struct.pack_into(">QI", data, 8, 400, 5)
    data[400:405] = b"a.img"
    with pytest.raises(UnsafeImage, match="backing file"):
        parse_header(bytes(data))


def test_unknown_compression_type_is_unsupported() -> None:
    data = header_bytes()
    struct.pack_into(">Q", data, 72, 1 << 3)
    data[104] = 7
    with pytest.raises(UnsupportedFormat, match="compression type 7"):
        parse_header(bytes(data))


@pytest.mark.parametrize(("ext", "match"), [(0x44415441, "external data"), (0x0537BE77, "encr")])
def test_dangerous_header_extensions_are_refused(ext: int, match: str) -> None:
    data = header_bytes()
    struct.pack_into(">II", data, 112, 0xE2792ACA, 5)  # a harmless one first
    struct.pack_into(">II8s", data, 128, ext, 8, b"whatever")
    with pytest.raises(UnsafeImage, match=match):
        parse_header(bytes(data))


def test_virtual_size_over_the_target_is_insufficient_space() -> None:
    with pytest.raises(InsufficientSpace):
        parse_header(bytes(header_bytes()), max_virtual_size=4096)
    with pytest.raises(InsufficientSpace):
        decode(build(sample_spec()), max_virtual_size=4096)


def test_v2_and_v3_headers_parse() -> None:
    v2 = parse_header(bytes(header_bytes(version=2)))
    v3 = parse_header(bytes(header_bytes()))
    assert (v2.version, v2.header_length, v2.refcount_order) == (2, 72, 4)
    assert (v3.version, v3.cluster_size, v3.l2_entries) == (3, 512, 64)


# -- bit layouts -----------------------------------------------------------------------------


def test_compressed_descriptor_follows_qemu() -> None:
    # 64 KiB clusters: 54 offset bits, then an 8-bit count of extra sectors.
    entry = (1 << 62) | (3 << 54) | 0x10_0123
    assert compressed_extent(entry, 16) == (0x100123, 0x100000 + 4 * 512)


def test_subcluster_bit_ranges() -> None:
    assert _bit_ranges(0xFFFFFFFF) == [(0, 32)]
    assert _bit_ranges(0b1011_0001) == [(0, 1), (4, 6), (7, 8)]
    assert _bit_ranges(1 << 31) == [(31, 32)]


# -- decoding ----------------------------------------------------------------------------------


LAYOUTS = ["ordered", "data-first", "l1-last"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("version", [2, 3])
def test_round_trip_in_any_layout_and_one_byte_chunks(layout: str, version: int) -> None:
    spec = sample_spec(layout=layout, version=version)
    image = build(spec)
    for chunks in (1, 7, 513, len(image)):
        assert decode(image, chunks) == expected(spec)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("zstd", [False, True])
def test_compressed_clusters_round_trip(layout: str, zstd: bool) -> None:
    spec = sample_spec(layout=layout, zstd=zstd, cluster_bits=12, virtual_size=1 << 20)
    spec.data[7] = b"\x42" * 4096
    spec.data[8] = b"ab" * 2048
    spec.compressed = {0, 7, 8, 2}
    image = build(spec)
    for chunks in (1, 333, len(image)):
        assert decode(image, chunks) == expected(spec)


def test_zstd_cluster_may_span_several_frames() -> None:
    spec = sample_spec(zstd=True, zstd_frames=3, cluster_bits=12, virtual_size=1 << 20)
    spec.compressed = set(spec.data)
    assert decode(build(spec), 100) == expected(spec)


def test_zstd_frame_without_declared_size_is_bounded_and_decoded() -> None:
    spec = sample_spec(zstd=True, cluster_bits=12, virtual_size=1 << 20)
    image = bytearray(build(spec))
    header = parse_header(bytes(image[:4096]))
    payload = spec.data[5]
    writer = zstandard.ZstdCompressor(write_content_size=False)
    blob = writer.compress(payload)
    pos = len(image)
    image += blob
    shift = 62 - (header.cluster_bits - 8)
    entry = (1 << 62) | (((pos + len(blob) - 1) // 512 - pos // 512) << shift) | pos
    l2 = struct.unpack_from(">Q", image, header.l1_table_offset)[0] & 0x00FFFFFFFFFFFE00
    struct.pack_into(">Q", image, l2 + 5 * 8, entry)
    assert decode(bytes(image), 999) == expected(spec)


def test_extended_l2_subclusters_and_zero_bits() -> None:
    spec = sample_spec(extended_l2=True, cluster_bits=14, virtual_size=1 << 20)
    spec.zero = {5}
    image = bytearray(build(spec))
    header = parse_header(bytes(image[:16384]))
    l2 = struct.unpack_from(">Q", image, header.l1_table_offset)[0] & 0x00FFFFFFFFFFFE00
    # Cluster 1: only subclusters 0-3 and 10 allocated; 4-9 read as zeros.
    struct.pack_into(">Q", image, l2 + 16 * 1 + 8, (0b1111 | 1 << 10) | (0b111111 << 36))
    want = bytearray(expected(spec))
    sub = 16384 // 32
    base = 16384
    want[base + 4 * sub : base + 10 * sub] = bytes(6 * sub)
    want[base + 11 * sub : base + 16384] = bytes(16384 - 11 * sub)
    assert decode(bytes(image), 1000) == bytes(want)


def test_extended_l2_entry_both_allocated_and_zero_is_invalid() -> None:
    spec = sample_spec(extended_l2=True, cluster_bits=14, virtual_size=1 << 20)
    image = bytearray(build(spec))
    header = parse_header(bytes(image[:16384]))
    l2 = struct.unpack_from(">Q", image, header.l1_table_offset)[0] & 0x00FFFFFFFFFFFE00
    struct.pack_into(">Q", image, l2 + 8, 0xFFFFFFFF | 1 << 32)
    with pytest.raises(InvalidImage, match="both allocated and zero"):
        decode(bytes(image))


def test_zero_and_unallocated_clusters_are_holes() -> None:
    spec = sample_spec(zero={1, 3}, version=3)
    decoder = Qcow2StreamDecoder()
    writes = decoder.feed(build(spec)) + decoder.finish()
    covered = {off // 512 for off, data in writes for off in range(off, off + len(data), 512)}
    assert 1 not in covered and 3 not in covered and 4 not in covered
    assert 0 in covered and 2 in covered


def test_contiguous_data_comes_out_as_one_write() -> None:
    spec = Spec(cluster_bits=9, virtual_size=64 * 1024)
    spec.data = {i: cluster(i) for i in range(100)}
    decoder = Qcow2StreamDecoder()
    writes = []
    image = build(spec)
    for i in range(0, len(image), 1000):
        writes += decoder.feed(image[i : i + 1000])
    writes += decoder.finish()
    assert writes == [(0, b"".join(spec.data[i] for i in range(100)))]


def test_ordered_layout_spills_nothing_but_unordered_does() -> None:
    ordered = Qcow2StreamDecoder()
    ordered.feed(build(sample_spec()))
    ordered.finish()
    assert ordered.spill_bytes_peak == 0
    unordered = Qcow2StreamDecoder()
    image = build(sample_spec(layout="l1-last"))
    for i in range(0, len(image), 512):
        unordered.feed(image[i : i + 512])
    unordered.finish()
    assert unordered.spill_bytes_peak > 0


def test_spill_limit_exceeded_is_its_own_error() -> None:
    image = build(sample_spec(layout="l1-last"))
    with pytest.raises(SpillLimitExceeded) as info:
        decode(image, 512, spill_limit=1024)
    assert info.value.reason == "ImageLayoutUnordered" and not info.value.transient
    assert isinstance(info.value, WorkerError)


def _l1_l2(image: bytes | bytearray) -> tuple[int, int]:
    l1 = struct.unpack_from(">Q", image, 40)[0]
    return l1, struct.unpack_from(">Q", image, l1)[0] & 0x00FFFFFFFFFFFE00


def test_tables_pointing_outside_the_file_are_unsafe() -> None:
    image = bytearray(build(sample_spec()))
    _, l2 = _l1_l2(image)
    struct.pack_into(">Q", image, l2, (1 << 63) | (1 << 30))
    with pytest.raises(UnsafeImage, match="outside"):
        decode(bytes(image), file_size=len(image))
    with pytest.raises(InvalidImage, match="never arrived"):
        decode(bytes(image))


@pytest.mark.parametrize(
    "patch",
    ["l2-on-l1", "l2-on-header", "shared-l2", "data-on-l2", "data-on-l1"],
)
def test_overlapping_or_misaligned_tables_are_refused(patch: str) -> None:
    spec = sample_spec(virtual_size=1 << 20)
    spec.data[900] = cluster(900)
    image = bytearray(build(spec))
    l1, l2 = _l1_l2(image)
    table, index, value = {
        "l2-on-l1": (l1, 0, l1),
        "l2-on-header": (l1, 0, 0x200),
        "shared-l2": (l1, 900 // 64, l2),
        "data-on-l2": (l2, 0, l2),
        "data-on-l1": (l2, 0, l1),
    }[patch]
    struct.pack_into(">Q", image, table + 8 * index, value | (1 << 63))
    with pytest.raises(UnsafeImage):
        decode(bytes(image))


@pytest.mark.parametrize("table", ["l1", "l2"])
def test_unaligned_offsets_are_invalid(table: str) -> None:
    image = bytearray(build(sample_spec(cluster_bits=12, virtual_size=1 << 20)))
    l1, l2 = _l1_l2(image)
    at = l1 if table == "l1" else l2
    value = struct.unpack_from(">Q", image, at)[0]
    struct.pack_into(">Q", image, at, value + 512)
    with pytest.raises(InvalidImage, match="unaligned"):
        decode(bytes(image))


def test_too_many_pending_extents_go_through_scratch() -> None:
    spec = Spec(cluster_bits=9, virtual_size=64 * 1024)
    spec.data = {i: cluster(i) for i in range(0, 100, 2)}
    with pytest.raises(LayoutNotStreamable, match="extents"):
        decode(build(spec), max_pending_runs=10)


# -- helpers: zero detection, coalescing ------------------------------------------


def test_zero_pages_are_cut_out_at_4k_alignment() -> None:
    data = b"\x01" * 5000 + bytes(12000) + b"\x02" * 100
    pieces = nonzero_pieces(1000, data)
    # Data at virtual 1000..6000 keeps its whole page (to 8192); pages 8192..16384 are holes;
    # the page from 16384 holds the tail data.
    assert [(o, len(p)) for o, p in pieces] == [(1000, 8192 - 1000), (16384, 18100 - 16384)]
    assert nonzero_pieces(4096, bytes(8192)) == []
    assert nonzero_pieces(10, bytes(100)) == []


def test_coalescer_joins_neighbours_and_splits_gaps() -> None:
    out = WriteCoalescer(1 << 20)
    out.add(0, b"a" * 100)
    out.add(100, b"b" * 100)
    out.add(8192, b"c")
    assert out.drain() == [(0, b"a" * 100 + b"b" * 100)]
    assert out.drain(final=True) == [(8192, b"c")]
    out.add((1 << 20) - 1, b"xyz")
    assert out.drain(final=True) == [((1 << 20) - 1, b"x")]


# -- fuzz --------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(prefix=st.binary(min_size=0, max_size=600))
def test_header_parser_on_arbitrary_bytes(prefix: bytes) -> None:
    data = b"QFI\xfb\x00\x00\x00\x03" + prefix
    try:
        parse_header(data + bytes(max(0, 512 - len(data))))
    except WorkerError:
        pass
