"""What the clone source sends: the volume's bytes, read the cheap way.

- a block volume: the device, read straight (``blockdevice-clone``);
- a filesystem volume for a filesystem target: a PAX tar of its entries but ``lost+found``
  (``filesystem-clone``, as CDI's ``tar -S``), written by ``tarfile`` on a thread into a pipe.
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


class _SparseData:
    """The stored bytes of a PAX 1.0 sparse member: the map block, then the data extents."""

    def __init__(self, fd: int, head: bytes, data: list[tuple[int, int]]) -> None:
        self.fd, self.head, self.data = fd, head, data
        self.pending = b""

    def read(self, n: int) -> bytes:
        """Exactly ``n`` bytes unless the member ends first (tarfile insists)."""
        parts, want = [], n
        while want > 0:
            if not self.pending and not self._refill():
                break
            piece, self.pending = self.pending[:want], self.pending[want:]
            parts.append(piece)
            want -= len(piece)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def _refill(self) -> bool:
        if self.head:
            self.pending, self.head = self.head, b""
            return True
        if not self.data:
            return False
        offset, length = self.data[0]
        take = min(length, CHUNK_SIZE)
        self.pending = os.pread(self.fd, take, offset)
        if len(self.pending) != take:
            raise SourceNotFound(f"the source shrank while it was read (at {offset})")
        self.data[0] = (offset + take, length - take)
        if self.data[0][1] == 0:
            self.data.pop(0)
        return True


def add_sparse(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    """Add a file with holes as a PAX 1.0 sparse member (GNU tar's ``-S``), which Python's
    tarfile and GNU tar extract with the holes left holes: only data extents travel."""
    st = path.stat()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        data = [(o, n) for o, n, is_data in extents(fd, st.st_size) if is_data and n]
        text = f"{len(data)}\n" + "".join(f"{o}\n{n}\n" for o, n in data)
        head = text.encode().ljust(-(-len(text) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE, b"\0")
        info = tarfile.TarInfo(f"GNUSparseFile.0/{arcname}")
        info.size = len(head) + sum(n for _, n in data)
        info.mode, info.mtime = st.st_mode & 0o7777, int(st.st_mtime)
        info.pax_headers = {
            "GNU.sparse.major": "1",
            "GNU.sparse.minor": "0",
            "GNU.sparse.name": arcname,
            "GNU.sparse.realsize": str(st.st_size),
        }
        tar.addfile(info, _SparseData(fd, head, data))  # type: ignore[arg-type]
    finally:
        os.close(fd)


def _add_tree(tar: tarfile.TarFile, root: Path, relative: str) -> None:
    path = root / relative if relative else root
    for entry in sorted(os.listdir(path)):
        if not relative and entry == "lost+found":
            continue
        name = f"{relative}/{entry}" if relative else entry
        full = root / name
        st = full.lstat()
        if full.is_file() and not full.is_symlink() and st.st_blocks * 512 < st.st_size:
            add_sparse(tar, full, name)
        elif full.is_dir() and not full.is_symlink():
            tar.add(full, arcname=name, recursive=False)
            _add_tree(tar, root, name)
        else:
            tar.add(full, arcname=name, recursive=False)


def tar_pieces(root: Path) -> Iterator[bytes]:
    """A PAX tar of ``root``'s entries (``lost+found`` excluded; files with holes as sparse
    members), made on a thread."""
    read_fd, write_fd = os.pipe()
    failure: list[BaseException] = []

    def write() -> None:
        try:
            with (
                os.fdopen(write_fd, "wb") as out,
                tarfile.open(
                    fileobj=out, mode="w|", format=tarfile.PAX_FORMAT, bufsize=CHUNK_SIZE
                ) as tar,
            ):
                tar.copybufsize = CHUNK_SIZE  # type: ignore[attr-defined]  # default: 16 KiB
                _add_tree(tar, root, "")
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


def open_source(mount_point: str, block: bool, raw: bool) -> Payload:
    """A block source is sent raw; a filesystem source as a sparse tar of its files (CDI's
    ``filesystem-clone``), or, ``raw``, its ``disk.img`` alone (for a block target)."""
    if block:
        return open_raw(mount_point)
    if raw:
        return open_raw(str(Path(mount_point) / "disk.img"))
    return Payload(ContentType.FILESYSTEM_CLONE, None, tar_pieces(Path(mount_point)))
