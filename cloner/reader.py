"""What the clone source sends: the volume's bytes, read the cheap way.

- a block volume: the device's data, read straight and sent as frames of its non-zero pages
  (``blockdevice-clone-sparse``, ``datapath.decode.sparseraw``): a device cannot say where its
  holes are, so the all-zero pages are found here and never travel (CDI sends them all);
- a filesystem volume for a filesystem target: a PAX tar of its entries but ``lost+found``
  (``filesystem-clone``, as CDI's ``tar -S``): headers from ``tarfile.TarInfo``, data read
  straight into the stream (no thread, no pipe, no buffer copies).
  A file with holes (``disk.img``) becomes a PAX 1.0 sparse member: its map, then only its data
  extents (found with ``SEEK_DATA``/``SEEK_HOLE``) less their all-zero pages, so holes and
  zeros never travel and stay holes;
- a filesystem volume for a block target (``CLONE_STREAM=raw``): ``disk.img`` alone, as the
  block volume's frames; its holes (``SEEK_HOLE``) are skipped without being read.

Every reader yields pieces of at most ``CHUNK_SIZE`` (the data path's one chunk size) plus
small frame headers, and moves the payload's ``Progress`` (bytes of the volume covered, against
the device's size or the files' data bytes): the clone's progress on the DataVolume.
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
from datapath.decode.sparseraw import end_frame, frames_of
from datapath.streams import CHUNK_SIZE
from datapath.taps import Progress
from datapath.target.zeros import page_segments


@dataclass(frozen=True)
class Payload:
    """The stream to send: its content type, its length (None: unknown), its pieces and how
    far they have got (``progress.done`` of ``progress.total``)."""

    content_type: ContentType
    length: int | None
    pieces: Iterator[bytes | memoryview]
    progress: Progress


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


def sparse_pieces(fd: int, size: int, progress: Progress) -> Iterator[bytes | memoryview]:
    """The frames of ``[0, size)``: data extents read in chunks, their zero pages left out,
    holes skipped unread; then the end frame."""
    for offset, length, is_data in extents(fd, size):
        end = offset + length
        while is_data and offset < end:
            piece = os.pread(fd, min(CHUNK_SIZE, end - offset), offset)
            if not piece:
                raise SourceNotFound(f"the source ended at {offset} of {size} bytes")
            yield from frames_of(piece, offset)
            offset += len(piece)
            progress.done = offset
        progress.done = end
    yield end_frame(size)


def open_raw(path: str) -> Payload:
    """The sparse frames of a device or a disk image file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError as exc:
        raise SourceNotFound(f"clone source {path} does not exist") from exc
    size = _size(fd)
    progress = Progress(total=size)

    def pieces() -> Iterator[bytes | memoryview]:
        try:
            yield from sparse_pieces(fd, size, progress)
        finally:
            os.close(fd)

    return Payload(ContentType.BLOCKDEVICE_CLONE_SPARSE, None, pieces(), progress)


def _file_pieces(fd: int, spans: list[tuple[int, int]], progress: Progress) -> Iterator[bytes]:
    for offset, length in spans:
        end = offset + length
        while offset < end:
            piece = os.pread(fd, min(CHUNK_SIZE, end - offset), offset)
            if not piece:
                raise SourceNotFound(f"the source shrank while it was read (at {offset})")
            yield piece
            offset += len(piece)
            progress.add(len(piece))


def _header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")


def _padding(size: int) -> bytes:
    return bytes(-size % tarfile.BLOCKSIZE)


def nonzero_spans(fd: int, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The parts of ``spans`` that are not all-zero 4 KiB pages: a file's allocated extents
    often hold zeros (ext4 images do: 160 MB of the OS image's 761 MB), which need not travel
    and are left as holes, as ``cp --sparse=always`` does. Costs one more read of the data,
    from the page cache the send then reads again."""
    out: list[tuple[int, int]] = []
    for offset, length in spans:
        end = offset + length
        while offset < end:
            chunk = os.pread(fd, min(CHUNK_SIZE, end - offset), offset)
            if not chunk:
                raise SourceNotFound(f"the source shrank while it was read (at {offset})")
            for a, b, zero in page_segments(chunk, offset):
                if zero:
                    continue
                if out and out[-1][0] + out[-1][1] == offset + a:
                    out[-1] = (out[-1][0], out[-1][1] + b - a)
                else:
                    out.append((offset + a, b - a))
            offset += len(chunk)
    return out


def file_member(path: Path, info: tarfile.TarInfo, progress: Progress) -> Iterator[bytes]:
    """A regular file's member; one with holes as a PAX 1.0 sparse member (GNU tar's ``-S``,
    which tarfile and GNU tar extract with the holes left holes): its map, then only its data
    extents."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        if os.fstat(fd).st_blocks * 512 >= size:
            info.size = size
            yield _header(info)
            yield from _file_pieces(fd, [(0, size)], progress)
            yield _padding(size)
            return
        allocated_spans = [(o, n) for o, n, is_data in extents(fd, size) if is_data and n]
        data = nonzero_spans(fd, allocated_spans)
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
        yield from _file_pieces(fd, data, progress)
        yield _padding(info.size)
        progress.add(sum(n for _, n in allocated_spans) - sum(n for _, n in data))  # zeros: covered
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


def data_bytes(root: Path) -> int:
    """About the file data a tar of ``root`` carries (the progress total): each regular file's
    allocated bytes, at most its size (what its data extents add up to, within a block)."""
    total = 0
    for path, _ in _entries(root):
        st = path.lstat()
        if stat.S_ISREG(st.st_mode):
            total += min(st.st_size, st.st_blocks * 512)
    return total


def tar_pieces(root: Path, progress: Progress) -> Iterator[bytes]:
    """A PAX tar of ``root``'s entries, made as it is sent: no thread, no copy of the data."""
    for path, name in _entries(root):
        st = path.lstat()
        info = tarfile.TarInfo(name)
        info.mode, info.mtime = st.st_mode & 0o7777, int(st.st_mtime)
        info.uid, info.gid = st.st_uid, st.st_gid
        if stat.S_ISREG(st.st_mode):
            yield from file_member(path, info, progress)
        elif stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            yield _header(info)
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
            yield _header(info)
        # sockets, FIFOs and device nodes are not part of an image: left out
    yield bytes(2 * tarfile.BLOCKSIZE)


def open_source(mount_point: str, block: bool, raw: bool) -> Payload:
    """A block source is sent as sparse frames; a filesystem source as a sparse tar of its
    files (CDI's ``filesystem-clone``), or, ``raw``, its ``disk.img`` alone (for a block
    target)."""
    if block:
        return open_raw(mount_point)
    if raw:
        return open_raw(str(Path(mount_point) / "disk.img"))
    root = Path(mount_point)
    try:
        progress = Progress(total=data_bytes(root))
    except OSError as exc:
        raise SourceNotFound(f"clone source {mount_point} cannot be read: {exc.strerror}") from exc
    return Payload(ContentType.FILESYSTEM_CLONE, None, tar_pieces(root, progress), progress)
