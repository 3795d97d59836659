"""xz decoding that uses every core when the file allows it.

``xz -T0`` (and most image pipelines) write multi-block .xz files whose block headers carry the
compressed and uncompressed sizes. Such blocks are independent: we cut each one out of the input
and let liblzma decode it on a thread pool (liblzma releases the GIL). Each block is decoded as
a one-block .xz stream, fed to liblzma in slices: the real stream header, the block as views of
the source chunks, then a synthetic index and footer. So liblzma still verifies every block's
integrity check and both sizes, and the compressed block is never copied whole (the Python
wrapper keeps at most one ``FEED`` slice it could not consume yet).

Because the headers also give each block's place in the decoded output, a raw image can be
written block by block in place (``decode_positioned``): nothing decoded waits for an older
block, so each thread holds one decoder, one compressed block and one ``PIECE``. Other contents
(qcow2, tar...) need the bytes in order (``decode_xz``): the oldest block streams, younger
ones keep their pieces until they become the oldest.

Files without block sizes (single-threaded ``xz``) cannot be split and are decoded sequentially,
as ``xz -dc`` does; so is a file whose first block declares more than ``MAX_PARALLEL_BLOCK``.
"""

from __future__ import annotations

import itertools
import lzma
import mmap
import os
import queue
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Protocol

from cdi.api.errors import InvalidImage, UnsupportedFormat
from datapath.streams import CHUNK_SIZE, as_file

STREAM_HEADER = 12
# Blocks above this are decoded sequentially: each of up to 4 threads holds a compressed block,
# its decoder's dictionary (filled up to the block's size) and, on the ordered path, a decoded
# block waiting its turn; 32 MiB keeps that under ~350 MiB (docs/importer.md, memory table) and
# still covers xz -T0 up to -7 (blocks of 3 x the dictionary: 24 MiB at -6).
MAX_PARALLEL_BLOCK = 32 * 1024 * 1024
# liblzma's decoder allocates the dictionary the stream header asks for (up to 1.5 GiB, and it
# fills as output is produced): a 100 KiB file could take the pod past its memory limit. xz -9e
# needs 65 MiB to decode; anything asking for more than this is refused (InvalidImage).
XZ_MEMLIMIT = 96 * 1024 * 1024
# The ordered path (xz holding qcow2, vmdk, a tar...) runs beside an image decoder with tables of
# its own, and younger blocks wait decoded in memory: two threads there (the pod has 0.75 CPU
# by default anyway), all of ``default_workers`` for a raw image written in place.
ORDERED_WORKERS = 2
# Output pieces: liblzma's output buffer briefly holds twice a piece, and younger blocks of the
# ordered path hold theirs, so pieces are small; 1 MiB writes still run at disk speed.
PIECE = 1024 * 1024
FEED = 256 * 1024  # input slice: the most the wrapper copies when max_length stops it
_MAGIC = b"\xfd7zXZ\x00"
_CHECK_SIZES = {0: 0, 1: 4, 4: 8, 10: 32}
_DONE = object()  # end of one block's pieces


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


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


def stream_trailer(stream_header: bytes, unpadded: int, uncompressed: int) -> bytes:
    """Index and footer of a one-block stream: what liblzma checks the block's sizes against."""
    flags = stream_header[6:8]
    index = b"\x00" + _encode_varint(1) + _encode_varint(unpadded) + _encode_varint(uncompressed)
    index += b"\x00" * (-len(index) % 4)
    index += struct.pack("<I", zlib.crc32(index))
    backward = struct.pack("<I", len(index) // 4 - 1)
    return index + struct.pack("<I", zlib.crc32(backward + flags)) + backward + flags + b"YZ"


@dataclass(frozen=True)
class Block:
    """One block of the input, as views of the source chunks (no copy)."""

    stream_header: bytes  # of the stream it belongs to: its flags name the check type
    parts: tuple[memoryview, ...]  # block header, compressed data, padding, check
    unpadded: int  # header + compressed data + check, as an index records it
    uncompressed: int
    offset: int  # where its bytes start in the decoded output

    @property
    def end(self) -> int:
        return self.offset + self.uncompressed


def _feed(block: Block) -> Iterator[bytes | memoryview]:
    yield block.stream_header
    for part in block.parts:
        for start in range(0, len(part), FEED):
            yield part[start : start + FEED]
    yield stream_trailer(block.stream_header, block.unpadded, block.uncompressed)


def block_pieces(block: Block, piece: int = PIECE) -> Generator[bytes, None, None]:
    """Decode one block in pieces of at most ``piece`` bytes; corrupt, truncated or
    oversized blocks raise InvalidImage before a byte past the declared size is handed out."""
    decoder = lzma.LZMADecompressor(format=lzma.FORMAT_XZ, memlimit=XZ_MEMLIMIT)
    total = 0
    try:
        for data in _feed(block):
            if decoder.eof:
                raise InvalidImage("xz block has data after its end")
            out = decoder.decompress(data, max_length=piece)
            while True:
                total += len(out)
                if total > block.uncompressed:
                    raise InvalidImage("xz block decodes to more than its header declares")
                if out:
                    yield out
                if decoder.eof or decoder.needs_input:
                    break
                out = decoder.decompress(b"", max_length=piece)
    except lzma.LZMAError as exc:
        raise InvalidImage(f"xz block is corrupt: {exc}") from exc
    if not decoder.eof:
        raise InvalidImage("xz block is truncated")
    if total != block.uncompressed:
        raise InvalidImage("xz block decoded to a size other than its header declares")


class _Input:
    """The compressed input as a queue of views of the source chunks: blocks are cut out of it
    without copying, and a chunk is freed once no block in flight refers to it."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._views: deque[memoryview] = deque()
        self.size = 0  # bytes buffered

    def fill(self, n: int) -> bool:
        while self.size < n:
            nxt = next(self._chunks, None)
            if nxt is None:
                return False
            if nxt:
                self._views.append(memoryview(nxt))
                self.size += len(nxt)
        return True

    def peek(self, n: int) -> bytes:
        """A copy of the first ``n`` buffered bytes (headers: small)."""
        return b"".join(self.views(n))

    def views(self, n: int) -> tuple[memoryview, ...]:
        out: list[memoryview] = []
        for view in self._views:
            if n <= 0:
                break
            out.append(view[:n])
            n -= len(out[-1])
        return tuple(out)

    def skip(self, n: int) -> None:
        self.size -= n
        while n:
            view = self._views[0]
            if len(view) > n:
                self._views[0] = view[n:]
                return
            self._views.popleft()
            n -= len(view)

    def take(self, n: int) -> tuple[memoryview, ...]:
        parts = self.views(n)
        self.skip(n)
        return parts

    def varint(self) -> tuple[int, int]:
        """Consume one size field of an index: (value, length in bytes)."""
        self.fill(9)
        try:
            value, length = _varint(self.peek(9), 0)
        except IndexError:
            raise InvalidImage("xz index is truncated") from None
        self.skip(length)
        return value, length

    def rest(self) -> Iterator[bytes]:
        while self._views:
            view = self._views.popleft()
            self.size -= len(view)
            yield bytes(view)
        yield from self._chunks


class XzBlocks:
    """A .xz input cut into independently decodable blocks, with each block's output offset.

    ``splittable`` and ``head`` only look (so the caller can still choose ``rest``, the
    untouched compressed stream, for a sequential decoder); ``blocks`` consumes."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._in = _Input(chunks)

    def _first_header(self) -> bytes | None:
        inp = self._in
        if not inp.fill(STREAM_HEADER + 1) or not inp.peek(6) == _MAGIC:
            return None
        first = inp.peek(STREAM_HEADER + 1)[STREAM_HEADER]
        if first == 0 or not inp.fill(STREAM_HEADER + (first + 1) * 4):
            return None  # an empty stream, or too short: the sequential decoder says why
        return inp.peek(STREAM_HEADER + (first + 1) * 4)[STREAM_HEADER:]

    def first_size(self) -> int | None:
        """The first block's uncompressed size, if it declares one small enough to split."""
        header = self._first_header()
        sizes = block_sizes(header) if header is not None else None
        if sizes is None or sizes[1] > MAX_PARALLEL_BLOCK:
            return None
        return sizes[1]

    def head(self, n: int) -> bytes:
        """Up to ``n`` decoded bytes of the first block (to sniff what the xz holds); the input
        is not consumed. Call only when ``first_size`` is not None."""
        header = self._in.peek(STREAM_HEADER)
        block = _cut_block(self._in, header, 0, consume=False)
        out = bytearray()
        pieces = block_pieces(block, piece=n)
        for piece in pieces:
            out += piece
            if len(out) >= n:
                break
        pieces.close()
        return bytes(out[:n])

    def blocks(self) -> Iterator[Block]:
        """Every block of every concatenated stream, in order."""
        inp, offset = self._in, 0
        while inp.fill(STREAM_HEADER):
            if inp.peek(4) == b"\x00" * 4:
                inp.skip(4)  # stream padding
                continue
            header = inp.peek(STREAM_HEADER)
            if not header.startswith(_MAGIC):
                raise InvalidImage("xz stream has garbage where a stream header should be")
            if header[7] & 0x0F not in _CHECK_SIZES:
                raise UnsupportedFormat(f"xz check type {header[7] & 0x0F} is not supported")
            inp.skip(STREAM_HEADER)
            for block in _stream_blocks(inp, header, offset):
                offset = block.end
                yield block

    def rest(self) -> Iterator[bytes]:
        return self._in.rest()


def _stream_blocks(inp: _Input, header: bytes, offset: int) -> Iterator[Block]:
    while True:
        if not inp.fill(1):
            raise InvalidImage("xz stream is truncated before its index")
        if inp.peek(1) == b"\x00":  # index indicator: skip index and footer
            _skip_index(inp)
            return
        block = _cut_block(inp, header, offset, consume=True)
        offset = block.end
        yield block


def _cut_block(inp: _Input, header: bytes, offset: int, *, consume: bool) -> Block:
    """The block at the front of ``inp`` (after the stream header when not consuming)."""
    skip = 0 if consume else STREAM_HEADER
    if not inp.fill(skip + 1):
        raise InvalidImage("xz stream is truncated inside a block header")
    hsize = (inp.peek(skip + 1)[skip] + 1) * 4
    if not inp.fill(skip + hsize):
        raise InvalidImage("xz stream is truncated inside a block header")
    sizes = block_sizes(inp.peek(skip + hsize)[skip:])
    if sizes is None or sizes[1] > MAX_PARALLEL_BLOCK:
        raise UnsupportedFormat(
            "xz file mixes blocks with and without size fields, or has huge blocks; "
            "recompress it with xz -T0"
        )
    compressed, uncompressed = sizes
    if compressed > max_compressed(uncompressed):  # would be buffered whole: refuse it first
        raise InvalidImage("xz block declares more compressed bytes than its content can take")
    check = _CHECK_SIZES[header[7] & 0x0F]
    total = hsize + compressed + (-compressed % 4) + check
    if not inp.fill(skip + total):
        raise InvalidImage("xz stream is truncated inside a block")
    if consume:
        parts: tuple[memoryview, ...] = (_copy(inp.take(total)),)
    else:
        parts = _drop(inp.views(skip + total), skip)
    return Block(header, parts, hsize + compressed + check, uncompressed, offset)


def _copy(views: tuple[memoryview, ...]) -> memoryview:
    """The block in an anonymous mapping of its own. A view would pin whole source chunks
    while the block waits; a malloc'd copy (sizes from KBs to MBs, freed on another thread)
    fragments the allocator's arenas. A mapping is returned to the system when released."""
    size = sum(len(view) for view in views)
    buf = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for view in views:
        buf.write(view)
    return memoryview(buf)[:size]


def _drop(parts: tuple[memoryview, ...], n: int) -> tuple[memoryview, ...]:
    out = []
    for part in parts:
        cut = min(n, len(part))
        n -= cut
        if cut < len(part):
            out.append(part[cut:])
    return tuple(out)


def _skip_index(inp: _Input) -> None:
    """Consume the index and the stream footer (each block's sizes and check were verified).
    Read field by field, so a huge index costs no quadratic copying."""
    inp.skip(1)  # index indicator
    count, length = inp.varint()
    length += 1
    for _ in range(count * 2):
        length += inp.varint()[1]
    tail = -length % 4 + 4 + 12  # padding, CRC32, stream footer
    if not inp.fill(tail):
        raise InvalidImage("xz stream footer is truncated")
    if inp.peek(tail)[-2:] != b"YZ":
        raise InvalidImage("xz stream footer is corrupt")
    inp.skip(tail)


def max_compressed(uncompressed: int) -> int:
    """The most compressed bytes an LZMA2 block of ``uncompressed`` bytes can have: stored
    chunks add 3 bytes per 64 KiB, plus headers; a generous margin on top."""
    return uncompressed + uncompressed // 1024 + 64 * 1024


def _sequential(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``lzma.LZMAFile``'s reader (concatenated streams, padding) with a memory limit, which
    LZMAFile does not take."""
    from _compression import DecompressReader  # LZMAFile's own reader

    raw = DecompressReader(
        as_file(chunks),
        lzma.LZMADecompressor,
        trailing_error=lzma.LZMAError,
        format=lzma.FORMAT_XZ,
        memlimit=XZ_MEMLIMIT,
    )
    while piece := raw.read(CHUNK_SIZE):
        yield piece


def decode_xz(chunks: Iterator[bytes], workers: int | None = None) -> Iterator[bytes]:
    """Decode an .xz stream in order, block-parallel where the file allows it."""
    workers = workers or default_workers()
    xz = XzBlocks(chunks)
    if workers == 1 or xz.first_size() is None:
        yield from _sequential(xz.rest())
        return
    yield from decode_ordered(xz.blocks(), min(workers, ORDERED_WORKERS))


def _queue_pieces(block: Block, out: queue.SimpleQueue[object]) -> None:
    """Decode one block on a pool thread, handing out pieces as they appear (so the oldest
    block streams to the writer); the last item is ``_DONE`` or the exception that stopped it."""
    try:
        for piece in block_pieces(block):
            out.put(piece)
        out.put(_DONE)
    except BaseException as exc:  # re-raised on the consuming thread
        out.put(exc)


def decode_ordered(blocks: Iterator[Block], workers: int) -> Iterator[bytes]:
    """``workers`` blocks decode at once. The oldest block's pieces are handed on as they are
    decoded; younger blocks keep theirs until they become the oldest. The next block is
    submitted once the oldest is finished, so at most ``workers - 1`` decoded blocks wait in
    memory and every core stays busy."""
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="xz") as pool:

        def submit(block: Block) -> queue.SimpleQueue[object]:
            out: queue.SimpleQueue[object] = queue.SimpleQueue()
            pool.submit(_queue_pieces, block, out)
            return out

        pending = deque(submit(block) for block in itertools.islice(blocks, workers))
        while pending:
            out = pending.popleft()
            while (item := out.get()) is not _DONE:
                if isinstance(item, BaseException):
                    raise item
                assert isinstance(item, bytes)
                yield item
                del item
            block = next(blocks, None)
            if block is not None:
                pending.append(submit(block))


class Sink(Protocol):
    """Where one thread of ``decode_positioned`` writes (a ``RawWriter`` lane)."""

    def write_at(self, offset: int, data: bytes) -> None: ...


def decode_positioned(
    blocks: Iterator[Block], sinks: Sequence[Sink], room: Callable[[int], None]
) -> int:
    """Decode ``len(sinks)`` blocks at once, each written in place by the thread that decodes
    it through a sink of its own (lanes share nothing mutable, so no locks). ``room(end)`` is
    asked before a block is submitted: a bomb stops before any of its bytes is written. A
    block is cut from the input only once a thread is free for it (the input is already
    buffered by the stage, so cutting is a copy), so at most ``len(sinks)`` are held.
    Returns the decoded size. On failure the other threads stop at their next piece and are
    waited for: nothing writes to the target after this returns or raises."""
    free: queue.SimpleQueue[Sink] = queue.SimpleQueue()
    for sink in sinks:
        free.put(sink)
    stop = threading.Event()
    end = 0
    with ThreadPoolExecutor(max_workers=len(sinks), thread_name_prefix="xz") as pool:
        running: set[Future[None]] = set()
        try:
            while True:
                running = _wait_for_slot(running, len(sinks))  # cut no block before it can run
                block = next(blocks, None)
                if block is None:
                    break
                room(block.end)
                end = block.end
                running.add(pool.submit(_write_block, block, free, stop))
                del block
            _wait_for_slot(running, 1)
        except BaseException:
            stop.set()
            raise
    return end


def _wait_for_slot(running: set[Future[None]], limit: int) -> set[Future[None]]:
    """Wait until fewer than ``limit`` jobs run; re-raise the first failure."""
    while len(running) >= limit and running:
        done, not_done = wait(running, return_when=FIRST_COMPLETED)
        running = set(not_done)
        for future in done:
            future.result()
    return running


def _write_block(block: Block, free: queue.SimpleQueue[Sink], stop: threading.Event) -> None:
    sink = free.get()  # never waits: at most len(sinks) jobs run
    try:
        at = block.offset
        for piece in block_pieces(block):
            if stop.is_set():
                return
            sink.write_at(at, piece)
            at += len(piece)
    finally:
        free.put(sink)
