"""xz decoding that uses every core when the file allows it.

``xz -T0`` (and most image pipelines) write multi-block .xz files whose block headers carry the
compressed and uncompressed sizes. Such blocks are independent: we cut each one out of the stream,
wrap it in a minimal one-block .xz stream (header, block, index, footer) and let liblzma decode it
on a thread pool. liblzma releases the GIL, and because each mini stream has its own index and
check, liblzma still verifies every block's integrity check and both sizes.

Files without block sizes (single-threaded ``xz``) cannot be split and are decoded sequentially,
as ``xz -dc`` does. Memory stays bounded: at most ``workers`` blocks are in flight, only the
younger ones are held decoded, and a block may declare at most ``MAX_PARALLEL_BLOCK`` bytes,
else it is decoded sequentially too.
"""

from __future__ import annotations

import itertools
import lzma
import os
import queue
import struct
import zlib
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from cdi.api.errors import InvalidImage, UnsupportedFormat
from importer.streams import CHUNK_SIZE, as_file

STREAM_HEADER = 12
MAX_PARALLEL_BLOCK = 64 * 1024 * 1024
_MAGIC = b"\xfd7zXZ\x00"
_CHECK_SIZES = {0: 0, 1: 4, 4: 8, 10: 32}
_DONE = object()  # end of one block's pieces


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    for i in range(9):
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos + i + 1
    raise InvalidImage("xz block header has a malformed size field")


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def block_sizes(header: bytes) -> tuple[int, int] | None:
    """(compressed, uncompressed) sizes declared by a block header, or None if absent."""
    flags = header[1]
    if not (flags & 0x40 and flags & 0x80):
        return None
    compressed, pos = _varint(header, 2)
    uncompressed, _ = _varint(header, pos)
    return compressed, uncompressed


def mini_stream(
    stream_header: bytes, block: bytes | memoryview, unpadded: int, uncompressed: int
) -> bytearray:
    """Wrap one block in a complete .xz stream so liblzma checks it end to end (one copy of
    the block: incompressible blocks can be as large as the data they hold)."""
    flags = stream_header[6:8]
    index = b"\x00" + _encode_varint(1) + _encode_varint(unpadded) + _encode_varint(uncompressed)
    index += b"\x00" * (-len(index) % 4)
    index += struct.pack("<I", zlib.crc32(index))
    backward = struct.pack("<I", len(index) // 4 - 1)
    footer = struct.pack("<I", zlib.crc32(backward + flags)) + backward + flags + b"YZ"
    out = bytearray(stream_header)
    out += block
    out += index
    out += footer
    return out


class _Buffer:
    """Accumulates input so whole blocks can be cut out of it."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.data = bytearray()

    def fill(self, n: int) -> bool:
        while len(self.data) < n:
            nxt = next(self.chunks, None)
            if nxt is None:
                return False
            self.data += nxt
        return True

    def take(self, n: int) -> bytes:
        out = bytes(self.data[:n])
        del self.data[:n]
        return out

    def rest(self) -> Iterator[bytes]:
        if self.data:
            yield bytes(self.data)
            self.data = bytearray()
        yield from self.chunks


def _sequential(chunks: Iterator[bytes]) -> Iterator[bytes]:
    reader = lzma.LZMAFile(as_file(chunks), mode="rb", format=lzma.FORMAT_XZ)
    while piece := reader.read(CHUNK_SIZE):
        yield piece


def _decode_block(data: bytes | bytearray, expected: int, out: queue.SimpleQueue[object]) -> None:
    """Decode one mini stream on a pool thread, handing out CHUNK_SIZE pieces as they appear
    (so the oldest block streams to the writer instead of sitting decoded in memory); the last
    item is ``_DONE`` or the exception that stopped it."""
    try:
        decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        piece = decoder.decompress(data, max_length=CHUNK_SIZE)
        del data  # liblzma keeps what it has not consumed yet
        total = len(piece)
        out.put(piece)
        while not decoder.eof and not decoder.needs_input:
            piece = decoder.decompress(b"", max_length=CHUNK_SIZE)
            total += len(piece)
            out.put(piece)
        if not decoder.eof:
            raise InvalidImage("xz block is truncated")
        if total != expected:
            raise InvalidImage("xz block decoded to a size other than its header declares")
        out.put(_DONE)
    except BaseException as exc:  # re-raised on the consuming thread
        out.put(exc)


def decode_xz(chunks: Iterator[bytes], workers: int | None = None) -> Iterator[bytes]:
    """Decode an .xz stream, block-parallel where the file allows it."""
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    buf = _Buffer(chunks)
    if not buf.fill(STREAM_HEADER + 8) or workers == 1:
        yield from _sequential(buf.rest())
        return
    header = bytes(buf.data[:STREAM_HEADER])
    first_block_size = (buf.data[STREAM_HEADER] + 1) * 4
    if not buf.fill(STREAM_HEADER + first_block_size):
        yield from _sequential(buf.rest())
        return
    sizes = block_sizes(bytes(buf.data[STREAM_HEADER : STREAM_HEADER + first_block_size]))
    if not header.startswith(_MAGIC) or sizes is None or sizes[1] > MAX_PARALLEL_BLOCK:
        yield from _sequential(buf.rest())
        return
    yield from _parallel(buf, workers)


def _parallel(buf: _Buffer, workers: int) -> Iterator[bytes]:
    """``workers`` blocks decode at once. The oldest block's pieces are handed on as they are
    decoded; younger blocks keep theirs until they become the oldest. The next block is
    submitted once the oldest is finished, so at most ``workers - 1`` decoded blocks wait in
    memory (a 2-core import holds one 24 MiB block, not two) and every core stays busy."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xz") as pool:
        jobs = _blocks(buf)

        def submit(job: tuple[bytearray, int]) -> queue.SimpleQueue[object]:
            out: queue.SimpleQueue[object] = queue.SimpleQueue()
            pool.submit(_decode_block, job[0], job[1], out)
            return out

        pending = deque(submit(job) for job in itertools.islice(jobs, workers))
        while pending:
            out = pending.popleft()
            while (item := out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, bytes)
                yield item
                del item
            job = next(jobs, None)
            if job is not None:
                pending.append(submit(job))


def _blocks(buf: _Buffer) -> Iterator[tuple[bytearray, int]]:
    """Yield (mini stream, uncompressed size) for each block of each concatenated stream."""
    while buf.fill(STREAM_HEADER):
        if not buf.data[:4].strip(b"\x00") and buf.data[:4] == b"\x00" * 4:
            buf.take(4)  # stream padding
            continue
        header = buf.take(STREAM_HEADER)
        if not header.startswith(_MAGIC):
            raise InvalidImage("xz stream has garbage where a stream header should be")
        check_size = _CHECK_SIZES.get(header[7] & 0x0F)
        if check_size is None:
            raise UnsupportedFormat(f"xz check type {header[7] & 0x0F} is not supported")
        yield from _stream_blocks(buf, header, check_size)


def _stream_blocks(buf: _Buffer, header: bytes, check_size: int) -> Iterator[tuple[bytearray, int]]:
    while True:
        if not buf.fill(1):
            raise InvalidImage("xz stream is truncated before its index")
        if buf.data[0] == 0:  # index indicator: skip index and footer
            _skip_index(buf)
            return
        hsize = (buf.data[0] + 1) * 4
        if not buf.fill(hsize):
            raise InvalidImage("xz stream is truncated inside a block header")
        sizes = block_sizes(bytes(buf.data[:hsize]))
        if sizes is None or sizes[1] > MAX_PARALLEL_BLOCK:
            raise UnsupportedFormat(
                "xz file mixes blocks with and without size fields, or has huge blocks; "
                "recompress it with xz -T0"
            )
        compressed, uncompressed = sizes
        total = hsize + compressed + (-compressed % 4) + check_size
        if not buf.fill(total):
            raise InvalidImage("xz stream is truncated inside a block")
        with memoryview(buf.data) as view:
            stream = mini_stream(
                header, view[:total], hsize + compressed + check_size, uncompressed
            )
        del buf.data[:total]
        yield stream, uncompressed


def _skip_index(buf: _Buffer) -> None:
    """Consume the index and the stream footer (each block's sizes and check were verified)."""

    def varint_at(pos: int) -> tuple[int, int]:
        if not buf.fill(pos + 9) and not buf.fill(pos + 1):
            raise InvalidImage("xz index is truncated")
        return _varint(bytes(buf.data[pos : pos + 9]) + b"\x00" * 9, 0)[0], pos + _varint_len(
            buf.data, pos
        )

    count, pos = varint_at(1)
    for _ in range(count * 2):
        _, pos = varint_at(pos)
    pos += -pos % 4 + 4  # padding and CRC32
    if not buf.fill(pos + 12):
        raise InvalidImage("xz stream footer is truncated")
    if bytes(buf.data[pos + 10 : pos + 12]) != b"YZ":
        raise InvalidImage("xz stream footer is corrupt")
    buf.take(pos + 12)


def _varint_len(data: bytearray, pos: int) -> int:
    for i in range(9):
        if pos + i >= len(data) or not data[pos + i] & 0x80:
            return i + 1
    raise InvalidImage("xz index has a malformed size field")
