"""Envelopes: what wraps the disk image in the byte stream, before any format is sniffed.

A plain import sniffs the stream and decodes what it finds. Two kinds of stream must not be
treated that way. A block-device clone is a guest disk's bytes exactly as they are: a guest
disk may well start with gzip or qcow2 magic, and decoding it would both corrupt it and let a
tenant aim our decoders at the host (``passthrough`` writes it verbatim, still sparse). A
registry layer is the opposite: a (usually compressed) tar holding the disk as one file under
``disk/``, which is taken out of the tar as a stream and sniffed again (``tar_member``).
"""

from __future__ import annotations

import posixpath
import tarfile
from collections.abc import Iterator

from cdi.api.errors import InvalidImage, UnsafeImage
from datapath.streams import CHUNK_SIZE, IterReader


class NoDiskInLayer(InvalidImage):
    """A registry layer holds no regular file under its disk folder."""


class SeveralDisksInLayer(InvalidImage):
    """A registry layer holds more than one file under its disk folder: which is the disk?"""


def tar_member(chunks: Iterator[bytes], prefix: str = "disk/") -> Iterator[bytes]:
    """The bytes of the one regular file under ``prefix`` in a tar stream.

    The whole tar is read, to its end, before the iterator is exhausted: a second file under
    ``prefix`` (or a directory, link or device there) is an error naming what was found, and
    so is finding none. Other members are skipped unread (tarfile skips their data).
    """
    folder = prefix.rstrip("/")
    found: list[str] = []
    try:
        with tarfile.open(fileobj=IterReader(chunks), mode="r|") as archive:
            for member in archive:
                name = posixpath.normpath(member.name)  # "./disk/x" is "disk/x"
                if not name.startswith(folder + "/"):
                    continue  # the folder's own entry, or a file elsewhere in the layer
                if not member.isfile():
                    raise UnsafeImage(f"layer entry {member.name!r} under {prefix} is not a file")
                found.append(member.name)
                if len(found) == 1:
                    yield from _member_bytes(archive, member)
    except tarfile.TarError as exc:
        raise InvalidImage(f"layer archive is corrupt or truncated: {exc}") from exc
    if not found:
        raise NoDiskInLayer(f"the image layer holds no file under {prefix}")
    if len(found) > 1:
        raise SeveralDisksInLayer(
            f"the image layer holds {len(found)} files under {prefix}, expected one: "
            + ", ".join(found[:10])
        )


def _member_bytes(archive: tarfile.TarFile, member: tarfile.TarInfo) -> Iterator[bytes]:
    fh = archive.extractfile(member)
    assert fh is not None  # a regular file always has a reader
    while piece := fh.read(CHUNK_SIZE):
        yield piece
