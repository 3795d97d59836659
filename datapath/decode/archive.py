"""Safe, streaming extraction of a tar archive into the volume root (contentType: archive).

Every member is checked before anything is written: no absolute paths, no ``..``, no links that
resolve outside the destination, no device nodes or FIFOs, and the declared sizes must fit the
volume. Python's ``data`` extraction filter runs as well, as a second line, and owners are not
restored (CDI runs tar with ``--no-same-owner``).
"""

from __future__ import annotations

import os
import posixpath
import tarfile
from collections.abc import Iterator

from cdi.api.errors import InsufficientSpace, InvalidImage, UnsafeImage
from datapath.streams import IterReader


def _inside(root: str, relative: str) -> bool:
    target = posixpath.normpath(posixpath.join(root, relative))
    return target == root or target.startswith(root.rstrip("/") + "/")


def check_member(member: tarfile.TarInfo) -> None:
    """Raise UnsafeImage if extracting ``member`` could touch anything outside the volume."""
    name = member.name
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


def extract_tar(chunks: Iterator[bytes], dest: str, capacity: int | None) -> int:
    """Extract a tar stream into ``dest``; return the number of file bytes written."""
    total = 0
    try:
        with tarfile.open(fileobj=IterReader(chunks), mode="r|") as archive:
            for member in archive:
                check_member(member)
                total += member.size if member.isfile() else 0
                if capacity is not None and total > capacity:
                    raise InsufficientSpace(
                        f"archive contents exceed the volume's usable size of {capacity} bytes"
                    )
                _ensure_no_symlink_parent(dest, member.name)
                archive.extract(member, dest, set_attrs=True, filter="data")
    except tarfile.FilterError as exc:
        raise UnsafeImage(f"archive member refused: {exc}") from exc
    except tarfile.TarError as exc:
        raise InvalidImage(f"archive is corrupt or truncated: {exc}") from exc
    return total


def _ensure_no_symlink_parent(dest: str, name: str) -> None:
    """A member must not be written through a symlink an earlier member planted."""
    path = dest
    for part in name.split("/")[:-1]:
        path = os.path.join(path, part)
        if os.path.islink(path):
            raise UnsafeImage(f"archive member {name!r} would be written through a symlink")
