"""Hand-built tiny VDI and VMDK (sparse extent) images for the decoders' unit and fuzz tests.

Deliberately small writers that lay content out the way qemu-img does (header, tables, then
data) and can also be told to break that order, so the streaming rules can be pinned without
qemu. Field offsets follow qemu's block/vdi.c and block/vmdk.c.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

MiB = 1 << 20
SECTOR = 512


@dataclass
class VdiSpec:
    """``blocks`` maps virtual block -> 1 MiB of data; physical order follows ``order``."""

    disk_size: int = 3 * MiB
    blocks: dict[int, bytes] = field(default_factory=dict)
    zero: set[int] = field(default_factory=set)  # entries 0xFFFFFFFE
    order: list[int] | None = None  # virtual blocks in physical order (default: sorted)
    version: int = 0x00010001
    block_size: int = MiB
    blocks_in_image: int | None = None
    parent: bool = False
    map_after_data: bool = False


def build_vdi(spec: VdiSpec) -> bytes:
    count = spec.blocks_in_image or -(-spec.disk_size // MiB)
    order = spec.order if spec.order is not None else sorted(spec.blocks)
    bmap = [0xFFFFFFFF] * count
    for virt in spec.zero:
        bmap[virt] = 0xFFFFFFFE
    for physical, virt in enumerate(order):
        bmap[virt] = physical
    map_bytes = struct.pack(f"<{count}I", *bmap)
    map_bytes += bytes(-len(map_bytes) % SECTOR)
    data = b"".join(spec.blocks[virt].ljust(MiB, b"\0") for virt in order)
    offset_bmap, offset_data = 512, 512 + len(map_bytes)
    if spec.map_after_data:
        offset_data, offset_bmap = 512, 512 + len(data)
    header = bytearray(512)
    header[:0x40] = b"<<< QEMU VM Virtual Disk Image >>>\n".ljust(0x40, b"\0")
    struct.pack_into("<IIII", header, 0x40, 0xBEDA107F, spec.version, 0x180, 1)
    struct.pack_into(
        "<IIIIIIIQIIII", header, 0x154, offset_bmap, offset_data, 0, 0, 0, SECTOR, 0,
        spec.disk_size, spec.block_size, 0, count, len(order),
    )  # fmt: skip
    if spec.parent:
        header[0x1B8] = 1
    body = data + map_bytes if spec.map_after_data else map_bytes + data
    return bytes(header) + body


@dataclass
class VmdkSpec:
    """``grains`` maps virtual grain index -> grain data (``granularity`` sectors each)."""

    capacity: int = 64  # sectors
    granularity: int = 8  # 4 KiB grains
    gtes: int = 4  # grain table entries per table (qemu writes 512)
    grains: dict[int, bytes] = field(default_factory=dict)
    zeroed: set[int] = field(default_factory=set)  # GTE 1 (with the zeroed-grain flag)
    order: list[int] | None = None  # grains in physical order (default: sorted)
    compressed: bool = False
    version: int = 1
    descriptor: bytes = (
        b"# Disk DescriptorFile\nversion=1\nCID=12345678\nparentCID=ffffffff\n"
        b'createType="monolithicSparse"\n'
    )
    gd_at_end: bool = False  # the header defers to a footer (VMware's streamOptimized)
    grains_first: bool = False  # put the grains before the tables (not streamable)


def build_vmdk(spec: VmdkSpec) -> bytes:
    n_gts = -(-spec.capacity // (spec.granularity * spec.gtes))
    gt_sectors = -(-spec.gtes * 4 // SECTOR)
    gd_sectors = -(-n_gts * 4 // SECTOR)
    meta = gd_sectors + gt_sectors * n_gts  # one directory with its tables
    rgd = 2
    grain_start = 2 if spec.grains_first else -(-(rgd + 2 * meta) // spec.granularity)
    if not spec.grains_first:
        grain_start *= spec.granularity
    order = spec.order if spec.order is not None else sorted(spec.grains)
    payload, gte = _grains(spec, order, grain_start)
    if spec.grains_first:
        rgd = grain_start + len(payload) // SECTOR
    for virt in spec.zeroed:
        gte[virt] = 1
    tables = _tables(spec, n_gts, gt_sectors, gd_sectors, gte)
    image = bytearray(_vmdk_header(spec, rgd, rgd + meta, grain_start, spec.gd_at_end))
    image += spec.descriptor[:SECTOR].ljust(SECTOR, b"\0")
    if spec.grains_first:
        image += payload + tables(rgd) + tables(rgd + meta)
    else:
        image += tables(rgd) + tables(rgd + meta)
        image = image.ljust(grain_start * SECTOR, b"\0") + payload
    if spec.gd_at_end:  # a footer marker, the header with the real directory, end of stream
        footer = struct.pack("<QII", 1, 0, 3).ljust(SECTOR, b"\0")
        footer += _vmdk_header(spec, rgd, rgd + meta, grain_start, False) + bytes(SECTOR)
        image += footer
    return bytes(image)


def _grains(spec: VmdkSpec, order: list[int], start: int) -> tuple[bytes, dict[int, int]]:
    """The grain area starting at sector ``start``, and the GTE of each grain."""
    grain_size = spec.granularity * SECTOR
    out = bytearray()
    gte: dict[int, int] = {}
    for virt in order:
        gte[virt] = start + len(out) // SECTOR
        data = spec.grains[virt].ljust(grain_size, b"\0")
        if spec.compressed:
            packed = zlib.compress(data)
            data = struct.pack("<QI", virt * spec.granularity, len(packed)) + packed
            data += bytes(-len(data) % SECTOR)
        out += data
    if spec.compressed:
        out += bytes(SECTOR)  # end-of-stream marker
    return bytes(out), gte


def _tables(
    spec: VmdkSpec, n_gts: int, gt_sectors: int, gd_sectors: int, gte: dict[int, int]
) -> Callable[[int], bytes]:
    def at(gd_sector: int) -> bytes:
        first_gt = gd_sector + gd_sectors
        directory = [first_gt + i * gt_sectors for i in range(n_gts)]
        gd = struct.pack(f"<{n_gts}I", *directory).ljust(gd_sectors * SECTOR, b"\0")
        entries = [gte.get(i, 0) for i in range(n_gts * spec.gtes)]
        gts = b"".join(
            struct.pack(f"<{spec.gtes}I", *entries[i * spec.gtes : (i + 1) * spec.gtes]).ljust(
                gt_sectors * SECTOR, b"\0"
            )
            for i in range(n_gts)
        )
        return gd + gts

    return at


def _vmdk_header(spec: VmdkSpec, rgd: int, gd: int, grain_area: int, gd_at_end: bool) -> bytes:
    flags = 0x3 | (0x4 if spec.zeroed else 0) | (0x30000 if spec.compressed else 0)
    header = bytearray(SECTOR)
    struct.pack_into(
        "<4sIIQQQQIQQQ", header, 0, b"KDMV", spec.version, flags, spec.capacity,
        spec.granularity, 1, 1, spec.gtes, rgd,
        0xFFFFFFFFFFFFFFFF if gd_at_end else gd, grain_area,
    )  # fmt: skip
    header[73:77] = b"\n \r\n"
    struct.pack_into("<H", header, 77, 1 if spec.compressed else 0)
    return bytes(header)
