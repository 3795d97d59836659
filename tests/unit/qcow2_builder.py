"""Hand-built tiny qcow2 images for the decoder's unit and fuzz tests.

A deliberately small writer (no refcounts, no snapshots) that can lay the same content out in
the orders a streaming reader cares about: tables before data, data before its L2 tables, and
the L1 table after everything. Compressed clusters are packed back to back like qemu does,
with the sector-rounded sizes qemu stores.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

import zstandard

MAGIC = b"QFI\xfb"


@dataclass
class Spec:
    """What to put in the image. ``data`` maps virtual cluster index -> cluster bytes."""

    cluster_bits: int = 9
    virtual_size: int = 64 * 1024
    data: dict[int, bytes] = field(default_factory=dict)
    zero: set[int] = field(default_factory=set)
    compressed: set[int] = field(default_factory=set)
    version: int = 3
    extended_l2: bool = False
    zstd: bool = False
    zstd_frames: int = 1
    layout: str = "ordered"  # ordered | data-first | l1-last
    incompatible: int = 0
    header_length: int = 112
    refcounts: bool = True  # append an (empty) refcount table: qemu-img refuses images without

    @property
    def cluster_size(self) -> int:
        return 1 << self.cluster_bits

    @property
    def entry_size(self) -> int:
        return 16 if self.extended_l2 else 8

    @property
    def l2_entries(self) -> int:
        return self.cluster_size // self.entry_size


def compress(spec: Spec, payload: bytes) -> bytes:
    if not spec.zstd:
        deflater = zlib.compressobj(6, zlib.DEFLATED, -12)
        return deflater.compress(payload) + deflater.flush()
    cctx = zstandard.ZstdCompressor()
    step = -(-len(payload) // spec.zstd_frames)
    return b"".join(cctx.compress(payload[i : i + step]) for i in range(0, len(payload), step))


def build(spec: Spec) -> bytes:
    """Serialize ``spec`` into qcow2 bytes."""
    cs = spec.cluster_size
    n_l1 = max(1, -(-spec.virtual_size // (spec.l2_entries * cs)))
    l1_clusters = -(-n_l1 * 8 // cs)
    used_l2 = sorted({i // spec.l2_entries for i in (*spec.data, *spec.zero)})
    plain = sorted(i for i in spec.data if i not in spec.compressed)
    blobs = {i: compress(spec, spec.data[i]) for i in sorted(spec.compressed)}
    comp_bytes = sum(len(b) for b in blobs.values())
    comp_clusters = -(-comp_bytes // cs) + (1 if blobs else 0)
    sizes = {
        "l1": l1_clusters,
        "l2": len(used_l2),
        "data": len(plain) + comp_clusters,
    }
    order = {
        "ordered": ("l1", "l2", "data"),
        "data-first": ("l1", "data", "l2"),
        "l1-last": ("data", "l2", "l1"),
    }[spec.layout]
    starts: dict[str, int] = {}
    cursor = 1
    for part in order:
        starts[part] = cursor * cs
        cursor += sizes[part]
    image = bytearray(cursor * cs)
    l2_at = {t: starts["l2"] + k * cs for k, t in enumerate(used_l2)}
    entries: dict[int, tuple[int, int]] = {}
    for k, i in enumerate(plain):
        entries[i] = _plain_entry(spec, starts["data"] + k * cs)
        image[starts["data"] + k * cs : starts["data"] + (k + 1) * cs] = spec.data[i]
    pos = starts["data"] + len(plain) * cs
    for i, blob in blobs.items():
        entries[i] = (_compressed_entry(spec, pos, len(blob)), 0)
        image[pos : pos + len(blob)] = blob
        pos += len(blob)
    for i in spec.zero:
        entries[i] = (1, 0) if not spec.extended_l2 else (0, 0xFFFFFFFF << 32)
    for i, (entry, bitmap) in entries.items():
        at = l2_at[i // spec.l2_entries] + (i % spec.l2_entries) * spec.entry_size
        struct.pack_into(">Q", image, at, entry)
        if spec.extended_l2:
            struct.pack_into(">Q", image, at + 8, bitmap)
    for t, off in l2_at.items():
        struct.pack_into(">Q", image, starts["l1"] + 8 * t, off | (1 << 63))
    _header(spec, image, n_l1, starts["l1"])
    image = image[: pos if blobs and spec.layout == "ordered" and pos > 0 else len(image)]
    if spec.refcounts:  # a refcount table of one cluster at the end, mapping nothing
        image += bytes(-len(image) % cs)
        struct.pack_into(">QI", image, 48, len(image), 1)
        image += bytes(cs)
    return bytes(image)


def _plain_entry(spec: Spec, offset: int) -> tuple[int, int]:
    return (offset | (1 << 63), 0xFFFFFFFF) if spec.extended_l2 else (offset | (1 << 63), 0)


def _compressed_entry(spec: Spec, offset: int, length: int) -> int:
    shift = 62 - (spec.cluster_bits - 8)
    sectors = (offset + length - 1) // 512 - offset // 512
    return (1 << 62) | (sectors << shift) | offset


def _header(spec: Spec, image: bytearray, l1_size: int, l1_offset: int) -> None:
    incompat = spec.incompatible
    if spec.extended_l2:
        incompat |= 1 << 4
    if spec.zstd:
        incompat |= 1 << 3
    struct.pack_into(
        ">4sIQIIQIIQQIIQ",
        image,
        0,
        MAGIC,
        spec.version,
        0,
        0,
        spec.cluster_bits,
        spec.virtual_size,
        0,
        l1_size,
        l1_offset,
        0,
        0,
        0,
        0,
    )
    if spec.version == 3:
        struct.pack_into(">QQQII", image, 72, incompat, 0, 0, 4, spec.header_length)
        if spec.header_length > 104:
            image[104] = 1 if spec.zstd else 0
