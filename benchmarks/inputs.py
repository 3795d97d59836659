"""Build the test images once and cache them under the work directory.

The image is an OS-like ext4 filesystem made with `mkfs.ext4 -d` from a staging copy of system
files (perf-baselines 2.1): real binaries, libraries, compressed man pages and scripts, the rest
holes. Every other input is derived from disk.raw with the tool a publisher would use. The cache
directory is keyed by the virtual size, the data budget and a recipe version, so a rerun with the
same options only checks that the files are there.

Derived files are independent, so they are built on two workers; the single-threaded
`xz -T1` (the slowest step by far) is started first so that it overlaps with everything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

RECIPE_VERSION = 1
CHUNK = 4 << 20

STAGE_ROOTS: tuple[str, ...] = (
    "usr/bin",
    "usr/lib/gcc",
    f"usr/lib/python3.{sys.version_info.minor}",
    "usr/share/man",
    "usr/share/vim",
    "usr/share/perl",
)
"""Staging content as in perf-baselines 2.1 (about 600 MB on a Debian 12 machine)."""

FILLER_ROOTS: tuple[str, ...] = ("usr/lib/x86_64-linux-gnu", "usr/share")
"""Used only when the budget asks for more data than STAGE_ROOTS hold."""

# Shell templates for the derived inputs; {raw} is disk.raw, {tmp} the file being written.
DERIVED: dict[str, str] = {
    "disk.1.raw.xz": "xz -6 -T1 -c {raw} > {tmp}",
    "disk.raw.xz": "xz -6 -T0 -c {raw} > {tmp}",
    "disk.c.qcow2": "qemu-img convert -f raw -O qcow2 -c {raw} {tmp}",
    "disk.raw.gz": "pigz -6 -c {raw} > {tmp}",
    "disk.raw.zst": "zstd -q -3 -c {raw} > {tmp}",
    "disk.qcow2": "qemu-img convert -f raw -O qcow2 {raw} {tmp}",
    "disk.vmdk": "qemu-img convert -f raw -O vmdk {raw} {tmp}",
    "disk.vdi": "qemu-img convert -f raw -O vdi {raw} {tmp}",
}

Log = Callable[[str], None]


@dataclass(frozen=True)
class BuildSpec:
    """What to build: virtual disk size and how many bytes of files to stage into it."""

    virtual_size: int
    data_budget: int

    @property
    def key(self) -> str:
        return f"inputs-{self.virtual_size}-{self.data_budget // 10**6}MB-v{RECIPE_VERSION}"


@dataclass(frozen=True)
class InputSet:
    """A built, cached set of inputs plus the facts the benchmark needs about them."""

    directory: Path
    virtual_size: int
    raw_sha256: str
    manifest: dict[str, object]

    def path(self, name: str) -> Path:
        return self.directory / name


def sha256_file(path: Path) -> str:
    """Hex sha256 of a whole file, read in 4 MiB pieces."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _walk_files(root: Path) -> Iterable[tuple[Path, int]]:
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            p = Path(dirpath, name)
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_symlink():
                yield p, 0
            elif p.is_file() and os.access(p, os.R_OK):
                yield p, st.st_size


def _shuffled(files: list[tuple[Path, int]]) -> list[tuple[Path, int]]:
    return sorted(files, key=lambda c: zlib.crc32(str(c[0]).encode()))


def choose_files(budget: int, source: Path = Path("/")) -> list[tuple[Path, int]]:
    """A deterministic sample of system files adding up to about `budget` bytes.

    STAGE_ROOTS come first; FILLER_ROOTS only top up a budget they cannot fill. Within the tier
    that does not fit whole, files are taken in the order of a hash of their path (a fixed
    shuffle), so a small budget still gets binaries, libraries, man pages and scripts in about
    the same proportions as a large one.
    """
    chosen: list[tuple[Path, int]] = []
    seen: set[Path] = set()
    used = 0
    for roots in (STAGE_ROOTS, FILLER_ROOTS):
        tier: list[tuple[Path, int]] = []
        for rel in roots:
            for p, size in _walk_files(source / rel):
                if p not in seen:
                    seen.add(p)
                    tier.append((p, size))
        for p, size in _shuffled(tier):
            if used + size <= budget:
                chosen.append((p, size))
                used += size
        if used >= budget * 0.99:
            break
    return sorted(chosen)


def stage(files: Sequence[tuple[Path, int]], dest: Path, source: Path = Path("/")) -> int:
    """Copy the chosen files (symlinks as symlinks) under `dest`; returns bytes copied."""
    copied = 0
    for p, size in files:
        target = dest / p.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            if p.is_symlink():
                os.symlink(os.readlink(p), target)
            else:
                shutil.copy2(p, target, follow_symlinks=False)
                copied += size
        except OSError:
            continue
    return copied


def _sh(cmd: str) -> None:
    subprocess.run(["bash", "-o", "pipefail", "-c", cmd], check=True)


def _build_raw(spec: BuildSpec, directory: Path, log: Log) -> dict[str, object]:
    if spec.data_budget > spec.virtual_size * 0.7:
        raise ValueError("data budget must stay under 70% of the virtual size for mkfs.ext4")
    staging = directory / "stage"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    t0 = time.monotonic()
    files = choose_files(spec.data_budget)
    copied = stage(files, staging)
    log(f"staged {len(files)} files, {copied / 1e6:.1f} MB in {time.monotonic() - t0:.1f} s")
    tmp = directory / "disk.raw.tmp"
    tmp.unlink(missing_ok=True)
    with tmp.open("wb") as f:
        f.truncate(spec.virtual_size)
    t0 = time.monotonic()
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "rootfs", "-d", str(staging), str(tmp)], check=True
    )
    log(f"mkfs.ext4 -d: {time.monotonic() - t0:.1f} s")
    shutil.rmtree(staging)
    tmp.rename(directory / "disk.raw")
    return {"staged_files": len(files), "staged_bytes": copied}


def _xz_blocks(path: Path) -> int:
    out = subprocess.run(
        ["xz", "--robot", "--list", str(path)], check=True, capture_output=True, text=True
    ).stdout
    for line in out.splitlines():
        fields = line.split("\t")
        if fields[0] == "totals":
            return int(fields[2])
    raise RuntimeError(f"cannot read the block count of {path}")


def _build_derived(name: str, directory: Path, log: Log) -> None:
    tmp = directory / f"{name}.tmp"
    t0 = time.monotonic()
    _sh(DERIVED[name].format(raw=directory / "disk.raw", tmp=tmp))
    tmp.rename(directory / name)
    log(
        f"built {name} ({(directory / name).stat().st_size / 1e6:.1f} MB) "
        f"in {time.monotonic() - t0:.1f} s"
    )


def ensure_inputs(spec: BuildSpec, workdir: Path, names: Iterable[str], log: Log) -> InputSet:
    """Build whatever of `names` is missing from the cache directory and return the set."""
    directory = workdir / spec.key
    directory.mkdir(parents=True, exist_ok=True)
    manifest_path = directory / "manifest.json"
    manifest: dict[str, object] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    )
    raw = directory / "disk.raw"
    if not raw.exists():
        log(f"building inputs in {directory}")
        manifest = {"virtual_size": spec.virtual_size, **_build_raw(spec, directory, log)}
    if "raw_sha256" not in manifest:
        manifest["raw_sha256"] = sha256_file(raw)
        manifest["raw_allocated"] = raw.stat().st_blocks * 512
    missing = [n for n in DERIVED if n in set(names) and not (directory / n).exists()]
    if missing:
        # xz -T1 first: it runs alone on one worker while the other worker does the rest.
        with ThreadPoolExecutor(max_workers=2) as pool:
            for future in [pool.submit(_build_derived, n, directory, log) for n in missing]:
                future.result()
    sizes = {
        n: (directory / n).stat().st_size
        for n in [*DERIVED, "disk.raw"]
        if (directory / n).exists()
    }
    manifest["sizes"] = sizes
    for name in ("disk.raw.xz", "disk.1.raw.xz"):
        if (directory / name).exists() and f"{name}_blocks" not in manifest:
            manifest[f"{name}_blocks"] = _xz_blocks(directory / name)
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    blocks = manifest.get("disk.1.raw.xz_blocks")
    if blocks not in (None, 1):
        raise RuntimeError(f"disk.1.raw.xz should be one xz block, it has {blocks}")
    return InputSet(directory, spec.virtual_size, str(manifest["raw_sha256"]), manifest)
