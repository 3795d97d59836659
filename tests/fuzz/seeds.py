"""A small valid corpus per target, built by the same builders the unit tests use.

Each seed starts with the chunk-size selector byte (``targets._chunks``). Seeds cover the
layouts the decoders branch on (ordered, tables after data, compressed, zero entries,
extended L2, version 2, zstd) so the fuzzer starts from inputs that reach deep code.
"""

from __future__ import annotations

import io
import os
import tarfile

from tests.unit import qcow2_builder as q
from tests.unit.disk_builders import VdiSpec, VmdkSpec, build_vdi, build_vmdk

_DATA = bytes(range(256)) * 2


def _qcow2() -> list[bytes]:
    base = {0: _DATA, 3: b"\x01" * 512, 100: _DATA}
    specs = [
        q.Spec(data=dict(base)),
        q.Spec(data=dict(base), compressed={3}, zero={5}),
        q.Spec(data=dict(base), version=2, header_length=72),
        q.Spec(data=dict(base), extended_l2=True, cluster_bits=12),
        q.Spec(data=dict(base), layout="data-first"),
        q.Spec(data=dict(base), layout="l1-last"),
        q.Spec(data=dict(base), compressed={0, 3}, zstd=True),
    ]
    return [q.build(spec) for spec in specs]


def _vmdk() -> list[bytes]:
    grains = {0: b"\x02" * 4096, 5: b"\x03" * 100}
    specs = [
        VmdkSpec(grains=dict(grains)),
        VmdkSpec(grains=dict(grains), zeroed={2}, order=[5, 0]),
        VmdkSpec(grains=dict(grains), compressed=True, version=3),
        VmdkSpec(grains=dict(grains), gd_at_end=True),
        VmdkSpec(grains=dict(grains), grains_first=True),
    ]
    return [build_vmdk(spec) for spec in specs]


def _vdi() -> list[bytes]:
    specs = [
        VdiSpec(disk_size=2 << 20, blocks={1: b"\x04" * 1000}),
        VdiSpec(disk_size=2 << 20, blocks={0: b"\x05" * 10}, zero={1}),
        VdiSpec(disk_size=2 << 20, blocks={1: b"\x06"}, map_after_data=True),
        VdiSpec(disk_size=3 << 20, blocks={}, zero={0, 2}),
    ]
    return [build_vdi(spec) for spec in specs]


def _tar() -> list[bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        _add(archive, "dir/", tarfile.DIRTYPE)
        _add(archive, "dir/file.txt", tarfile.REGTYPE, b"hello\n")
        _add(archive, "dir/link", tarfile.SYMTYPE, link="file.txt")
        _add(archive, "hard", tarfile.LNKTYPE, link="dir/file.txt")
        _add(archive, "disk/disk.img", tarfile.REGTYPE, b"\0" * 1024)
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _add(archive, "long/" + "n" * 120, tarfile.REGTYPE, b"x")
    return [out.getvalue(), pax.getvalue()]


def _add(
    archive: tarfile.TarFile, name: str, kind: bytes, data: bytes = b"", link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data), link
    archive.addfile(info, io.BytesIO(data) if data else None)


SEEDS = {"qcow2": _qcow2, "vmdk": _vmdk, "vdi": _vdi, "tar": _tar}


def write_corpus(target: str, folder: str) -> int:
    """Write the target's seeds (each with a few chunk selectors) into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    count = 0
    for i, image in enumerate(SEEDS[target]()):
        for selector in (0, 2, 4):
            with open(os.path.join(folder, f"seed-{i}-{selector}"), "wb") as fh:
                fh.write(bytes([selector]) + image)
            count += 1
    return count
