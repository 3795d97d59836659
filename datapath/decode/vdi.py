"""Streaming VDI (VirtualBox) -> raw: header, block map, then data blocks in any order.

A VDI file is a 512-byte header, a block map of little-endian uint32 entries (one per 1 MiB
block of the virtual disk: the index of the physical block holding it, 0xFFFFFFFF for
unallocated, 0xFFFFFFFE for a block that reads as zeros) and the physical blocks at
``offset_data + index * block_size``. qemu-img and VirtualBox put the map before the data, so
the map is read as it streams past (in pieces of ``MAP_PIECE`` entries, so memory does not grow
with the disk), inverted into file-ordered extents (physical block -> virtual offset), and each
block lands in the target as it goes by (``datapath.decode.mapped``). Unallocated and zero
blocks are simply never written: the target reads as zeros there. A block map after the data
(valid for qemu) needs a ``spill`` that holds the blocks until the map arrives; without one it
is ``LayoutNotStreamable``.

The header checks follow qemu's ``vdi_open`` (block/vdi.c) so that we accept what qemu-img
accepts and refuse the rest with a typed error; a differencing image (parent or link UUID) is
refused as unsafe, like a backing file.
"""

from __future__ import annotations

import struct
import sys
from array import array
from dataclasses import dataclass

from cdi.api.errors import InsufficientSpace, InvalidImage, UnsafeImage, UnsupportedFormat
from datapath.decode.mapped import MappedImageDecoder
from datapath.decode.rawpieces import LayoutNotStreamable
from datapath.decode.spill import Spill

SIGNATURE = 0xBEDA107F
VERSION_1_1 = 0x00010001
HEADER_BYTES = 512
SECTOR = 512
BLOCK_SIZE = 1 << 20  # the only block size qemu supports (DEFAULT_CLUSTER_SIZE)
ZERO_BLOCK = 0xFFFFFFFE  # VDI_DISCARDED: reads as zeros
UNALLOCATED = 0xFFFFFFFF
# qemu's VDI_BLOCKS_IN_IMAGE_MAX: the block map, rounded up to a sector, must fit an int.
BLOCKS_IN_IMAGE_MAX = (2**31 - SECTOR) // 4
MAP_PIECE = 256 * 1024  # block map entries read and parsed at a time (1 MiB)

_PRE = struct.Struct("<II")  # signature, version at 0x40
_FIELDS = struct.Struct("<IIIIIIIQIIII")  # offset_bmap ... blocks_allocated at 0x154
_UUID_LINK = 0x1A8
_UUID_PARENT = 0x1B8


@dataclass(frozen=True)
class VdiHeader:
    """The vetted fields of a VDI header that decoding needs."""

    image_type: int
    offset_bmap: int
    offset_data: int
    disk_size: int  # rounded up to whole sectors, as qemu does
    block_size: int
    blocks_in_image: int
    blocks_allocated: int

    @property
    def virtual_size(self) -> int:
        return self.disk_size

    @property
    def blocks_needed(self) -> int:
        """Block map entries that map bytes of the virtual disk (later ones are never read)."""
        return -(-self.disk_size // self.block_size)


def parse_header(data: bytes, *, max_virtual_size: int | None = None) -> VdiHeader:
    """Parse and vet the first 512 bytes of a VDI image (raises ``cdi.api.errors`` types)."""
    if len(data) < HEADER_BYTES:
        raise InvalidImage(f"truncated VDI header ({len(data)} bytes)")
    signature, version = _PRE.unpack_from(data, 0x40)
    if signature != SIGNATURE:
        raise InvalidImage(f"not a VDI image (bad signature {signature:#010x})")
    if version != VERSION_1_1:
        raise UnsupportedFormat(f"VDI version {version >> 16}.{version & 0xFFFF} is not supported")
    image_type = struct.unpack_from("<I", data, 0x4C)[0]
    bmap, offset_data, _, _, _, sector, _, disk_size, block_size, _, blocks, allocated = (
        _FIELDS.unpack_from(data, 0x154)
    )
    _check_units(bmap, offset_data, sector, block_size)
    disk_size = -(-disk_size // SECTOR) * SECTOR  # odd sizes round up (VBoxManage makes them)
    if disk_size > blocks * block_size:
        raise InvalidImage(
            f"VDI disk size {disk_size} exceeds what its block map covers ({blocks} blocks)"
        )
    if any(data[_UUID_LINK : _UUID_PARENT + 16]):
        raise UnsafeImage("VDI differencing image: it needs a parent image outside the stream")
    if blocks > BLOCKS_IN_IMAGE_MAX:
        raise UnsupportedFormat(f"VDI image has {blocks} blocks, over {BLOCKS_IN_IMAGE_MAX}")
    if max_virtual_size is not None and disk_size > max_virtual_size:
        raise InsufficientSpace(
            f"virtual size {disk_size} exceeds the target's {max_virtual_size} bytes"
        )
    header = VdiHeader(image_type, bmap, offset_data, disk_size, block_size, blocks, allocated)
    _check_layout(header)
    return header


def _check_units(bmap: int, offset_data: int, sector: int, block_size: int) -> None:
    if bmap % SECTOR or offset_data % SECTOR:
        raise UnsupportedFormat(
            f"VDI block map ({bmap:#x}) or data ({offset_data:#x}) offset is not sector aligned"
        )
    if sector != SECTOR:
        raise UnsupportedFormat(f"VDI sector size {sector} is not {SECTOR}")
    if block_size != BLOCK_SIZE:
        raise UnsupportedFormat(f"VDI block size {block_size} is not {BLOCK_SIZE}")


def _check_layout(header: VdiHeader) -> None:
    """The block map and the data must stay clear of the header and of each other."""
    if not header.blocks_needed:
        return
    bmap, data = header.offset_bmap, header.offset_data
    if bmap < HEADER_BYTES or data < HEADER_BYTES:
        raise InvalidImage("VDI block map or data overlaps the header")
    if bmap < data < bmap + header.blocks_needed * 4:
        raise InvalidImage(f"VDI block map at {bmap:#x} runs into the data at {data:#x}")


class VdiStreamDecoder(MappedImageDecoder):
    """Turn a VDI byte stream into ``(virtual_offset, bytes)`` writes of the raw image.

    Writes never overlap, skip zero pages, and assume the target reads as zeros where nothing
    is written. ``file_size`` (e.g. Content-Length) lets blocks past the end be refused early.
    With a ``spill``, blocks before the block map are kept there until the map arrives.
    """

    format_name = "vdi"

    def __init__(
        self,
        *,
        max_virtual_size: int | None = None,
        file_size: int | None = None,
        spill: Spill | None = None,
    ) -> None:
        super().__init__(HEADER_BYTES, file_size=file_size, spill=spill)
        self._max_virtual_size = max_virtual_size
        self.header: VdiHeader | None = None

    def _on_head(self, head: bytes) -> None:
        header = parse_header(head, max_virtual_size=self._max_virtual_size)
        self.header = header
        self._set_virtual_size(header.virtual_size)
        needed = header.blocks_needed
        if needed and header.offset_bmap >= header.offset_data and self._spill is None:
            raise LayoutNotStreamable(
                "VDI block map lies after the data blocks; converting via scratch space instead"
            )
        for first in range(0, needed, MAP_PIECE):
            last = min(needed, first + MAP_PIECE)
            self._want_table(header.offset_bmap + first * 4, header.offset_bmap + last * 4, first)

    def _on_table(self, tag: int, table: bytes) -> None:
        header = self.header
        assert header is not None
        entries = array("I")
        entries.frombytes(table)
        if sys.byteorder == "big":
            entries.byteswap()
        size, block, data = header.disk_size, header.block_size, header.offset_data
        for i, physical in enumerate(entries):
            if physical >= ZERO_BLOCK:
                continue
            if physical >= header.blocks_in_image:
                raise InvalidImage(
                    f"VDI block {tag + i} maps to block {physical}, past the image's "
                    f"{header.blocks_in_image} blocks"
                )
            virt = (tag + i) * block
            start = data + physical * block
            self._add_extent(start, start + min(block, size - virt), virt)
