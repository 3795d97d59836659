"""Drive any sans-I/O stream decoder (qcow2, vdi, vmdk) over an image in a given chunking and
assemble the raw disk, checking the write contract on the way: writes are non-empty bytes (or
zero-copy views of the chunks fed), never overlap and never all zeros."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol


class Decoder(Protocol):
    virtual_size: int | None

    def feed(self, data: bytes) -> Iterable[tuple[int, bytes | memoryview]]: ...

    def finish(self) -> Iterable[tuple[int, bytes | memoryview]]: ...


def decode_stream(decoder: Decoder, image: bytes, chunks: int | list[int] = 65536) -> bytes:
    """Feed ``image`` in the given chunking; return the raw disk, checking the write contract."""
    writes: list[tuple[int, bytes | memoryview]] = []
    pos = 0
    sizes = iter(chunks) if isinstance(chunks, list) else None
    while pos < len(image):
        step = next(sizes, 4096) if sizes is not None else chunks
        assert isinstance(step, int)
        writes += decoder.feed(memoryview(image)[pos : pos + step])  # type: ignore[arg-type]
        pos += step
    writes += decoder.finish()
    assert decoder.virtual_size is not None
    disk = bytearray(decoder.virtual_size)
    end = 0
    for offset, data in sorted(writes, key=lambda write: write[0]):
        assert isinstance(data, bytes | memoryview) and len(data) and offset >= end
        assert bytes(data).count(0) != len(data), "an all-zero write"
        disk[offset : offset + len(data)] = data
        end = offset + len(data)
    return bytes(disk)
