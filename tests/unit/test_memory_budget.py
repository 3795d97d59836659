"""The importer's memory ceilings add up to less than its pod's memory limit (docs/importer.md).

Every bound is read from the constant that enforces it, so lowering the pod limit or raising a
ceiling fails here. Per-object costs of the tables that are bounded by a count (qcow2 runs and
pending L2 tables, vmdk/vdi extents, tar members) are measured with tracemalloc on the objects
the decoders really keep, so the documented per-item figures cannot drift either. The worst
case is the runtime, plus what every import holds (source buffers, stage queues, writer), plus
the most expensive combination of one compression layer (xz and zstd are never nested:
``datapath.decode.peel``) and one image decoder. The tests after the budget check that the
ceilings it relies on are enforced: xz's dictionary, nested xz/zstd, tar member names.
"""

from __future__ import annotations

import heapq
import itertools
import lzma
import struct
import tarfile
import tracemalloc
import zlib
from collections.abc import Callable
from dataclasses import fields
from inspect import signature
from pathlib import Path

import pytest

from cdi.api.config import DEFAULT_POD_RESOURCES
from cdi.api.errors import InvalidImage, UnsafeImage, UnsupportedFormat
from datapath.decode import peel
from datapath.decode.archive import extract_tar
from datapath.decode.decompress import ZSTD_MAX_WINDOW, decompress
from datapath.decode.mapped import MAX_EXTENTS
from datapath.decode.qcow2.decoder import (
    DEFAULT_MAX_PENDING_RUNS,
    MAX_L2_TABLES,
    _Runs,
    _Table,
)
from datapath.decode.qcow2.header import MAX_CLUSTER_BITS, MAX_L1_BYTES
from datapath.decode.rawpieces import FLUSH_AT, MAX_WRITE
from datapath.decode.tarbounds import MAX_HEADER_BYTES, MAX_MEMBERS, MAX_NAME_BYTES
from datapath.decode.xz_parallel import (
    MAX_PARALLEL_BLOCK,
    ORDERED_WORKERS,
    PIECE,
    XZ_MEMLIMIT,
    max_compressed,
)
from datapath.formats import ImageFormat
from datapath.metrics_server import ServerLimits
from datapath.plan import SPILL_MEMORY_LIMIT
from datapath.stage import ThreadStage
from datapath.streams import CHUNK_SIZE
from datapath.target.writer import RawWriter
from datapath.verify import PENDING_LIMIT
from importer.registry.layers import MAX_LAYER_NAME_BYTES, MAX_LAYER_PATHS, Overlay, _Layer
from importer.sources.http import HttpOptions

MiB = 1 << 20
# Documented per-item costs (docs/importer.md); the tests below measure the real ones.
RUN_BYTES = 220  # one pending qcow2 run: a tuple of four ints in a list
TABLE_BYTES = 400  # one pending L2 table: a _Table in the heap
EXTENT_BYTES = 200  # one vmdk/vdi extent
TARINFO_BYTES = 450  # one tar member kept by tarfile (names counted apart)
LAYER_PATH_BYTES = 240  # one path the registry layer walk keeps (names counted apart)
RUNTIME = 48 * MiB  # Python and the importer's modules: 30 MB measured, plus thread stacks
XZ_POSITIONED_WORKERS = 4  # default_workers(): at most 4 threads, each writing its block


def _default(cls: type, name: str) -> int:
    value = next(f.default for f in fields(cls) if f.name == name)
    assert isinstance(value, int)
    return value


def _param(fn: Callable[..., object], name: str) -> int:
    value = signature(fn).parameters[name].default
    assert isinstance(value, int)
    return value


def pod_limit() -> int:
    """CDI's default worker pod memory limit, which the importer pod gets."""
    return DEFAULT_POD_RESOURCES.limits["memory"].value()


def common() -> dict[str, int]:
    """Held by every import at once, whatever the format."""
    connections = _default(HttpOptions, "connections")
    segment = _default(HttpOptions, "segment_size")
    writers, buffer = _param(RawWriter.__init__, "writers"), _param(RawWriter.__init__, "buffer")
    return {
        "source: ranged segments in flight (+1 handed on)": (connections + 1) * segment,
        "hash and decode stage queues, a chunk in hand each": 2
        * (_param(ThreadStage.__init__, "max_bytes") + CHUNK_SIZE),
        "writer: O_DIRECT bounce buffers": (writers + 1) * buffer,
        "metrics server: request lines": ServerLimits().max_connections * 64 * 1024,
        "verified volume: partial blocks held by the digest": PENDING_LIMIT,
    }


def compression() -> dict[str, int]:
    block = MAX_PARALLEL_BLOCK
    per_thread = max_compressed(block) + min(XZ_MEMLIMIT, block) + 2 * PIECE
    return {
        "none": 0,
        "gz (isal: 32 KiB window, one output piece)": CHUNK_SIZE + MiB,
        "bz2 (900 KiB blocks, one output piece)": CHUNK_SIZE + 8 * MiB,
        "zstd (window limit, one output piece)": ZSTD_MAX_WINDOW + CHUNK_SIZE + MiB,
        "xz sequential (memlimit)": XZ_MEMLIMIT + CHUNK_SIZE,
        "xz ordered (blocks + dictionaries + waiting blocks)": ORDERED_WORKERS * per_thread
        + (ORDERED_WORKERS - 1) * block,
    }


def image() -> dict[str, int]:
    cluster = 1 << MAX_CLUSTER_BITS
    return {
        "raw": 0,
        "qcow2 (L1, pending L2 tables and runs, spill, assembly, output)": MAX_L1_BYTES
        + MAX_L2_TABLES * TABLE_BYTES
        + DEFAULT_MAX_PENDING_RUNS * RUN_BYTES
        + SPILL_MEMORY_LIMIT
        + 2 * cluster
        + FLUSH_AT,
        "vmdk/vdi (extents, spill, output)": MAX_EXTENTS * EXTENT_BYTES
        + SPILL_MEMORY_LIMIT
        + MAX_WRITE,
        "tar (members, names, one header)": MAX_MEMBERS * TARINFO_BYTES
        + MAX_NAME_BYTES
        + MAX_HEADER_BYTES,
    }


def registry_walk() -> int:
    """A registry source's layer walk: the overlay's paths, their names, one header. Counted
    for every import (a registry image's disk goes through any chain)."""
    return MAX_LAYER_PATHS * LAYER_PATH_BYTES + MAX_LAYER_NAME_BYTES + MAX_HEADER_BYTES


def worst_case() -> int:
    block = MAX_PARALLEL_BLOCK
    positioned = XZ_POSITIONED_WORKERS * (
        max_compressed(block) + min(XZ_MEMLIMIT, block) + 2 * PIECE + 2 * MiB  # + lane buffers
    )
    chains = [c + i for c in compression().values() for i in image().values()]
    return RUNTIME + sum(common().values()) + registry_walk() + max(*chains, positioned)


def test_the_worst_case_stays_under_the_importer_pods_memory_limit() -> None:
    worst, limit = worst_case(), pod_limit()
    assert limit == 600_000_000  # CDI's default; a change must revisit docs/importer.md
    assert worst < 0.95 * limit, f"worst case {worst / MiB:.0f} MiB vs limit {limit / MiB:.0f} MiB"


def _measured(make: Callable[[int], object], n: int = 20_000) -> float:
    tracemalloc.start()
    kept = [make(i) for i in range(n)]
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(kept) == n
    return size / n


def test_the_documented_per_item_costs_hold() -> None:
    far = 1 << 40  # offsets past 2**30 are full-size ints, as in a real image
    run = _measured(lambda i: (far + i * 7, far + i * 9, far + i * 11, 0))
    heap: list[tuple[int, int, object]] = []
    seq = itertools.count()

    def table(i: int) -> object:
        heapq.heappush(heap, (far + i, next(seq), _Table(far + i, far + i + 65536, i)))
        return None

    tables = _measured(table)
    tar = _measured(lambda i: tarfile.TarInfo(f"usr/lib/python3/site-packages/pkg/mod{i}.py"))
    assert run + 8 <= RUN_BYTES and run + 8 <= EXTENT_BYTES  # + the list slot
    assert tables <= TABLE_BYTES
    assert tar <= TARINFO_BYTES
    assert _layer_path_cost() <= LAYER_PATH_BYTES
    assert _Runs([]).index == 0  # the wrapper is one per L2 table, counted in TABLE_BYTES


def _layer_path_cost(n: int = MAX_LAYER_PATHS) -> float:
    """A path in the layer walk at its peak: in the current layer's sets and the overlay's.
    Measured at the cap (set tables grow in steps: fewer paths cost more each, less in all)."""
    tracemalloc.start()
    overlay, layer, names = Overlay(), _Layer(), 0
    for i in range(n):
        path = f"usr/lib/python3/site-packages/pkg/mod{i}.py"
        names += len(path)
        layer.present.add(path)
        layer.hidden.add(path)
    layer.apply(overlay)
    size, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return (size - names) / n


def _xz_with_dictionary(dict_byte: int) -> bytes:
    """A small .xz whose block header asks for a dictionary of the given LZMA2 size byte."""
    data = bytearray(lzma.compress(bytes(1 << 20), format=lzma.FORMAT_XZ))
    at = 12  # block header after the stream header
    size = (data[at] + 1) * 4
    header = data[at : at + size]
    assert header[1] & 0xC0 == 0 and header[2] == 0x21  # no sizes; one filter, LZMA2
    header[4] = dict_byte
    struct.pack_into("<I", header, size - 4, zlib.crc32(bytes(header[: size - 4])))
    data[at : at + size] = header
    return bytes(data)


def test_xz_asking_for_a_huge_dictionary_is_refused_before_it_is_allocated() -> None:
    assert sum(map(len, decompress(ImageFormat.XZ, iter([_xz_with_dictionary(20)])))) == 1 << 20
    bomb = _xz_with_dictionary(36)  # 1 GiB: a 100 KiB file took the importer to 757 MB RSS
    with pytest.raises(InvalidImage, match="Memory usage limit"):
        for _ in decompress(ImageFormat.XZ, iter([bomb])):
            pass


def test_xz_and_zstd_are_not_nested() -> None:
    import zstandard

    inner = lzma.compress(bytes(4096), format=lzma.FORMAT_XZ)
    with pytest.raises(UnsupportedFormat, match="nested"):
        peel(iter([zstandard.ZstdCompressor().compress(inner)]), [])
    chain: list[str] = []
    fmt, _ = peel(iter([lzma.compress(bytes(4096), format=lzma.FORMAT_XZ)]), chain)
    assert chain == ["xz", fmt.value]  # one heavy layer is fine


def test_tar_member_names_are_bounded_in_total(tmp_path: Path) -> None:
    import io

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(40):
            info = tarfile.TarInfo(f"f{i}")
            info.pax_headers = {"comment": "x" * (MiB - 64)}  # each under the 1 MiB header cap
            tar.addfile(info, io.BytesIO(b""))
    (tmp_path / "vol").mkdir()
    with pytest.raises(UnsafeImage, match="names exceed"):
        extract_tar(iter([buf.getvalue()]), str(tmp_path / "vol"), None)
