"""Decompress one compressed qcow2 cluster exactly as qemu does, with bounded output.

qemu reads ``nb_sectors * 512 - (offset % 512)`` bytes for a compressed cluster, which usually
runs past the real compressed stream into the next cluster's data (or past the end of the
file), and accepts the cluster once exactly ``cluster_size`` bytes came out:
- deflate is raw (``wbits=-12``); the stream need not end once the output is full;
- zstd input may hold several frames, read until the cluster is full; the last frame read
  must end exactly there. Output is bounded by the cluster size before it is produced: a
  frame's declared content size is checked first and frames without one are fed in small
  slices, so a hostile "zip bomb" cluster cannot allocate more than a cluster or two.
Both functions also return how many input bytes the stream really used (0 if unknown), so
the decoder claims no more than that and keeps the overrun, which may be the head of the next
compressed cluster.
"""

from __future__ import annotations

import zstandard
from isal import isal_zlib

from cdi.api.errors import InvalidImage

_DEFLATE_WBITS = -12
_ZSTD_SLICE = 64  # at most a few 128 KiB blocks of output per call when size is unknown
_ZSTD = zstandard.ZstdDecompressor()


def inflate_cluster(data: bytes, cluster_size: int) -> tuple[bytes, int]:
    """Raw-deflate cluster: ``(cluster bytes, input bytes consumed)``."""
    inflater = isal_zlib.decompressobj(_DEFLATE_WBITS)
    try:
        out = inflater.decompress(data, cluster_size)
    except isal_zlib.error as exc:  # type: ignore[misc]
        raise InvalidImage(f"corrupt deflate cluster: {exc}") from None
    if len(out) != cluster_size:
        raise InvalidImage(f"deflate cluster gave {len(out)} bytes, not {cluster_size}")
    if not inflater.eof:
        # The output filled up before the end-of-stream code was read (qemu accepts that):
        # the stream's real length is unknown, so claim none of the input.
        return out, 0
    return out, len(data) - len(inflater.unused_data)


def zstd_cluster(data: bytes, cluster_size: int) -> tuple[bytes, int]:
    """zstd cluster (one or more frames): ``(cluster bytes, input bytes consumed)``."""
    parts: list[bytes] = []
    got = pos = 0
    while got < cluster_size:
        part, used = _zstd_frame(data, pos, cluster_size - got)
        if not part and used == 0:
            raise InvalidImage("zstd cluster makes no progress")
        parts.append(part)
        got += len(part)
        pos += used
    return b"".join(parts), pos


def _zstd_frame(data: bytes, pos: int, room: int) -> tuple[bytes, int]:
    """Decode the frame at ``pos``: ``(output, input used)``; it must end within ``room``."""
    rest = data[pos:]
    try:
        declared = zstandard.frame_content_size(rest)
        if declared > room:
            raise InvalidImage(f"zstd frame of {declared} bytes overflows the cluster")
        if declared >= 0:
            frame = _ZSTD.decompressobj()
            out = frame.decompress(rest)
            if not frame.eof:
                raise InvalidImage("zstd frame is truncated")
            return out, len(rest) - len(frame.unused_data)
        return _bounded(rest, room)
    except zstandard.ZstdError as exc:
        raise InvalidImage(f"corrupt zstd cluster: {exc}") from None


def _bounded(rest: bytes, room: int) -> tuple[bytes, int]:
    """A frame without a declared size, fed in slices so output stays near ``room``."""
    frame = _ZSTD.decompressobj()
    parts: list[bytes] = []
    got = 0
    for i in range(0, len(rest), _ZSTD_SLICE):
        piece = rest[i : i + _ZSTD_SLICE]
        out = frame.decompress(piece)
        parts.append(out)
        got += len(out)
        if got > room:
            raise InvalidImage("zstd frame overflows the cluster")
        if frame.eof:
            return b"".join(parts), i + len(piece) - len(frame.unused_data)
    raise InvalidImage("zstd frame is truncated")
