"""Content-based format detection: one function maps bytes to an ``ImageFormat``.

Formats are never guessed from a file name or a Content-Type header: servers lie about both.
A small header table gives the precise answer for every container we handle (CDI's own table,
``pkg/image/filefmt.go``); libmagic is asked second, only to recognise content that must never be
written as a disk (an HTML error page, an XML or JSON API error), which no header table can list.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

# Enough for every magic below (vdi at 0x40, tar at 0x101) and for libmagic to see HTML.
SNIFF_BYTES = 64 * 1024


class ImageFormat(enum.Enum):
    RAW = "raw"
    QCOW2 = "qcow2"
    VMDK = "vmdk"
    VDI = "vdi"
    VHD = "vpc"  # qemu-img's driver name for VHD
    VHDX = "vhdx"
    GZIP = "gz"
    XZ = "xz"
    ZSTD = "zst"
    BZIP2 = "bz2"
    TAR = "tar"
    TEXT = "text"  # an error page or other text: never a disk image

    @property
    def is_compression(self) -> bool:
        return self in _COMPRESSIONS

    @property
    def needs_conversion(self) -> bool:
        return self in _CONVERTIBLE


_COMPRESSIONS = frozenset({ImageFormat.GZIP, ImageFormat.XZ, ImageFormat.ZSTD, ImageFormat.BZIP2})
_CONVERTIBLE = frozenset(
    {ImageFormat.QCOW2, ImageFormat.VMDK, ImageFormat.VDI, ImageFormat.VHD, ImageFormat.VHDX}
)


@dataclass(frozen=True)
class _Magic:
    offset: int
    signature: bytes
    fmt: ImageFormat


_HEADER_TABLE: tuple[_Magic, ...] = (
    _Magic(0, b"\x1f\x8b", ImageFormat.GZIP),
    _Magic(0, b"\xfd7zXZ\x00", ImageFormat.XZ),
    _Magic(0, b"\x28\xb5\x2f\xfd", ImageFormat.ZSTD),
    _Magic(0, b"BZh", ImageFormat.BZIP2),
    _Magic(0, b"QFI\xfb", ImageFormat.QCOW2),
    _Magic(0, b"KDMV", ImageFormat.VMDK),
    # A vmdk descriptor file (text): sniffed as vmdk so that it is refused with its reason.
    _Magic(0, b"# Disk DescriptorFile", ImageFormat.VMDK),
    _Magic(0x40, b"\x7f\x10\xda\xbe", ImageFormat.VDI),
    _Magic(0, b"conectix", ImageFormat.VHD),
    _Magic(0, b"vhdxfile", ImageFormat.VHDX),
    _Magic(0x101, b"ustar", ImageFormat.TAR),
)

# libmagic MIME types that mean "a server sent us a document, not an image".
_DOCUMENT_MIME = ("text/html", "text/xml", "application/xml", "application/json", "text/plain")


def sniff(head: bytes) -> ImageFormat:
    """Return the format of a stream whose first bytes are ``head`` (up to SNIFF_BYTES).

    bzip2 needs its block magic too ("BZh" + level digit + pi), so plain text starting with
    "BZh" is not mistaken for it.
    """
    for entry in _HEADER_TABLE:
        if head.startswith(entry.signature, entry.offset):
            if entry.fmt is ImageFormat.BZIP2 and not _is_bzip2(head):
                continue
            return entry.fmt
    if head and _looks_like_document(head):
        return ImageFormat.TEXT
    return ImageFormat.RAW


def _is_bzip2(head: bytes) -> bool:
    return (
        len(head) >= 10
        and head[3:4].isdigit()
        and head[4:10]
        in (
            b"\x31\x41\x59\x26\x53\x59",
            b"\x17\x72\x45\x38\x50\x90",
        )
    )


def _looks_like_document(head: bytes) -> bool:
    if head.count(0, 0, 4096) > 0:  # real documents carry no NUL bytes; disks almost always do
        return False
    import magic  # libmagic and its database: only for heads the table did not recognise

    mime = magic.from_buffer(head, mime=True)
    return mime.startswith(_DOCUMENT_MIME)
