"""The routes that are timed and the ratio rows that compare them.

A route is one way to turn an image served over HTTP (or, for one reference, a local file) into
a durable `disk.img`: either our importer (`*.ours`) or a reference pipeline (`*.ref-*`) written as
a shell command. A ratio row pairs one reference with one of ours and carries the target from
the issues. Everything here is data plus pure selection logic, so the CLI tests can check it
without running anything.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

CURL = "curl -sSf"
DD_SPARSE = "dd of={out} bs=1M iflag=fullblock conv=sparse,fsync status=none"
SCRATCH_CONVERT = (
    CURL + " -o {scratch} {url} && qemu-img convert -O raw {scratch} {out}"
    " && sync {out} && rm -f {scratch}"
)

ALLOC_RATIO_LIMIT = 1.01
"""Allocated bytes of our disk.img over the reference's (issue 2)."""

PEAK_RSS_LIMIT_MB = 150.0
"""Peak resident set size of the importer process, MB = 10^6 bytes (issues 2 and 4)."""


@dataclass(frozen=True)
class Route:
    """One timed way to produce disk.img.

    `command` is a shell template for reference routes with the placeholders {url}, {out},
    {scratch} and {input} (the local path of the input file). Our routes have no command: the
    runner builds the `cdi import` argv itself so that it can read the process's own rusage.
    """

    name: str
    input_name: str
    ours: bool
    description: str
    command: str = ""
    throttled: bool = False
    upload: str = ""  # "direct" or "proxy": an upload (benchmarks/upload.py), not an import


@dataclass(frozen=True)
class RatioRow:
    """Reference time / our time, compared against `target` (higher is better for us)."""

    key: str
    label: str
    ours: str
    reference: str
    target: float
    issue: int
    needs_zero_scratch: bool = False
    # ``ours`` is a reference too (C tools in our component's place): what this machine
    # allows at best, shown against the same target; not a result of ours
    floor: bool = False


def _ours(name: str, input_name: str, *, throttled: bool = False) -> Route:
    what = "throttled per connection" if throttled else "loopback"
    return Route(
        name=f"{name}.ours",
        input_name=input_name,
        ours=True,
        description=f"cdi import {input_name} ({what})",
        throttled=throttled,
    )


UPLOAD = f"{sys.executable} {Path(__file__).resolve().parent / 'upload.py'} {{input}} {{out}}"
"""benchmarks/upload.py: one upload, timed from its first byte to a durable disk.img."""


_UPLOAD_WAYS = {
    "direct": ("", "upload {} to a python -m uploader"),
    "proxy": (" --via-proxy", "upload {} through the upload proxy to a python -m uploader"),
    "socat": (" --via-socat", "upload {} through socat (C, OpenSSL: the relay floor)"),
    "cdi": (" --cdi-way", "CDI way: curl -T over TLS to scratch, then convert/decompress, sync"),
}


def _upload(name: str, input_name: str, via: str, *, suffix: str = "ours") -> Route:
    """An upload (``via``: direct, proxy, or CDI's scratch route as a reference)."""
    flag, what = _UPLOAD_WAYS[via]
    return Route(
        name=f"{name}.{suffix}",
        input_name=input_name,
        ours=suffix == "ours",
        description=what.format(input_name),
        command=UPLOAD + flag,
        upload=via,
    )


ROUTES: tuple[Route, ...] = (
    _ours("gz", "disk.raw.gz"),
    Route(
        "gz.ref-pigz",
        "disk.raw.gz",
        False,
        "curl | pigz -dc | dd conv=sparse,fsync",
        f"{CURL} {{url}} | pigz -dc | {DD_SPARSE}",
    ),
    _ours("xz", "disk.raw.xz"),
    Route(
        "xz.ref-xzT0",
        "disk.raw.xz",
        False,
        "curl | xz -T0 -dc | dd conv=sparse,fsync",
        f"{CURL} {{url}} | xz -T0 -dc | {DD_SPARSE}",
    ),
    _ours("xz1", "disk.1.raw.xz"),
    Route(
        "xz1.ref-xz",
        "disk.1.raw.xz",
        False,
        "curl | xz -dc | dd conv=sparse,fsync (1 block)",
        f"{CURL} {{url}} | xz -dc | {DD_SPARSE}",
    ),
    _ours("zst", "disk.raw.zst"),
    Route(
        "zst.ref-zstd",
        "disk.raw.zst",
        False,
        "curl | zstd -dc | dd conv=sparse,fsync",
        f"{CURL} {{url}} | zstd -q -dc | {DD_SPARSE}",
    ),
    _ours("vmdk", "disk.vmdk"),
    Route(
        "vmdk.ref-scratch",
        "disk.vmdk",
        False,
        "curl -o scratch && qemu-img convert && sync",
        SCRATCH_CONVERT,
    ),
    _ours("vdi", "disk.vdi"),
    Route(
        "vdi.ref-scratch",
        "disk.vdi",
        False,
        "curl -o scratch && qemu-img convert && sync",
        SCRATCH_CONVERT,
    ),
    _ours("qcow2", "disk.qcow2"),
    Route(
        "qcow2.ref-scratch",
        "disk.qcow2",
        False,
        "CDI way: curl -o scratch && qemu-img convert && sync",
        SCRATCH_CONVERT,
    ),
    Route(
        "qcow2.ref-local",
        "disk.qcow2",
        False,
        "local qemu-img convert && sync (no network)",
        "qemu-img convert -O raw {input} {out} && sync {out}",
    ),
    _ours("cqcow2", "disk.c.qcow2"),
    Route(
        "cqcow2.ref-scratch",
        "disk.c.qcow2",
        False,
        "CDI way: curl -o scratch && qemu-img convert && sync",
        SCRATCH_CONVERT,
    ),
    _ours("raw", "disk.raw"),
    Route(
        "raw.ref-curl",
        "disk.raw",
        False,
        "single curl -o disk.img && sync",
        f"{CURL} -o {{out}} {{url}} && sync {{out}}",
    ),
    _upload("upqcow2", "disk.qcow2", "direct"),
    _upload("upqcow2", "disk.qcow2", "cdi", suffix="ref-scratch"),
    _upload("upgz", "disk.raw.gz", "direct"),
    _upload("upgz", "disk.raw.gz", "cdi", suffix="ref-scratch"),
    _upload("upqcow2proxy", "disk.qcow2", "proxy"),
    _upload("upqcow2proxy", "disk.qcow2", "direct", suffix="ref-direct"),
    _upload("upgzproxy", "disk.raw.gz", "proxy"),
    _upload("upgzproxy", "disk.raw.gz", "direct", suffix="ref-direct"),
    _upload("upqcow2proxy", "disk.qcow2", "socat", suffix="ref-socat"),
    _upload("upgzproxy", "disk.raw.gz", "socat", suffix="ref-socat"),
    _ours("rawslow", "disk.raw", throttled=True),
    Route(
        "rawslow.ref-curl",
        "disk.raw",
        False,
        "single curl -o disk.img && sync (throttled)",
        f"{CURL} -o {{out}} {{url}} && sync {{out}}",
        throttled=True,
    ),
)

RATIO_ROWS: tuple[RatioRow, ...] = (
    RatioRow("gz", "raw.gz vs curl|pigz|dd", "gz.ours", "gz.ref-pigz", 2.5, 2),
    RatioRow("xz", "raw.xz multi-block vs curl|xz -T0|dd", "xz.ours", "xz.ref-xzT0", 1.0, 2),
    RatioRow("xz1", "raw.xz single-block vs curl|xz|dd", "xz1.ours", "xz1.ref-xz", 0.95, 2),
    RatioRow("zst", "raw.zst vs curl|zstd -dc|dd", "zst.ours", "zst.ref-zstd", 1.0, 2),
    RatioRow("vmdk", "vmdk vs curl+qemu-img", "vmdk.ours", "vmdk.ref-scratch", 1.0, 2),
    RatioRow("vdi", "vdi vs curl+qemu-img", "vdi.ours", "vdi.ref-scratch", 1.0, 2),
    RatioRow(
        "qcow2",
        "qcow2 vs CDI way (scratch)",
        "qcow2.ours",
        "qcow2.ref-scratch",
        1.5,
        4,
        needs_zero_scratch=True,
    ),
    RatioRow(
        "qcow2-local", "qcow2 vs local qemu-img convert", "qcow2.ours", "qcow2.ref-local", 0.9, 4
    ),
    RatioRow(
        "cqcow2",
        "compressed qcow2 vs CDI way",
        "cqcow2.ours",
        "cqcow2.ref-scratch",
        1.3,
        4,
        needs_zero_scratch=True,
    ),
    RatioRow("raw", "raw (parallel ranges) vs single curl", "raw.ours", "raw.ref-curl", 1.0, 4),
    RatioRow(
        "up-qcow2",
        "qcow2 upload vs CDI's upload way (scratch + qemu-img)",
        "upqcow2.ours",
        "upqcow2.ref-scratch",
        1.5,
        12,
        needs_zero_scratch=True,
    ),
    RatioRow(
        "up-gz",
        "raw.gz upload vs CDI's upload way (scratch + decompress)",
        "upgz.ours",
        "upgz.ref-scratch",
        1.0,
        12,
    ),
    RatioRow(
        "up-qcow2-proxy",
        "qcow2 upload through the proxy vs straight to the server",
        "upqcow2proxy.ours",
        "upqcow2proxy.ref-direct",
        0.9,
        12,
    ),
    RatioRow(
        "up-gz-proxy",
        "raw.gz upload through the proxy vs straight to the server",
        "upgzproxy.ours",
        "upgzproxy.ref-direct",
        0.9,
        12,
    ),
    RatioRow(  # the floor: no proxy written in any language passes where this fails
        "up-qcow2-socat",
        "floor: qcow2 upload through socat (C) instead of the proxy vs straight",
        "upqcow2proxy.ref-socat",
        "upqcow2proxy.ref-direct",
        0.9,
        12,
        floor=True,
    ),
    RatioRow(
        "up-gz-socat",
        "floor: raw.gz upload through socat (C) instead of the proxy vs straight",
        "upgzproxy.ref-socat",
        "upgzproxy.ref-direct",
        0.9,
        12,
        floor=True,
    ),
    RatioRow(
        "rawslow",
        "raw, throttled per connection, vs single curl",
        "rawslow.ours",
        "rawslow.ref-curl",
        1.0,
        4,
    ),
)


def split_patterns(values: Iterable[str]) -> list[str]:
    """Flatten repeated and comma-separated `--only` values into a list of globs."""
    return [p.strip() for v in values for p in v.split(",") if p.strip()]


def select_routes(
    patterns: Sequence[str], *, throttled: bool = True, routes: Sequence[Route] = ROUTES
) -> list[Route]:
    """Routes whose name matches any glob (all when no pattern), in table order.

    A pattern without glob characters matches as a prefix too, so `--only gz` selects
    `gz.ours` and `gz.ref-pigz`; `--only '*.ref-*'` selects every reference and no route of ours.
    """

    def matches(name: str) -> bool:
        if not patterns:
            return True
        for p in patterns:
            if fnmatch.fnmatchcase(name, p):
                return True
            if not any(c in p for c in "*?[") and name.startswith(p + "."):
                return True
        return False

    return [r for r in routes if matches(r.name) and (throttled or not r.throttled)]


def rows_for(selected: Iterable[Route], rows: Sequence[RatioRow] = RATIO_ROWS) -> list[RatioRow]:
    """Ratio rows that have at least one of their two routes selected."""
    names = {r.name for r in selected}
    return [row for row in rows if row.ours in names or row.reference in names]


def inputs_for(selected: Iterable[Route]) -> list[str]:
    """Input files the selected routes need, disk.raw always included (it is the oracle)."""
    needed = {"disk.raw"} | {r.input_name for r in selected}
    order = [r.input_name for r in ROUTES]
    return sorted(needed, key=lambda n: order.index(n) if n in order else -1)
