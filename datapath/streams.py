"""Small adapters between iterators of byte chunks and the file-like objects libraries want.

The decode stage is written as a chain of pure transforms ``Iterator[bytes] -> Iterator[bytes]``
(no sockets, no files), so each can be unit-tested with a list of chunks. Some libraries only
offer bounded-output decoding through a pull-style reader (zstandard's ``stream_reader``, isal's
``IGzipFile``), so ``IterReader`` presents an iterator as a read-only file.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import IO, cast

# One chunk-size constant for the whole data plane (perf-baselines T6a: 4 MiB reads are the
# fastest for raw over aiohttp, and within 10% for compressed inputs).
CHUNK_SIZE = 4 * 1024 * 1024


class IterReader(io.RawIOBase):
    """A read-only, non-seekable file over an iterator of byte chunks."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = memoryview(b"")
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._buf:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._buf = memoryview(nxt)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self.consumed += n
        return n

    def read_view(self, n: int) -> memoryview:
        """Up to ``n`` bytes as a view of the current chunk (no copy); empty at the end."""
        while not self._buf:
            nxt = next(self._chunks, None)
            if nxt is None:
                return memoryview(b"")
            self._buf = memoryview(nxt)
        piece, self._buf = self._buf[:n], self._buf[n:]
        self.consumed += len(piece)
        return piece


def as_file(chunks: Iterator[bytes]) -> IO[bytes]:
    """``chunks`` as the binary file type that library signatures ask for."""
    return cast(IO[bytes], IterReader(chunks))


class Peekable:
    """An iterator of chunks whose first bytes can be inspected without being consumed."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._head: list[bytes] = []

    def peek(self, n: int) -> bytes:
        have = sum(len(c) for c in self._head)
        while have < n:
            nxt = next(self._chunks, None)
            if nxt is None:
                break
            if nxt:
                self._head.append(nxt)
                have += len(nxt)
        return b"".join(self._head)[:n]

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._head:
            return self._head.pop(0)
        return next(self._chunks)


def rechunk(chunks: Iterator[bytes], size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Yield the same bytes in pieces of at most ``size`` bytes."""
    for chunk in chunks:
        if len(chunk) <= size:
            yield chunk
            continue
        mv = memoryview(chunk)
        for off in range(0, len(chunk), size):
            yield bytes(mv[off : off + size])
