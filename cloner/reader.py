"""What the clone source sends: the volume's bytes, read the cheap way.

- a block volume: the device, read straight (``blockdevice-clone``);
- a filesystem volume holding a disk image: ``disk.img``, sent as the same raw stream, so a
  filesystem source can fill a block target and the other way round. The file is walked with
  ``SEEK_DATA``/``SEEK_HOLE``: holes become zero pieces made in memory, never read from disk,
  and the target's zero detection (``datapath``'s writer) leaves them holes again, so the copy
  is as sparse as its source;
- a filesystem volume holding files (contentType archive): a tar of its entries but
  ``lost+found`` (``filesystem-clone``), written by ``tarfile`` on a thread into a pipe.

Every reader yields pieces of at most ``CHUNK_SIZE`` (the data path's one chunk size) and the
exact byte count is known up front for the raw kinds, so the POST carries a Content-Length.
"""

from __future__ import annotations

import os
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cdi.api.constants import ContentType
from cdi.api.errors import SourceNotFound
from datapath.streams import CHUNK_SIZE

ZEROS = bytes(CHUNK_SIZE)


@dataclass(frozen=True)
class Payload:
    """The stream to send: its content type, its length (None: unknown) and its pieces."""

    content_type: ContentType
    length: int | None
    pieces: Iterator[bytes]


def _size(fd: int) -> int:
    return os.lseek(fd, 0, os.SEEK_END)


def extents(fd: int, size: int) -> Iterator[tuple[int, int, bool]]:
    """``(offset, length, is_data)`` runs covering ``[0, size)``; one data run when the file
    system cannot say where the holes are (or for a device)."""
    offset = 0
    while offset < size:
        try:
            data = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole up to the end; EINVAL: no hole support
            if offset == 0 and not _has_holes(fd):
                yield 0, size, True
                return
            yield offset, size - offset, False
            return
        if data > offset:
            yield offset, data - offset, False
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        yield data, hole - data, True
        offset = hole


def _has_holes(fd: int) -> bool:
    try:
        os.lseek(fd, 0, os.SEEK_HOLE)
    except OSError:
        return False
    return True


def raw_pieces(fd: int, size: int) -> Iterator[bytes]:
    for offset, length, is_data in extents(fd, size):
        end = offset + length
        while offset < end:
            n = min(CHUNK_SIZE, end - offset)
            if is_data:
                piece = os.pread(fd, n, offset)
                if not piece:
                    raise SourceNotFound(f"the source ended at {offset} of {size} bytes")
            else:
                piece = ZEROS[:n]
            yield piece
            offset += len(piece)


def open_raw(path: str) -> Payload:
    """The raw stream of a device or a disk image file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        raise SourceNotFound(f"clone source {path} does not exist") from exc
    size = _size(fd)

    def pieces() -> Iterator[bytes]:
        try:
            yield from raw_pieces(fd, size)
        finally:
            os.close(fd)

    return Payload(ContentType.BLOCKDEVICE_CLONE, size, pieces())


def tar_pieces(root: Path) -> Iterator[bytes]:
    """A tar of ``root``'s entries (``lost+found`` excluded), made on a thread."""
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with os.fdopen(write_fd, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
                for entry in sorted(os.listdir(root)):
                    if entry != "lost+found":
                        tar.add(root / entry, arcname=entry)
        except BaseException as exc:  # reported to the reader below
            failure.append(exc)

    writer = threading.Thread(target=write, name="clone-tar", daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as pipe:
        while piece := pipe.read(CHUNK_SIZE):
            yield piece
    writer.join()
    if failure:
        raise SourceNotFound(f"reading the source volume failed: {failure[0]}")


def open_source(mount_point: str, block: bool, archive: bool) -> Payload:
    if block:
        return open_raw(mount_point)
    if archive:
        return Payload(ContentType.FILESYSTEM_CLONE, None, tar_pieces(Path(mount_point)))
    return open_raw(str(Path(mount_point) / "disk.img"))
