"""The order-independent digest of a verified volume (datapath.verify.WriteDigest): whatever
order and cut the pieces come in, with zeros written, skipped or punched, it equals the digest
of the finished image's bytes; a piece it can no longer add is reported, never ignored."""

from __future__ import annotations

import itertools
import mmap
import os
import random
import threading
from pathlib import Path

import pytest

from datapath.target.zeros import page_segments
from datapath.verify import (
    _MASK,
    BLOCK,
    READ_SIZE,
    Digest,
    WriteDigest,
    _read,
    _reopen_direct,
    block_term,
    read_back,
)

KiB = 1024


def digest_of(image: bytes) -> Digest:
    """The definition: the sum of the terms of the image's whole blocks (zero padded)."""
    total = blocks = 0
    for index in range(0, len(image), BLOCK):
        block = image[index : index + BLOCK].ljust(BLOCK, b"\0")
        term = block_term(index // BLOCK, block)
        if term:
            total += term
            blocks += 1
    return Digest(total & _MASK, blocks)


def sparse_image(size: int, seed: int) -> bytes:
    """Data islands at odd offsets, zero pages between and inside them."""
    rng = random.Random(seed)
    image = bytearray(size)
    for _ in range(12):
        at = rng.randrange(0, size - 40 * KiB)
        length = rng.randrange(1, 40 * KiB)
        image[at : at + length] = rng.randbytes(length)
    image[5 * BLOCK : 6 * BLOCK] = b"\0" * BLOCK  # a whole zero block
    image[7 * BLOCK + 4 * KiB : 7 * BLOCK + 8 * KiB] = b"\0" * (4 * KiB)  # a zero page inside
    return bytes(image)


def pieces(image: bytes, rng: random.Random, *, zero_pages: bool) -> list[tuple[int, bytes]]:
    """The image cut at random points; with ``zero_pages`` False the zero pages are left out
    of the pieces, as the stream decoders do."""
    cuts = sorted({0, len(image), *(rng.randrange(len(image)) for _ in range(40))})
    out = []
    for lo, hi in itertools.pairwise(cuts):
        if zero_pages:
            out.append((lo, image[lo:hi]))
            continue
        for start, stop, zero in page_segments(image, 0, lo, hi):
            if not zero:
                out.append((start, image[start:stop]))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_the_digest_does_not_depend_on_the_order_or_cut_of_the_pieces(seed: int) -> None:
    rng = random.Random(seed)
    image = sparse_image(2 * 1024 * KiB + 3 * KiB, seed)
    expected = digest_of(image)
    assert expected.blocks > 0
    for zero_pages in (True, False):
        parts = pieces(image, rng, zero_pages=zero_pages)
        rng.shuffle(parts)
        digest = WriteDigest()
        for offset, data in parts:
            digest.add(offset, memoryview(data))
        assert digest.finish() == expected, zero_pages


def test_zero_blocks_contribute_nothing_written_skipped_or_reported() -> None:
    data = random.Random(1).randbytes(BLOCK)
    written = WriteDigest()
    written.add(0, bytes(BLOCK))  # zeros written
    written.add(BLOCK, data)
    skipped = WriteDigest()
    skipped.zeros(0, BLOCK)  # a hole
    skipped.add(BLOCK, data)
    absent = WriteDigest()
    absent.add(BLOCK, data)
    assert written.finish() == skipped.finish() == absent.finish() == digest_of(bytes(BLOCK) + data)
    assert WriteDigest().finish() == Digest(0, 0)


def test_a_block_is_hashed_by_position_not_only_content() -> None:
    data = random.Random(2).randbytes(BLOCK)
    one, other = WriteDigest(), WriteDigest()
    one.add(0, data)
    other.add(BLOCK, data)
    assert one.finish() != other.finish()


def test_partial_pieces_complete_a_block_with_the_zeros_reported_beside_them() -> None:
    """The raw writer's way: data pages and zero pages of one block arrive apart."""
    rng = random.Random(3)
    block = bytearray(rng.randbytes(BLOCK))
    block[8 * KiB : 20 * KiB] = bytes(12 * KiB)
    digest = WriteDigest()
    digest.add(20 * KiB, bytes(block[20 * KiB :]))
    digest.zeros(8 * KiB, 12 * KiB)
    digest.add(0, bytes(block[: 8 * KiB]))
    assert not digest._pending  # complete: hashed at once, nothing held
    assert digest.finish() == digest_of(bytes(block))


def test_a_partial_block_never_completed_is_folded_with_its_gaps_as_zeros() -> None:
    digest = WriteDigest()
    digest.add(3 * BLOCK + 100, b"tail of a file")
    image = bytearray(4 * BLOCK)
    image[3 * BLOCK + 100 : 3 * BLOCK + 114] = b"tail of a file"
    assert digest.finish() == digest_of(bytes(image))


def test_partial_blocks_beyond_the_bound_are_folded_early_and_a_late_piece_is_reported() -> None:
    digest = WriteDigest(pending_limit=2 * BLOCK)
    for index in range(3):  # the third folds the first early
        digest.add(index * BLOCK, b"x")
    assert not digest.unordered
    digest.add(10, b"late")  # into the block folded early: it cannot be added any more
    assert digest.unordered


def test_lanes_on_threads_share_one_digest() -> None:
    """xz blocks decoded on a pool: each lane writes its own range (blocks straddle lanes),
    all into the writer's one digest, at once."""
    rng = random.Random(4)
    image = rng.randbytes(40 * BLOCK)
    digest = WriteDigest()
    cuts = [0, 7 * BLOCK + 1000, 19 * BLOCK + 5, 31 * BLOCK, len(image)]

    def lane(lo: int, hi: int) -> None:
        for at in range(lo, hi, 3000):
            digest.add(at, image[at : min(hi, at + 3000)])

    threads = [threading.Thread(target=lane, args=span) for span in itertools.pairwise(cuts)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert digest.finish() == digest_of(image)


def test_a_single_changed_byte_changes_the_digest() -> None:
    image = bytearray(sparse_image(1024 * KiB, 9))
    before = digest_of(bytes(image))
    image[777_777] ^= 0x01
    assert digest_of(bytes(image)) != before


def test_the_read_back_of_a_sparse_file_with_a_ragged_end_matches_its_bytes(
    tmp_path: Path,
) -> None:
    """O_DIRECT reads in whole pages, several in flight: the last piece ends inside a page
    (the file's size is not a page multiple) and holes are skipped; what is read back is
    what the file holds."""
    rng = random.Random(5)
    size = 3 * READ_SIZE + 5 * BLOCK + 1234
    image = bytearray(size)
    for at in (0, READ_SIZE - 100, 2 * READ_SIZE + 7 * 4096, size - 3000):
        image[at : at + 2500] = rng.randbytes(2500)
    path = tmp_path / "disk.img"
    with path.open("wb") as out:
        for at in range(0, size, BLOCK):  # holes where a block is all zeros
            block = bytes(image[at : at + BLOCK])
            if block.strip(b"\0"):
                out.seek(at)
                out.write(block)
        out.truncate(size)
        os.fsync(out.fileno())
    found = read_back(str(path), block_device=False)
    assert found.digest == digest_of(bytes(image))
    assert found.bytes_read < size  # the holes were not read


def test_a_piece_read_through_the_page_cache_equals_the_o_direct_read(tmp_path: Path) -> None:
    """Where the filesystem has no O_DIRECT the read-back falls back to the page cache."""
    data = random.Random(6).randbytes(BLOCK + 777)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    direct = _reopen_direct(fd)
    try:
        assert direct >= 0  # the test's filesystem has O_DIRECT
        through_cache, through_direct = mmap.mmap(-1, READ_SIZE), mmap.mmap(-1, READ_SIZE)
        assert _read(fd, -1, through_cache, 0, 2 * BLOCK) == len(data)
        assert _read(fd, direct, through_direct, 0, 2 * BLOCK) == len(data)
        assert through_cache[: 2 * BLOCK] == through_direct[: 2 * BLOCK]
        assert through_cache[: len(data)] == data
        assert through_cache[len(data) : 2 * BLOCK] == bytes(2 * BLOCK - len(data))
    finally:
        os.close(direct)
        os.close(fd)
