"""``blockdevice-clone-sparse`` (``datapath.decode.sparseraw``): what the clone source frames
and what the target makes of frames, including hostile ones, on real files."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.api.errors import InsufficientSpace, InvalidImage
from datapath.decode.sparseraw import FRAME, end_frame, frames_of, write_sparse
from datapath.target import RawWriter

PAGE = 4096


def image() -> bytes:
    """64 pages: data, a zero run, a page with one set byte, data up to a partial zero page."""
    rng = random.Random(3)
    zero_page_with_a_byte = bytes(PAGE - 1) + b"\x01"
    return (
        rng.randbytes(3 * PAGE)
        + bytes(40 * PAGE)
        + zero_page_with_a_byte
        + rng.randbytes(19 * PAGE + 100)
        + bytes(PAGE - 100)
    )


def framed(data: bytes, chunk: int) -> bytes:
    out = b"".join(
        bytes(p) for at in range(0, len(data), chunk) for p in frames_of(data[at : at + chunk], at)
    )
    return out + end_frame(len(data))


def receive(tmp_path: Path, stream: bytes, split: int, capacity: int | None = None) -> bytes:
    """``stream`` cut into pieces of ``split`` bytes, written into a fresh sparse file."""
    path = tmp_path / "disk.img"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        writer = RawWriter(fd, capacity, zero_fill=False)
        pieces: Iterator[bytes] = (stream[i : i + split] for i in range(0, len(stream), split))
        size = write_sparse(pieces, writer)
        writer.finish(size, preallocate=False, block=False)
    finally:
        os.close(fd)
    return path.read_bytes()


@pytest.mark.parametrize("split", [1, 7, 16, 4096, 1 << 20])
def test_frames_arrive_byte_identical_however_the_stream_is_cut(tmp_path: Path, split: int) -> None:
    data = image()
    stream = framed(data, 16 * PAGE)
    assert receive(tmp_path, stream, split) == data


def test_zero_pages_do_not_travel_and_stay_holes(tmp_path: Path) -> None:
    data = image()
    stream = framed(data, 1 << 20)
    zero_pages = 40 + (PAGE - 100) // PAGE  # the run; a partial page counts as data
    assert len(stream) < len(data) - zero_pages * PAGE + 8 * FRAME.size
    receive(tmp_path, stream, 1 << 20)
    assert os.stat(tmp_path / "disk.img").st_blocks * 512 < len(data) - 32 * PAGE


def test_a_chunk_of_data_only_is_sent_as_it_is() -> None:
    chunk = random.Random(1).randbytes(8 * PAGE)
    pieces = frames_of(chunk, 5 * PAGE)
    assert pieces[1] is chunk  # no copy of the data
    assert FRAME.unpack(pieces[0]) == (5 * PAGE, len(chunk))
    assert frames_of(bytes(8 * PAGE), 0) == []


@pytest.mark.parametrize(
    ("stream", "error"),
    [
        (FRAME.pack(PAGE, 4) + b"abcd" + FRAME.pack(0, 4) + b"efgh" + end_frame(2 * PAGE),
         InvalidImage),  # backwards: would overwrite
        (FRAME.pack(0, 8) + b"abcd", InvalidImage),  # cut inside a frame
        (FRAME.pack(0, 4) + b"abcd", InvalidImage),  # no end frame
        (FRAME.pack(0, 4) + b"abcd" + end_frame(PAGE) + b"x", InvalidImage),  # bytes after it
        (end_frame(PAGE)[:9], InvalidImage),  # a cut header
        (FRAME.pack(1 << 40, 4) + b"abcd" + end_frame(1 << 41), InsufficientSpace),
        (FRAME.pack(0, 4) + b"abcd" + end_frame(1 << 41), InsufficientSpace),
    ],
    ids=["backwards", "cut-data", "no-end", "trailing", "cut-header", "far-frame", "far-end"],
)  # fmt: skip
def test_hostile_streams_are_typed_errors(
    tmp_path: Path, stream: bytes, error: type[Exception]
) -> None:
    with pytest.raises(error):
        receive(tmp_path, stream, 5, capacity=1 << 20)
