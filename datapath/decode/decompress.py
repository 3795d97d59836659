"""Decompression transforms: ``Iterator[bytes] -> Iterator[bytes]`` with bounded output pieces.

Every decoder is pull-driven and returns at most ``CHUNK_SIZE`` bytes per piece, because runs of
zeros expand more than 1000x: a single compressed megabyte can decode to gigabytes, so an
unbounded ``decompress(data)`` call is a memory bomb (perf-baselines 3.2). Library choices are
measured ones: isal inflates 3.4x faster than zlib; zstandard's ``stream_reader`` matches the
zstd CLI; multi-block xz is decoded block-parallel (``datapath.decode.xz_parallel``)
because lzma releases the GIL. Library exceptions are mapped once, here, to ``InvalidImage``.
"""

from __future__ import annotations

import bz2
import lzma
from collections.abc import Callable, Iterator

import zstandard
from isal import igzip

from cdi.api.errors import InvalidImage, WorkerError
from datapath.decode.xz_parallel import decode_xz
from datapath.decode.zstd_frames import checked_frames
from datapath.formats import ImageFormat
from datapath.streams import CHUNK_SIZE, IterReader, as_file

# The most memory a zstd frame may ask for its window: libzstd's default limit (windowLog 27),
# what the zstd CLI decodes without --memory; explicit, so the memory table can name it.
ZSTD_MAX_WINDOW = 128 * 1024 * 1024

_LIBRARY_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    ValueError,
    lzma.LZMAError,
    zstandard.ZstdError,
)


def _read_all(reader: Callable[[int], bytes]) -> Iterator[bytes]:
    while True:
        piece = reader(CHUNK_SIZE)
        if not piece:
            return
        yield piece


def _gzip(chunks: Iterator[bytes]) -> Iterator[bytes]:
    # IGzipFile handles multi-member files (pigz, bgzip) and checks each member's CRC32.
    yield from _read_all(igzip.IGzipFile(fileobj=IterReader(chunks), mode="rb").read)


def _bzip2(chunks: Iterator[bytes]) -> Iterator[bytes]:
    yield from _read_all(bz2.BZ2File(IterReader(chunks), mode="rb").read)


def _zstd(chunks: Iterator[bytes]) -> Iterator[bytes]:
    # stream_reader returns EOF quietly on a frame cut short: checked_frames catches that.
    src = as_file(checked_frames(chunks))
    reader = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW).stream_reader(
        src, read_size=1024 * 1024, read_across_frames=True
    )
    yield from _read_all(reader.read)
    src.read(1)  # drive the frame check to the end of the input


DECODERS: dict[ImageFormat, Callable[[Iterator[bytes]], Iterator[bytes]]] = {
    ImageFormat.GZIP: _gzip,
    ImageFormat.XZ: decode_xz,
    ImageFormat.ZSTD: _zstd,
    ImageFormat.BZIP2: _bzip2,
}


def decompress(fmt: ImageFormat, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Decode ``chunks`` compressed with ``fmt``; corrupt or truncated input raises InvalidImage."""
    decoder = DECODERS[fmt](chunks)
    while True:
        try:
            piece = next(decoder)
        except StopIteration:
            return
        except WorkerError:
            raise
        except _LIBRARY_ERRORS as exc:
            raise InvalidImage(f"{fmt.value} stream is corrupt or truncated: {exc}") from exc
        yield piece
