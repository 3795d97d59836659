"""Safe, streaming extraction of a tar archive into the volume root (contentType: archive).

Every member is checked before anything is written: no absolute paths, no ``..``, no links that
resolve outside the destination, no device nodes or FIFOs, and the declared sizes must fit the
volume. Python's ``data`` extraction filter runs as well, as a second line, and owners are not
restored (CDI runs tar with ``--no-same-owner``). That filter (PEP 706) came in Python 3.11.4;
the images' Python is Debian bookworm's 3.11.2, which has none, so there the same rules are
applied here (:func:`data_filtered`: the member inside the volume and its link target too,
no setuid/setgid/sticky or group/other write bits, owner read/write, the extracting user as
owner) before tarfile sees the member. The real node found this (a filesystem clone's upload
server failed with a ``TypeError`` where the process node, on a newer Python, passed).

Checks made member by member cannot see the future: ``a -> b/..`` is inside the volume while
``b`` does not exist, and escapes once a later member makes ``b`` a link to ``.``. So when the
extraction ends, successfully or not, every symlink in the tree is resolved and any that leads
outside is removed; on success that fails the import (``UnsafeImage``). Members are also
bounded in number and name bytes, and pax / GNU long-name headers in size (tarfile reads those
whole into memory, so an attacker-declared 8 GB header would be an 8 GB allocation; the bounds
are ``decode.tarbounds``', shared with the registry layer walk). File data is copied
in large pieces straight from the stream's chunks (``decode.tarcopy``). Every failure is a
typed error: a hard link to a missing member or an ``OSError`` while writing is ``InvalidImage``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import posixpath
import tarfile
from collections.abc import Iterator
from typing import TYPE_CHECKING

from cdi.api.errors import InsufficientSpace, InvalidImage, UnsafeImage
from datapath.decode.tarbounds import MAX_MEMBERS, BoundedTarInfo, TarBudget
from datapath.decode.tarcopy import StreamingTar
from datapath.streams import IterReader

if TYPE_CHECKING:
    from datapath.verify import WriteDigest

# PEP 706 (Python 3.11.4+): ``extract(filter="data")`` and its errors; None/() before it.
HAS_DATA_FILTER = hasattr(tarfile, "data_filter")
_FILTER_ERRORS: tuple[type[Exception], ...] = (
    (tarfile.FilterError,) if hasattr(tarfile, "FilterError") else ()
)


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
    chunks: Iterator[bytes],
    dest: str,
    capacity: int | None,
    *,
    max_members: int = MAX_MEMBERS,
    digests: dict[str, WriteDigest] | None = None,
    builtin_filter: bool = HAS_DATA_FILTER,
) -> int:
    """Extract a tar stream into ``dest``; return the number of file bytes written. With
    ``digests`` (a verified volume), each regular file's digest of what was written to it.
    ``builtin_filter``: use tarfile's ``data`` filter (where the Python has it) rather than
    :func:`data_filtered`."""
    try:
        total = _extract_members(chunks, dest, capacity, max_members, digests, builtin_filter)
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
    chunks: Iterator[bytes],
    dest: str,
    capacity: int | None,
    max_members: int,
    digests: dict[str, WriteDigest] | None,
    builtin: bool,
) -> int:
    total = 0
    budget = TarBudget(max_members)
    try:
        reader = IterReader(chunks)
        with StreamingTar.open(fileobj=reader, mode="r|", tarinfo=BoundedTarInfo) as tar:
            tar.digests = digests
            for member in tar:
                budget.count(member)
                check_member(member)
                total += member.size if member.isfile() else 0
                if capacity is not None and total > capacity:
                    raise InsufficientSpace(
                        f"archive contents exceed the volume's usable size of {capacity} bytes"
                    )
                _ensure_no_symlink_parent(dest, member.name)
                if digests is not None and not member.isreg():  # replaces a file of that name
                    digests.pop(os.path.join(dest, member.name), None)
                _extract_one(tar, member, dest, builtin)
    except _FILTER_ERRORS as exc:
        raise UnsafeImage(f"archive member refused: {exc}") from exc
    except tarfile.TarError as exc:
        raise InvalidImage(f"archive is corrupt or truncated: {exc}") from exc
    return total


def _extract_one(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: str, builtin: bool) -> None:
    try:
        if builtin:
            tar.extract(member, dest, set_attrs=True, filter="data")
        else:
            tar.extract(data_filtered(member, dest), dest, set_attrs=True)
    except KeyError as exc:  # tarfile's way of saying a hard link's target is not in the archive
        raise InvalidImage(
            f"hard link {member.name!r} points to {member.linkname!r}, which is not in the archive"
        ) from exc
    except OSError as exc:
        raise InvalidImage(
            f"archive member {member.name!r} cannot be written: {exc.strerror}"
        ) from exc


def data_filtered(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
    """``member`` as tarfile's ``data`` filter would pass it, for a Python without one:
    ``UnsafeImage`` if it or its link target would land outside ``dest`` (realpath, so a
    symlink already in place counts) or it is not a file, directory or link; else a copy
    with the mode stripped of setuid/setgid/sticky and group/other write (files: owner
    read/write, no execute unless the owner's; directories 0755) and the extracting user as
    owner (tar's ``--no-same-owner``)."""
    root = os.path.realpath(dest)

    def outside(path: str) -> bool:
        real = os.path.realpath(path)
        return os.path.commonpath([real, root]) != root

    if outside(os.path.join(root, member.name)):
        raise UnsafeImage(f"archive member {member.name!r} lands outside the volume")
    if member.issym() or member.islnk():
        base = os.path.dirname(member.name) if member.issym() else ""
        if os.path.isabs(member.linkname) or outside(os.path.join(root, base, member.linkname)):
            raise UnsafeImage(f"link {member.name!r} points outside the volume")
    mode = member.mode & 0o755
    if member.isreg() or member.islnk():
        mode = (mode if mode & 0o100 else mode & ~0o111) | 0o600
    elif member.isdir():
        mode = 0o755
    elif not member.issym():
        raise UnsafeImage(f"archive member {member.name!r} is not a file, directory or link")
    out = copy.copy(member)
    out.mode = mode
    out.uid, out.gid, out.uname, out.gname = os.geteuid(), os.getegid(), "", ""
    return out


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
