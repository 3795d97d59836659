"""Safe, streaming extraction of a tar archive into the volume root (contentType: archive).

Every member is checked before anything is written: no absolute paths, no ``..``, no links that
resolve outside the destination, no device nodes or FIFOs, and the declared sizes must fit the
volume. Python's ``data`` extraction filter runs as well, as a second line, and owners are not
restored (CDI runs tar with ``--no-same-owner``).

Checks made member by member cannot see the future: ``a -> b/..`` is inside the volume while
``b`` does not exist, and escapes once a later member makes ``b`` a link to ``.``. So when the
extraction ends, successfully or not, every symlink in the tree is resolved and any that leads
outside is removed; on success that fails the import (``UnsafeImage``). Members are also
bounded in number, and pax / GNU long-name headers in size (tarfile reads those whole into
memory, so an attacker-declared 8 GB header would be an 8 GB allocation). File data is copied
in large pieces straight from the stream's chunks (``decode.tarcopy``). Every failure is a
typed error: a hard link to a missing member or an ``OSError`` while writing is ``InvalidImage``.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import tarfile
from collections.abc import Iterator

from cdi.api.errors import InsufficientSpace, InvalidImage, UnsafeImage
from datapath.decode.tarcopy import StreamingTar
from datapath.streams import IterReader

# tarfile keeps every member's TarInfo (~350 bytes plus its names) until the end, for hard
# links: members and the bytes of their names are both bounded (docs/importer.md, memory table).
MAX_MEMBERS = 250_000  # a distribution's root has ~100,000 files; a million tiny ones is an attack
MAX_NAME_BYTES = 32 * 1024 * 1024  # names, link names and pax records of all members together
MAX_HEADER_BYTES = 1 << 20  # pax and GNU long-name headers (names, xattrs), held in memory


class _BoundedTarInfo(tarfile.TarInfo):
    """Refuses extended headers larger than ``MAX_HEADER_BYTES`` before tarfile reads them."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        extended = (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE)
        if (self.type in extended or self.type in (tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE)) and (
            self.size > MAX_HEADER_BYTES
        ):
            raise UnsafeImage(
                f"archive header of {self.size} bytes exceeds the {MAX_HEADER_BYTES}-byte limit"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def _inside(root: str, relative: str) -> bool:
    target = posixpath.normpath(posixpath.join(root, relative))
    return target == root or target.startswith(root.rstrip("/") + "/")


def check_member(member: tarfile.TarInfo) -> None:
    """Raise UnsafeImage if extracting ``member`` could touch anything outside the volume."""
    name = member.name
    if "\0" in name or "\0" in member.linkname:
        raise UnsafeImage(f"archive member {name!r} has a NUL byte in its name or link")
    if name.startswith("/") or posixpath.isabs(name):
        raise UnsafeImage(f"archive member {name!r} has an absolute path")
    if ".." in name.split("/"):
        raise UnsafeImage(f"archive member {name!r} climbs out of the volume with '..'")
    if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
        raise UnsafeImage(f"archive member {name!r} is a device node or FIFO")
    if member.issym():
        if member.linkname.startswith("/"):
            raise UnsafeImage(f"symlink {name!r} points to an absolute path {member.linkname!r}")
        link_dir = posixpath.dirname(name)
        if not _inside("/vol", posixpath.join(link_dir, member.linkname)):
            raise UnsafeImage(f"symlink {name!r} points outside the volume ({member.linkname!r})")
    if member.islnk() and (member.linkname.startswith("/") or not _inside("/vol", member.linkname)):
        raise UnsafeImage(f"hard link {name!r} points outside the volume ({member.linkname!r})")


def extract_tar(
    chunks: Iterator[bytes], dest: str, capacity: int | None, *, max_members: int = MAX_MEMBERS
) -> int:
    """Extract a tar stream into ``dest``; return the number of file bytes written."""
    try:
        total = _extract_members(chunks, dest, capacity, max_members)
    except BaseException:
        _remove_escaping_links(dest)
        raise
    escaping = _remove_escaping_links(dest)
    if escaping:
        raise UnsafeImage(
            f"archive links lead outside the volume once all members are in place: {escaping[:5]}"
        )
    return total


def _extract_members(
    chunks: Iterator[bytes], dest: str, capacity: int | None, max_members: int
) -> int:
    total = count = names = 0
    try:
        reader = IterReader(chunks)
        with StreamingTar.open(fileobj=reader, mode="r|", tarinfo=_BoundedTarInfo) as tar:
            for member in tar:
                count += 1
                if count > max_members:
                    raise UnsafeImage(f"archive has more than {max_members} members")
                names += _name_bytes(member)
                if names > MAX_NAME_BYTES:
                    raise UnsafeImage(f"archive member names exceed {MAX_NAME_BYTES} bytes")
                check_member(member)
                total += member.size if member.isfile() else 0
                if capacity is not None and total > capacity:
                    raise InsufficientSpace(
                        f"archive contents exceed the volume's usable size of {capacity} bytes"
                    )
                _ensure_no_symlink_parent(dest, member.name)
                _extract_one(tar, member, dest)
    except tarfile.FilterError as exc:
        raise UnsafeImage(f"archive member refused: {exc}") from exc
    except tarfile.TarError as exc:
        raise InvalidImage(f"archive is corrupt or truncated: {exc}") from exc
    return total


def _name_bytes(member: tarfile.TarInfo) -> int:
    """What a member's names keep in memory until the extraction ends."""
    pax = sum(len(k) + len(v) for k, v in member.pax_headers.items())
    return len(member.name) + len(member.linkname) + pax


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: str) -> None:
    try:
        tar.extract(member, dest, set_attrs=True, filter="data")
    except KeyError as exc:  # tarfile's way of saying a hard link's target is not in the archive
        raise InvalidImage(
            f"hard link {member.name!r} points to {member.linkname!r}, which is not in the archive"
        ) from exc
    except OSError as exc:
        raise InvalidImage(
            f"archive member {member.name!r} cannot be written: {exc.strerror}"
        ) from exc


def _remove_escaping_links(dest: str) -> list[str]:
    """Remove every symlink under ``dest`` that resolves outside it; return their names."""
    root = os.path.realpath(dest)
    found = []
    for folder, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                continue
            resolved = os.path.realpath(path)
            if resolved != root and not resolved.startswith(root + os.sep):
                found.append(os.path.relpath(path, dest))
                with contextlib.suppress(OSError):
                    os.unlink(path)
    return found


def _ensure_no_symlink_parent(dest: str, name: str) -> None:
    """A member must not be written through a symlink an earlier member planted."""
    path = dest
    for part in name.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise UnsafeImage(f"archive member {name!r} would be written through a symlink")
