"""Memory bounds on reading a tar stream, shared by archive extraction and the registry layer
walk (docs/importer.md, memory table).

``tarfile`` reads a pax or GNU long-name header whole into memory (an attacker-declared 8 GB
header is an 8 GB allocation; a 200 MiB one compresses to a 0.19 MiB gzip layer), and keeps
every member's ``TarInfo`` (~450 bytes plus its names and pax records) in ``TarFile.members``
until the end. ``BoundedTarInfo`` refuses an extended header larger than ``MAX_HEADER_BYTES``
before it is read; ``TarBudget`` bounds, over one archive or over every layer of an image,
the members counted and the bytes of names a reader keeps. Past any bound: ``UnsafeImage``.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass

from cdi.api.errors import UnsafeImage

# tarfile keeps every member's TarInfo until the end, for hard links: members and the bytes of
# their names are both bounded.
MAX_MEMBERS = 250_000  # a distribution's root has ~100,000 files; a million tiny ones is an attack
MAX_NAME_BYTES = 32 * 1024 * 1024  # names, link names and pax records of all members together
MAX_HEADER_BYTES = 1 << 20  # pax and GNU long-name headers (names, xattrs), held in memory
_EXTENDED = (
    tarfile.GNUTYPE_LONGNAME,
    tarfile.GNUTYPE_LONGLINK,
    tarfile.XHDTYPE,
    tarfile.XGLTYPE,
    tarfile.SOLARIS_XHDTYPE,
)


class BoundedTarInfo(tarfile.TarInfo):
    """Refuses extended headers larger than ``MAX_HEADER_BYTES`` before tarfile reads them."""

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type in _EXTENDED and self.size > MAX_HEADER_BYTES:
            raise UnsafeImage(
                f"archive header of {self.size} bytes exceeds the {MAX_HEADER_BYTES}-byte limit"
            )
        return super()._proc_member(tarfile_)  # type: ignore[misc]


def name_bytes(member: tarfile.TarInfo) -> int:
    """What a member's names (and pax records) keep in memory while it is kept."""
    pax = sum(len(k) + len(v) for k, v in member.pax_headers.items())
    return len(member.name) + len(member.linkname) + pax


@dataclass
class TarBudget:
    """Members and name bytes one reader keeps, counted member by member."""

    max_members: int = MAX_MEMBERS
    max_name_bytes: int = MAX_NAME_BYTES
    members: int = 0
    names: int = 0

    def count(self, member: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise UnsafeImage(f"archive has more than {self.max_members} members")
        self.names += name_bytes(member)
        if self.names > self.max_name_bytes:
            raise UnsafeImage(f"archive member names exceed {self.max_name_bytes} bytes")
