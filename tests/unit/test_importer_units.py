"""Pure parts of the importer: sniffing, frame walking, xz block maths, zero detection, stages."""

from __future__ import annotations

import lzma
import os
import subprocess

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from cdi.api.errors import InsufficientSpace, InvalidImage
from datapath.decode.decompress import decompress
from datapath.decode.xz_parallel import XzBlocks, block_sizes, decode_positioned, decode_xz
from datapath.decode.zstd_frames import checked_frames
from datapath.formats import ImageFormat, sniff
from datapath.streams import Peekable, rechunk
from datapath.target import RawWriter, page_segments
from importer.sources.http import ProxyConfig


@pytest.mark.parametrize(
    ("head", "fmt"),
    [
        (b"QFI\xfb\x00\x00\x00\x03", ImageFormat.QCOW2),
        (b"KDMV\x01\x00\x00\x00", ImageFormat.VMDK),
        (b"\x00" * 0x40 + b"\x7f\x10\xda\xbe", ImageFormat.VDI),
        (b"conectix" + b"\x00" * 100, ImageFormat.VHD),
        (b"vhdxfile" + b"\x00" * 100, ImageFormat.VHDX),
        (b"\x1f\x8b\x08\x00", ImageFormat.GZIP),
        (b"\xfd7zXZ\x00\x00\x04", ImageFormat.XZ),
        (b"\x28\xb5\x2f\xfd\x00", ImageFormat.ZSTD),
        (b"BZh91AY&SY" + b"\x00" * 10, ImageFormat.BZIP2),
        (b"\x00" * 0x101 + b"ustar\x0000", ImageFormat.TAR),
        (b"<!DOCTYPE html><html><body>Not Found</body></html>", ImageFormat.TEXT),
        (b'{"error": "not found", "code": 404}', ImageFormat.TEXT),
        (b"\x00" * 4096, ImageFormat.RAW),
        (os.urandom(4096).replace(b"\x00", b"\x01") + b"\x00", ImageFormat.RAW),
        (b"", ImageFormat.RAW),
    ],
)
def test_sniff_by_content(head: bytes, fmt: ImageFormat) -> None:
    assert sniff(head) is fmt


def test_bzip2_needs_its_block_magic() -> None:
    assert sniff(b"BZh is just text, not bzip2 at all") is not ImageFormat.BZIP2


def test_peekable_does_not_consume() -> None:
    stream = Peekable(iter([b"ab", b"cd", b"ef"]))
    assert stream.peek(3) == b"abc"
    assert b"".join(stream) == b"abcdef"


def test_zstd_truncation_is_detected_and_multi_frame_passes() -> None:
    data = os.urandom(300_000) + bytes(3_000_000)
    frames = zstandard.ZstdCompressor().compress(data[:1000]) + zstandard.ZstdCompressor(
        write_checksum=True
    ).compress(data[1000:])
    assert b"".join(checked_frames(rechunk(iter([frames]), 777))) == frames
    out = b"".join(decompress(ImageFormat.ZSTD, rechunk(iter([frames]), 4096)))
    assert out == data
    with pytest.raises(InvalidImage, match="truncated"):
        b"".join(decompress(ImageFormat.ZSTD, iter([frames[:-10]])))


def test_xz_multi_block_parallel_equals_sequential(tmp_path: os.PathLike[str]) -> None:
    data = os.urandom(1 << 20) + bytes(6 << 20) + b"pattern" * 200_000
    multi = subprocess.run(
        ["xz", "-T2", "-0", "--block-size=1MiB", "-c"], input=data, capture_output=True, check=True
    ).stdout
    assert b"".join(decode_xz(rechunk(iter([multi]), 100_000), workers=2)) == data
    assert b"".join(decode_xz(iter([multi]), workers=1)) == data
    single = lzma.compress(data)
    assert b"".join(decode_xz(iter([single]), workers=2)) == data
    header = multi[12 : 12 + (multi[12] + 1) * 4]
    assert block_sizes(header) is not None and block_sizes(header)[1] == 1 << 20  # type: ignore[index]
    corrupt = bytearray(multi)
    corrupt[len(multi) // 2] ^= 0xFF
    with pytest.raises(InvalidImage):
        b"".join(decompress(ImageFormat.XZ, iter([bytes(corrupt)])))


def _xz_blocks(data: bytes, block_size: str = "1MiB") -> bytes:
    return subprocess.run(
        ["xz", "-T2", "-0", f"--block-size={block_size}", "-c"],
        input=data,
        capture_output=True,
        check=True,
    ).stdout


class _Image:
    """A sink that places pieces like a target would, and remembers what was written where."""

    def __init__(self, size: int) -> None:
        self.data = bytearray(size)
        self.writes: list[tuple[int, int]] = []

    def write_at(self, offset: int, piece: bytes) -> None:
        self.data[offset : offset + len(piece)] = piece
        self.writes.append((offset, len(piece)))


def test_xz_blocks_are_written_in_place_whatever_the_order() -> None:
    data = os.urandom(1 << 20) + bytes(3 << 20) + b"pattern" * 300_000 + b"tail"
    multi = _xz_blocks(data) + _xz_blocks(data[:5000])  # two concatenated streams
    xz = XzBlocks(rechunk(iter([multi]), 70_000))
    assert xz.first_size() == 1 << 20
    assert xz.head(100) == data[:100]  # only looked: the blocks still start at the beginning
    image = _Image(len(data) + 5000)
    assert decode_positioned(xz.blocks(), [image, image], lambda end: None) == len(data) + 5000
    assert bytes(image.data) == data + data[:5000]
    assert max(n for _, n in image.writes) <= 1 << 20  # pieces, not whole blocks


def test_xz_without_block_sizes_is_not_split() -> None:
    xz = XzBlocks(iter([lzma.compress(bytes(1 << 20))]))  # single-threaded xz: no sizes
    assert xz.first_size() is None
    assert lzma.decompress(b"".join(xz.rest())) == bytes(1 << 20)


def test_corrupt_xz_block_in_the_middle_fails_the_positioned_decode() -> None:
    data = os.urandom(6 << 20)
    multi = bytearray(_xz_blocks(data))
    multi[len(multi) // 2] ^= 0x55  # inside the compressed data of a middle block
    image = _Image(len(data))
    with pytest.raises(InvalidImage):
        decode_positioned(XzBlocks(iter([bytes(multi)])).blocks(), [image, image], lambda e: None)


def test_xz_bomb_stops_before_a_block_past_the_target_is_decoded() -> None:
    multi = _xz_blocks(bytes(8 << 20))  # eight 1 MiB blocks of zeros
    capacity = 3 << 20
    image = _Image(8 << 20)

    def room(end: int) -> None:
        if end > capacity:
            raise InsufficientSpace(f"block ends at {end}")

    with pytest.raises(InsufficientSpace, match=str(4 << 20)):
        decode_positioned(XzBlocks(iter([multi])).blocks(), [image, image], room)
    assert all(offset + n <= capacity for offset, n in image.writes)


def test_page_segments_are_aligned_to_absolute_offsets() -> None:
    data = bytes(8192) + b"\x01" + bytes(4095)
    segs = list(page_segments(data, 4096))  # starts mid 64K block, 4K aligned
    zero = [(a, b) for a, b, z in segs if z]
    assert (0, 8192) == (zero[0][0], zero[-1][1]) or zero[0] == (0, 4096)
    assert all(not z for a, b, z in segs if a <= 8192 < b)
    unaligned = list(page_segments(b"\x00" * 100 + b"\x01", 4000))
    assert unaligned[0] == (0, 96, True)


def _page_runs_reference(data: bytes, offset: int) -> list[tuple[int, int, bool]]:
    """The obvious per-page definition that ``page_segments`` must agree with."""
    runs: list[tuple[int, int, bool]] = []
    pos = 0
    while pos < len(data):
        stop = min(len(data), pos + 4096 - (offset + pos) % 4096)
        zero = not any(data[pos:stop])
        if runs and runs[-1][2] == zero:
            runs[-1] = (runs[-1][0], stop, zero)
        else:
            runs.append((pos, stop, zero))
        pos = stop
    return runs


@settings(max_examples=300, deadline=None)
@given(
    pages=st.lists(
        st.sampled_from(["zero", "data", "sparse", "one-end", "one-start"]), max_size=40
    ),
    offset=st.integers(0, 3 * 4096),
    trim_head=st.integers(0, 5000),
    trim_tail=st.integers(0, 5000),
)
def test_page_segments_match_a_page_by_page_scan(
    pages: list[str], offset: int, trim_head: int, trim_tail: int
) -> None:
    """Sampling must never call a page with data zero, whatever bytes the samples hit."""
    fills = {
        "zero": bytes(4096),
        "data": bytes(range(256)) * 16,
        "sparse": bytes(700) + b"\x05" + bytes(3395),  # non-zero byte between the samples
        "one-end": bytes(4095) + b"\x01",
        "one-start": b"\x01" + bytes(4095),
    }
    data = b"".join(fills[p] for p in pages)
    data = data[trim_head : max(trim_head, len(data) - trim_tail)]
    assert page_segments(data, offset) == _page_runs_reference(data, offset)


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(
        st.tuples(st.integers(0, 300), st.integers(1, 3000), st.booleans()),
        min_size=1,
        max_size=40,
    )
)
def test_direct_writer_lands_every_piece_whatever_the_order_and_alignment(
    pieces: list[tuple[int, int, bool]],
) -> None:
    """Pieces in any order, aligned (O_DIRECT, several in flight, gathered when contiguous)
    or not (page cache), all end up in the file once ``flush`` returns."""
    import tempfile

    slots: dict[int, tuple[int, bool]] = {}
    for slot, size, aligned in pieces:  # non-overlapping: one piece per 12 KiB slot
        slots.setdefault(slot, (size, aligned))
    model = bytearray(301 * 12288)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        fd = os.open(os.path.join(tmp, "out"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            writer = RawWriter(fd, len(model), zero_fill=False, direct=True)
            for slot, (size, aligned) in slots.items():
                offset = slot * 12288 + (0 if aligned else 512)
                length = size * 4 if aligned else size  # 4..12000 bytes
                length = length // 4096 * 4096 or 4096 if aligned else length
                data = bytes([slot % 251 + 1]) * length
                writer.write_data_at(offset, data)
                model[offset : offset + length] = data
            writer.flush()
            with open(os.path.join(tmp, "out"), "rb") as check:  # the writer's fd is O_DIRECT
                assert check.read().ljust(len(model), b"\0") == bytes(model)
            writer.close()
        finally:
            os.close(fd)


@settings(max_examples=60, deadline=None)
@given(
    start=st.integers(0, 9000),
    cuts=st.lists(st.integers(1, 700_000), min_size=1, max_size=12),
    gaps=st.lists(st.booleans(), min_size=12, max_size=12),
)
def test_direct_writer_gathers_a_run_cut_at_odd_places(
    start: int, cuts: list[int], gaps: list[bool]
) -> None:
    """A run cut anywhere (as a chunk boundary cuts a VDI block at an odd offset), with the
    odd gap between runs, still lands byte for byte: partial pages go through the page cache,
    whole pages through O_DIRECT buffers."""
    import tempfile

    model = bytearray(start + sum(cuts) + 4096 * len(cuts) + 1)
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        path = os.path.join(tmp, "out")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            writer = RawWriter(fd, len(model), zero_fill=False, direct=True)
            at = start
            for i, size in enumerate(cuts):
                data = bytes((at + k) % 251 + 1 for k in range(0, size, 97)) * 97
                data = data[:size]
                writer.write_data_at(at, data)
                model[at : at + size] = data
                at += size + (1000 if gaps[i] else 0)
            writer.flush()
            with open(path, "rb") as check:
                assert check.read().ljust(len(model), b"\0") == bytes(model)
            writer.close()
        finally:
            os.close(fd)


def test_raw_writer_skips_zeros_and_enforces_capacity(tmp_path: os.PathLike[str]) -> None:
    path = os.path.join(tmp_path, "out")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        writer = RawWriter(fd, 1 << 20, zero_fill=False)
        writer.write(bytes(65536) + b"\x07" * 4096 + bytes(65536))
        assert writer.bytes_written == 4096
        with pytest.raises(Exception, match="usable size"):
            writer.write_at((1 << 20) - 10, b"x" * 11)
    finally:
        os.close(fd)


def test_no_proxy_matching() -> None:
    proxy = ProxyConfig(http="http://p:3128", https="http://p:3129", no_proxy=("internal", ".lab"))
    assert proxy.for_url("http://example.com/x") == "http://p:3128"
    assert proxy.for_url("https://example.com/x") == "http://p:3129"
    assert proxy.for_url("http://host.internal/x") is None
    assert proxy.for_url("http://a.lab/x") is None
    assert ProxyConfig(http="h", no_proxy=("*",)).for_url("http://x") is None


def test_iso_is_written_as_raw() -> None:
    iso = bytearray(64 * 1024)
    iso[0x8001:0x8006] = b"CD001"
    assert sniff(bytes(iso)) is ImageFormat.RAW


@pytest.mark.parametrize(
    ("url", "proxy", "host", "port", "target"),
    [
        ("http://[::1]/d.img", None, "::1", 80, "/d.img"),
        ("https://[fd00::5]:8443/d.img?x=1", None, "fd00::5", 8443, "/d.img?x=1"),
        ("http://example.com/d.img", "proxy:3128", "proxy", 3128, "http://example.com/d.img"),
        ("https://example.com/d.img", "http://proxy:3129", "proxy", 3129, "/d.img"),
    ],
)
def test_connections_go_to_the_right_host_and_port(
    url: str, proxy: str | None, host: str, port: int, target: str
) -> None:
    """IPv6 literals keep their last group (no port guessed from it); plain http goes to a
    proxy in absolute form, https through a CONNECT tunnel to the named host."""
    import ssl

    from importer.sources.http_client import Client

    client = Client(
        url=url,
        headers={},
        authorization=None,
        tls=ssl.create_default_context,
        proxy_for=lambda _url: proxy,
    )
    key, request_target = client._route(url, {})
    conn = client._connection(key)
    assert (conn.host, conn.port, request_target) == (host, port, target)
    if proxy and url.startswith("https"):
        assert conn._tunnel_host == "example.com" and conn._tunnel_port == 443  # type: ignore[attr-defined]
