"""``blockdevice-clone-sparse``: a raw volume sent as its data extents only, and its decoder.

CDI's ``blockdevice-clone`` sends a block volume's bytes as they are, so a 2 GiB OS disk that
holds 600 MB of data crosses the TLS connection whole: both ends encrypt, decrypt and look at
1.4 GB of zeros that the target then leaves as holes anyway. A device cannot say where its
holes are (``SEEK_DATA`` fails on block devices), so our clone source finds the all-zero pages
itself (``datapath.target.zeros.page_segments``, the test the target's writer makes) and sends
only the rest, in frames:

    stream = frame* end
    frame  = offset:u64be length:u64be data[length]     length > 0, offset >= previous end
    end    = size:u64be 0:u64be                          size >= previous end; nothing after

Bytes between frames (and up to ``size``) read as zeros on the target: a hole in a file, and
on a block device the writer's zeroing (``RawWriter.skip_to``), exactly what a raw stream's zero
pages become. The stream is untrusted like any upload: frames going backwards, past the
target's capacity, truncated or followed by bytes are typed errors (``InvalidImage``,
``InsufficientSpace``). Data reaches the writer as views of the received chunks (no copy) and
unscanned: the sender already left the zero pages out; zero pages a sender keeps in are just
written, which costs space, never safety. A stream of raw CDI ``blockdevice-clone`` stays
accepted (``passthrough``): this type is chosen only by our cloner's header.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from cdi.api.errors import InvalidImage
from datapath.target import RawWriter
from datapath.target.zeros import page_segments

FRAME = struct.Struct("!QQ")


class _Frames:
    """The decoder's state between chunks: a header being assembled, or data still due."""

    def __init__(self, writer: RawWriter) -> None:
        self.writer = writer
        self.head = bytearray()
        self.at = 0  # where the next data byte of the current frame goes
        self.due = 0  # data bytes of the current frame not yet received
        self.size: int | None = None  # set by the end frame

    def feed(self, chunk: bytes) -> None:
        view, i, n = memoryview(chunk), 0, len(chunk)
        while i < n:
            if self.size is not None:
                raise InvalidImage("the sparse clone stream has bytes after its end frame")
            if self.due:
                take = min(self.due, n - i)
                self.writer.write_data_at(self.at, view[i : i + take])
                self.at, self.due, i = self.at + take, self.due - take, i + take
                continue
            take = min(FRAME.size - len(self.head), n - i)
            self.head += view[i : i + take]
            i += take
            if len(self.head) == FRAME.size:
                self._frame(*FRAME.unpack(self.head))
                self.head.clear()

    def _frame(self, offset: int, length: int) -> None:
        writer = self.writer
        if offset < writer.position:
            raise InvalidImage(
                f"the sparse clone stream goes back to byte {offset} after {writer.position}"
            )
        writer.skip_to(offset)
        if not length:
            self.size = offset
            return
        writer.ensure_room(offset + length)
        self.at, self.due = offset, length
        writer.position = offset + length

    def finish(self) -> int:
        if self.size is None or self.due or self.head:
            raise InvalidImage("the sparse clone stream was cut before its end frame")
        return self.size


def write_sparse(chunks: Iterator[bytes], writer: RawWriter) -> int:
    """Write a ``blockdevice-clone-sparse`` stream through ``writer``; the image's size."""
    frames = _Frames(writer)
    for chunk in chunks:
        frames.feed(chunk)
    return frames.finish()


def frames_of(chunk: bytes, offset: int) -> list[bytes | memoryview]:
    """The frames for ``chunk`` (at ``offset`` in the volume): its runs that are not all-zero
    pages, each a header and a view of the chunk; a chunk that is all data is two pieces and
    no copy. Many small runs are joined into one piece (one write, not two per run)."""
    runs = [(a, b) for a, b, zero in page_segments(chunk, offset) if not zero]
    if len(runs) == 1 and runs[0] == (0, len(chunk)):
        return [FRAME.pack(offset, len(chunk)), chunk]
    view = memoryview(chunk)
    parts: list[bytes | memoryview] = []
    for a, b in runs:
        parts += [FRAME.pack(offset + a, b - a), view[a:b]]
    if len(parts) > 4:
        return [b"".join(parts)]
    return parts


def end_frame(size: int) -> bytes:
    return FRAME.pack(size, 0)
