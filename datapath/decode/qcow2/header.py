"""The qcow2 header: parse and vet the first cluster of an image before trusting anything else.

A streaming importer reads the header once, from the first cluster of the stream, and every
later decision (where L1 is, how big clusters are, how L2 entries are laid out) follows from
it. So this module is deliberately strict: anything that would make the image depend on bytes
outside the stream (backing file, external data file), hide its data (encryption) or use
features we do not understand (unknown incompatible bits) is rejected here with a typed error,
before any table is allocated. Layout follows qemu's docs/interop/qcow2.txt; checks follow
qemu's ``qcow2_do_open`` where they matter for safety.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from cdi.api.errors import InsufficientSpace, InvalidImage, UnsafeImage, UnsupportedFormat

MAGIC = b"QFI\xfb"
V2_HEADER_LENGTH = 72
V3_MIN_HEADER_LENGTH = 104
MIN_CLUSTER_BITS = 9
MAX_CLUSTER_BITS = 21
# qemu's QCOW_MAX_L1_SIZE: the active L1 table may not exceed 32 MiB (4 Mi entries).
MAX_L1_BYTES = 32 * 1024 * 1024
# Offsets in qcow2 metadata are at most 56 bits wide.
MAX_OFFSET = 1 << 56
# qemu's QCOW_MAX_REFTABLE_SIZE, QCOW_MAX_SNAPSHOTS and sizeof(QCowSnapshotHeader).
MAX_REFTABLE_BYTES = 8 * 1024 * 1024
MAX_SNAPSHOTS = 65536
SNAPSHOT_HEADER_BYTES = 40
INT64_MAX = (1 << 63) - 1

INCOMPAT_DIRTY = 1 << 0
INCOMPAT_CORRUPT = 1 << 1
INCOMPAT_DATA_FILE = 1 << 2
INCOMPAT_COMPRESSION = 1 << 3
INCOMPAT_EXTL2 = 1 << 4
AUTOCLEAR_DATA_FILE_RAW = 1 << 1  # "the external data file is raw": meaningless without one
KNOWN_INCOMPAT = (
    INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTL2
)

COMPRESSION_DEFLATE = 0
COMPRESSION_ZSTD = 1

EXT_END = 0x00000000
EXT_BACKING_FORMAT = 0xE2792ACA
EXT_FEATURE_TABLE = 0x6803F857
EXT_BITMAPS = 0x23852875
EXT_CRYPTO = 0x0537BE77
EXT_DATA_FILE = 0x44415441

_FIXED = struct.Struct(">4sIQIIQIIQQIIQ")  # the 72-byte v2 header
_V3 = struct.Struct(">QQQII")  # incompatible, compatible, autoclear, refcount_order, length


@dataclass(frozen=True)
class Qcow2Header:
    """The fields of a vetted qcow2 header that the decoder needs (and a few for reports)."""

    version: int
    cluster_bits: int
    virtual_size: int
    l1_size: int
    l1_table_offset: int
    refcount_table_offset: int
    refcount_table_clusters: int
    nb_snapshots: int
    snapshots_offset: int
    incompatible_features: int
    compatible_features: int
    autoclear_features: int
    refcount_order: int
    header_length: int
    compression_type: int
    extensions: tuple[int, ...]

    @property
    def cluster_size(self) -> int:
        return 1 << self.cluster_bits

    @property
    def extended_l2(self) -> bool:
        return bool(self.incompatible_features & INCOMPAT_EXTL2)

    @property
    def l2_entry_size(self) -> int:
        return 16 if self.extended_l2 else 8

    @property
    def l2_entries(self) -> int:
        return self.cluster_size // self.l2_entry_size

    @property
    def l2_coverage(self) -> int:
        """Virtual bytes mapped by one L2 table."""
        return self.l2_entries * self.cluster_size

    @property
    def disk_size(self) -> int:
        """The raw disk's size: qemu counts whole 512-byte sectors (``total_sectors``), so an
        odd ``size`` field is rounded down."""
        return self.virtual_size & ~511

    @property
    def l1_entries_needed(self) -> int:
        """L1 entries that can map data inside the virtual size; later entries are ignored."""
        return -(-self.virtual_size // self.l2_coverage)


def peek_cluster_size(prefix: bytes) -> int | None:
    """Cluster size announced by a header prefix, or None if fewer than 24 bytes are known.

    Validates magic, version and cluster bits so the caller never buffers more than 2 MiB
    on behalf of a stream that is not a qcow2 image.
    """
    if len(prefix) < 24:
        return None
    magic, version = struct.unpack_from(">4sI", prefix, 0)
    if magic != MAGIC:
        raise InvalidImage("not a qcow2 image: bad magic")
    if version not in (2, 3):
        raise UnsupportedFormat(f"qcow2 version {version} is not supported (only 2 and 3)")
    cluster_bits = int.from_bytes(prefix[20:24], "big")
    if not MIN_CLUSTER_BITS <= cluster_bits <= MAX_CLUSTER_BITS:
        raise InvalidImage(f"qcow2 cluster_bits {cluster_bits} outside 9..21")
    return 1 << cluster_bits


def parse_header(cluster: bytes, *, max_virtual_size: int | None = None) -> Qcow2Header:
    """Parse and vet the header from the first cluster of the image (all of it if possible).

    ``cluster`` may be shorter than a cluster only if the file itself is; extensions must lie
    inside it. Raises the typed errors of ``cdi.api.errors``.
    """
    cluster_size = peek_cluster_size(cluster)
    if cluster_size is None or len(cluster) < V2_HEADER_LENGTH:
        raise InvalidImage("truncated qcow2 header")
    fields = _FIXED.unpack_from(cluster, 0)
    (
        _,
        version,
        backing_off,
        backing_size,
        cluster_bits,
        size,
        crypt,
        l1_size,
        l1_off,
        rc_off,
        rc_clusters,
        nb_snap,
        snap_off,
    ) = fields
    incompat = compat = autoclear = 0
    refcount_order, header_length, compression = 4, V2_HEADER_LENGTH, COMPRESSION_DEFLATE
    if version == 3:
        if len(cluster) < V3_MIN_HEADER_LENGTH:
            raise InvalidImage("truncated qcow2 v3 header")
        incompat, compat, autoclear, refcount_order, header_length = _V3.unpack_from(cluster, 72)
        if not V3_MIN_HEADER_LENGTH <= header_length <= min(cluster_size, len(cluster)):
            raise InvalidImage(f"qcow2 header_length {header_length} is invalid")
        if header_length > V3_MIN_HEADER_LENGTH:
            compression = cluster[V3_MIN_HEADER_LENGTH]
    _check_features(incompat, compression)
    if crypt:
        raise UnsafeImage(f"qcow2 image is encrypted (crypt_method {crypt})")
    if backing_off and backing_size:
        raise UnsafeImage("qcow2 image has a backing file")
    if backing_off > cluster_size:
        raise InvalidImage(f"qcow2 backing file offset {backing_off:#x} is invalid")  # as qemu
    if refcount_order > 6:
        raise InvalidImage(f"qcow2 refcount_order {refcount_order} > 6")
    if autoclear & AUTOCLEAR_DATA_FILE_RAW and not incompat & INCOMPAT_DATA_FILE:
        raise InvalidImage("qcow2 data-file-raw requires a data file")  # qemu's refusal
    if incompat & INCOMPAT_EXTL2 and cluster_bits < 14:
        raise InvalidImage("qcow2 extended L2 entries need clusters of at least 16 KiB")
    ext_end = backing_off if 0 < backing_off < cluster_size else cluster_size
    extensions = _parse_extensions(cluster, header_length, min(ext_end, len(cluster)))
    header = Qcow2Header(
        version=version,
        cluster_bits=cluster_bits,
        virtual_size=size,
        l1_size=l1_size,
        l1_table_offset=l1_off,
        refcount_table_offset=rc_off,
        refcount_table_clusters=rc_clusters,
        nb_snapshots=nb_snap,
        snapshots_offset=snap_off,
        incompatible_features=incompat,
        compatible_features=compat,
        autoclear_features=autoclear,
        refcount_order=refcount_order,
        header_length=header_length,
        compression_type=compression,
        extensions=extensions,
    )
    _check_geometry(header, max_virtual_size)
    _check_other_tables(header)
    return header


def _validate_table(offset: int, size: int, max_size: int, cluster_size: int, name: str) -> None:
    """qemu's ``qcow2_validate_table``, which it applies to every table in the header, empty
    or not: we refuse what qemu-img refuses to open, even where we would not read the table."""
    if size > max_size:
        raise InvalidImage(f"qcow2 {name} is too large")
    if INT64_MAX - size < offset or offset % cluster_size:
        raise InvalidImage(f"qcow2 {name} offset {offset:#x} is invalid")


def _check_other_tables(header: Qcow2Header) -> None:
    """The refcount and snapshot tables are never read here, but qemu vets their place."""
    cs = header.cluster_size
    if header.refcount_table_clusters == 0:
        raise InvalidImage("qcow2 image has no refcount table")
    rc_bytes = header.refcount_table_clusters * cs
    _validate_table(
        header.refcount_table_offset, rc_bytes, MAX_REFTABLE_BYTES, cs, "refcount table"
    )
    if header.nb_snapshots > MAX_SNAPSHOTS:
        raise InvalidImage(f"qcow2 image has too many snapshots ({header.nb_snapshots})")
    snap_bytes = header.nb_snapshots * SNAPSHOT_HEADER_BYTES
    _validate_table(
        header.snapshots_offset, snap_bytes, MAX_SNAPSHOTS * SNAPSHOT_HEADER_BYTES, cs,
        "snapshot table",
    )  # fmt: skip
    if header.nb_snapshots and header.snapshots_offset < cs:
        raise InvalidImage("qcow2 snapshot table overlaps the header")


def _check_features(incompat: int, compression: int) -> None:
    unknown = incompat & ~KNOWN_INCOMPAT
    if unknown:
        raise UnsafeImage(f"qcow2 image has unknown incompatible features {unknown:#x}")
    if incompat & INCOMPAT_DATA_FILE:
        raise UnsafeImage("qcow2 image uses an external data file")
    if incompat & INCOMPAT_CORRUPT:
        raise InvalidImage("qcow2 image is marked corrupt (repair it with qemu-img check -r)")
    if bool(incompat & INCOMPAT_COMPRESSION) != (compression != COMPRESSION_DEFLATE):
        raise InvalidImage("qcow2 compression-type feature bit disagrees with compression_type")
    if compression not in (COMPRESSION_DEFLATE, COMPRESSION_ZSTD):
        raise UnsupportedFormat(f"qcow2 compression type {compression} is not supported")


def _parse_extensions(cluster: bytes, start: int, end: int) -> tuple[int, ...]:
    """Walk header extensions; reject those that make the image depend on outside bytes."""
    seen: list[int] = []
    offset = start
    while offset < end:
        if offset + 8 > end:  # qemu checks the length before it looks at the type
            raise InvalidImage("qcow2 header extension runs past the header area")
        ext_type, length = struct.unpack_from(">II", cluster, offset)
        offset += 8
        if length > end - offset:
            raise InvalidImage(f"qcow2 header extension {ext_type:#x} runs past the cluster")
        if ext_type == EXT_END:
            break
        if ext_type == EXT_DATA_FILE:
            raise UnsafeImage("qcow2 image names an external data file")
        if ext_type == EXT_CRYPTO:
            raise UnsafeImage("qcow2 image carries a disk-encryption header")
        seen.append(ext_type)
        offset += (length + 7) & ~7
    return tuple(seen)


def _check_geometry(header: Qcow2Header, max_virtual_size: int | None) -> None:
    cluster_size = header.cluster_size
    if header.virtual_size >= MAX_OFFSET:
        raise InvalidImage(f"qcow2 virtual size {header.virtual_size} is absurd")
    if max_virtual_size is not None and header.virtual_size > max_virtual_size:
        raise InsufficientSpace(
            f"virtual size {header.virtual_size} exceeds the target's {max_virtual_size} bytes"
        )
    if header.l1_size * 8 > MAX_L1_BYTES:
        raise UnsafeImage(f"qcow2 L1 table of {header.l1_size} entries exceeds the 32 MiB cap")
    if header.l1_size < header.l1_entries_needed:
        raise InvalidImage("qcow2 L1 table is too small for the virtual size")
    offset = header.l1_table_offset
    if offset % cluster_size or offset + header.l1_size * 8 > MAX_OFFSET:
        raise InvalidImage(f"qcow2 L1 table offset {offset:#x} is invalid")
    if header.l1_size == 0:
        return
    if offset < cluster_size:
        raise UnsafeImage("qcow2 L1 table overlaps the header")
