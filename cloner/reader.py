"""What the clone source sends: the volume's bytes, read the cheap way.

- a block volume: the device, read straight (``blockdevice-clone``);
- a filesystem volume for a filesystem target: a PAX tar of its entries but ``lost+found``
  (``filesystem-clone``, as CDI's ``tar -S``): headers from ``tarfile.TarInfo``, data read
  straight into the stream (no thread, no pipe, no buffer copies).
  A file with holes (``disk.img``) becomes a PAX 1.0 sparse member: its map, then only its data
  extents (found with ``SEEK_DATA``/``SEEK_HOLE``), so holes never travel and stay holes;
- a filesystem volume for a block target (``CLONE_STREAM=raw``): ``disk.img`` alone as the raw
  stream, holes sent as zero pieces made in memory (never read) that the target's zero
  detection leaves unwritten.

Every reader yields pieces of at most ``CHUNK_SIZE`` (the data path's one chunk size) and the
exact byte count is known up front for the raw streams, so their POST carries a
Content-Length (a tar goes chunked).
"""

from __future__ import annotations

import os
import stat
import tarfile
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


def _file_pieces(fd: int, spans: list[tuple[int, int]]) -> Iterator[bytes]:
    for offset, length in spans:
        end = offset + length
        while offset < end:
            piece = os.pread(fd, min(CHUNK_SIZE, end - offset), offset)
            if not piece:
                raise SourceNotFound(f"the source shrank while it was read (at {offset})")
            yield piece
            offset += len(piece)


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _padding(size: int) -> bytes:
    return bytes(-size % tarfile.BLOCKSIZE)


def file_member(path: Path, info: tarfile.TarInfo) -> Iterator[bytes]:
    """A regular file's member; one with holes as a PAX 1.0 sparse member (GNU tar's ``-S``,
    which tarfile and GNU tar extract with the holes left holes): its map, then only its data
    extents."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if os.fstat(fd).st_blocks * 512 >= size:
            info.size = size
            yield _header(info)
            yield from _file_pieces(fd, [(0, size)])
            yield _padding(size)
            return
        data = [(o, n) for o, n, is_data in extents(fd, size) if is_data and n]
        text = f"{len(data)}\n" + "".join(f"{o}\n{n}\n" for o, n in data)
        head = text.encode() + _padding(len(text))
        name = info.name
        info.name = f"GNUSparseFile.0/{name}"
        info.size = len(head) + sum(n for _, n in data)
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": name,
            "GNU.sparse.realsize": str(size),
        }
        yield _header(info) + head
        yield from _file_pieces(fd, data)
        yield _padding(info.size)
    finally:
        os.close(fd)


def _entries(root: Path, relative: str = "") -> Iterator[tuple[Path, str]]:
    """Every entry under ``root`` but the top ``lost+found``, parents first, sorted."""
    for entry in sorted(os.listdir(root / relative if relative else root)):
        if not relative and entry == "lost+found":
            continue
        name = f"{relative}/{entry}" if relative else entry
        yield root / name, name
        if (root / name).is_dir() and not (root / name).is_symlink():
            yield from _entries(root, name)


def tar_pieces(root: Path) -> Iterator[bytes]:
    """A PAX tar of ``root``'s entries, made as it is sent: no thread, no copy of the data."""
    for path, name in _entries(root):
        st = path.lstat()
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = st.st_mode & 0o7777, int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        if stat.S_ISREG(st.st_mode):
            yield from file_member(path, info)
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            yield _header(info)
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            yield _header(info)
        # sockets, FIFOs and device nodes are not part of an image: left out
    yield bytes(2 * tarfile.BLOCKSIZE)


def open_source(mount_point: str, block: bool, raw: bool) -> Payload:
    """A block source is sent raw; a filesystem source as a sparse tar of its files (CDI's
    ``filesystem-clone``), or, ``raw``, its ``disk.img`` alone (for a block target)."""
    if block:
        return open_raw(mount_point)
    if raw:
        return open_raw(str(Path(mount_point) / "disk.img"))
    return Payload(ContentType.FILESYSTEM_CLONE, None, tar_pieces(Path(mount_point)))
