"""The registry layer walk's memory is bounded like archive extraction's (security review N11).

A 200 MiB pax record compresses to a ~0.2 MiB gzip layer; tarfile reads such a header whole,
so the walk took the importer up by ~200 MiB before it failed. Each attack runs in a fresh
Python process that reports its peak RSS growth (``ru_maxrss``) and the error's type: one
process per case, so no earlier allocation hides the peak.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cdi.api.errors import UnsafeImage
from datapath.decode.tarbounds import MAX_HEADER_BYTES
from importer.registry.layers import MAX_LAYER_PATHS, disk_bytes
from importer.registry.manifest import Descriptor

MiB = 1 << 20
PAX_VALUE = 200 * MiB

WALK = """
import hashlib, json, resource, sys
from importer.registry.layers import disk_bytes
from importer.registry.manifest import Descriptor
data = open(sys.argv[1], "rb").read()
blob = Descriptor("", "sha256:" + hashlib.sha256(data).hexdigest(), len(data))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
error = None
pieces = lambda d: (data[i : i + 65536] for i in range(0, len(data), 65536))
try:
    for _ in disk_bytes([blob], pieces):
        pass
except Exception as exc:
    error = [type(exc).__name__, getattr(exc, "reason", ""), str(exc)[:200]]
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"error": error, "grew_kib": grew}))
"""


def _walk_in_fresh_process(layer: Path) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", WALK, str(layer)], capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _header(name: str, type_: bytes, size: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size = type_, size
    return info.tobuf(format=tarfile.USTAR_FORMAT)


def _giant_pax_layer(path: Path) -> None:
    """A gzip layer: one pax header whose record is ``PAX_VALUE`` bytes, then disk/disk.img.
    Written in pieces: the test process never holds the 200 MiB either."""
    payload = len(b" comment=") + PAX_VALUE + 1
    length = payload + len(str(payload))
    while length != payload + len(str(length)):  # the length counts its own digits
        length = payload + len(str(length))
    record_head = f"{length} comment=".encode()
    body = length
    with gzip.open(path, "wb", compresslevel=1) as out:
        out.write(_header("././@PaxHeader", tarfile.XHDTYPE, body))
        out.write(record_head)
        piece = b"x" * MiB
        left = body - len(record_head) - 1
        while left > 0:
            out.write(piece[: min(left, MiB)])
            left -= MiB
        out.write(b"\n")
        out.write(b"\0" * (-body % 512))
        out.write(_header("disk/disk.img", tarfile.REGTYPE, 512))
        out.write(b"d" * 512)
        out.write(b"\0" * 1024)


def test_a_giant_pax_record_in_a_layer_is_refused_without_the_memory_it_asks_for(
    tmp_path: Path,
) -> None:
    layer = tmp_path / "layer.tar.gz"
    _giant_pax_layer(layer)
    assert layer.stat().st_size < MiB  # what the registry serves: tiny

    result = _walk_in_fresh_process(layer)

    assert result["error"] is not None and result["error"][:2] == ["UnsafeImage", "UnsafeImage"]
    assert f"{MAX_HEADER_BYTES}-byte limit" in str(result["error"][2])
    grew = int(str(result["grew_kib"])) * 1024
    assert grew < 50 * MiB, f"the walk grew by {grew / MiB:.0f} MiB"


def _tar(names: list[str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in names:
            tar.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
    return buf.getvalue()


def _walk(*layers: bytes) -> bytes:
    blobs = {"sha256:" + hashlib.sha256(d).hexdigest(): d for d in layers}
    descriptors = [Descriptor("", digest, len(d)) for digest, d in blobs.items()]
    return b"".join(disk_bytes(descriptors, lambda d: (c for c in [blobs[d.digest]])))


def test_the_paths_the_overlay_keeps_are_bounded_over_all_layers() -> None:
    half = MAX_LAYER_PATHS // 2 + 1
    lower = _tar([f"usr/a{i}" for i in range(half)])
    upper = _tar([f"usr/b{i}" for i in range(half)])
    with pytest.raises(UnsafeImage, match=f"more than {MAX_LAYER_PATHS} members"):
        _walk(gzip.compress(lower, 1), gzip.compress(upper, 1))
