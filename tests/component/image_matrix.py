"""What the decoder matrices share (qcow2, vdi, vmdk built by qemu's own tools, qemu-img as
the oracle): the tool runners, the source disk, the two recipe families (``converted`` from a
raw disk, ``written`` out of order by qemu-io), decoding into a sparse file, and the one check
every matrix image gets: byte-identical to ``qemu-img convert -O raw`` and no less sparse.

One module so a new format's matrix is a table of recipes, not another copy of the harness.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.component.conftest import same_content
from tests.unit.stream_decoding import Decoder

MiB = 1024 * 1024
CHUNKS = (65537, MiB, 4 * MiB)
Recipe = Callable[[Path], Path]


def run(*args: str | Path) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed: {done.stderr}"


def qemu_io(image: Path, *commands: str, fmt: str = "qcow2") -> None:
    args: list[str | Path] = ["qemu-io", "-f", fmt]
    for command in commands:
        args += ["-c", command]
    run(*args, image)


def random_file(path: Path, size: int, seed: int) -> Path:
    path.write_bytes(random.Random(seed).randbytes(size))
    return path


def source_raw(path: Path, size: int = 24 * MiB, seed: int = 1) -> Path:
    """A raw disk with random data, constant patterns, zero pages inside data and holes."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(size)
        for off, length in ((0, 300_000), (3 * MiB + 512, 700_000), (9 * MiB, 64 * 1024)):
            f.seek(off)
            f.write(rng.randbytes(length))
        f.seek(5 * MiB)
        f.write(b"\xab" * (1 * MiB) + bytes(12288) + b"\x01" * 5000)
        f.seek(size - 4096)
        f.write(b"\x7f" * 4096)
    return path


def converted(fmt: str, *opts: str, compress: bool = False, size: int = 24 * MiB) -> Recipe:
    """``qemu-img convert`` of ``source_raw`` into ``fmt`` with the given ``-o`` options."""

    def build(d: Path) -> Path:
        raw = source_raw(d / "src.raw", size)
        out = d / f"img.{fmt}"
        extra = ["-c"] if compress else []
        options = ["-o", ",".join(opts)] if opts else []
        run("qemu-img", "convert", "-f", "raw", "-O", fmt, *extra, *options, raw, out)
        return out

    return build


UNORDERED_WRITES = (
    "write -s {rnd} 20M 1M",
    "write -P 0x5a 2M 512k",
    "write -s {rnd} 12M 700k",
    "write -P 0x11 100k 8k",
    "write -P 0x22 31M 1M",
)


def written(
    fmt: str, opts: str = "", size: str = "32M", *, ops: Iterable[str] = (), zero: bool = False
) -> Recipe:
    """``qemu-img create``, then qemu-io writes out of order (``UNORDERED_WRITES`` unless
    ``ops`` are given, plus a zero write with ``zero``): clusters, blocks and grains are
    allocated in write order, so physical order differs from virtual order."""

    def build(d: Path) -> Path:
        rnd = random_file(d / "rand.bin", 2 * MiB, seed=7)
        out = d / f"img.{fmt}"
        run("qemu-img", "create", "-f", fmt, *(["-o", opts] if opts else []), out, size)
        commands = list(ops) or [*UNORDERED_WRITES, *(["write -z 12M 64k"] if zero else [])]
        qemu_io(out, *[c.replace("{rnd}", str(rnd)) for c in commands], fmt=fmt)
        return out

    return build


def oracle_of(fmt: str, image: Path) -> Path:
    """``qemu-img convert -O raw`` of ``image`` next to it, synced (st_blocks is compared)."""
    oracle = image.with_name("oracle.raw")
    run("qemu-img", "convert", "-f", fmt, "-O", "raw", image, oracle)
    run("sync", oracle)
    return oracle


def decode_to_file(image: Path, out: Path, chunk: int, decoder: Decoder) -> Decoder:
    """Feed ``image`` to ``decoder`` in ``chunk``-byte reads; write a sparse file."""
    writes: list[tuple[int, bytes | memoryview]] = []
    with open(image, "rb") as f:
        while data := f.read(chunk):
            writes += decoder.feed(data)
    writes += decoder.finish()
    assert decoder.virtual_size is not None
    writes.sort(key=lambda write: write[0])
    for (a, da), (b, _) in itertools.pairwise(writes):
        assert a + len(da) <= b, "writes overlap"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, decoder.virtual_size)
        for offset, data in writes:
            assert data, "empty write"
            os.pwrite(fd, data, offset)
        os.fsync(fd)  # settle ext4 delayed allocation before st_blocks is compared
    finally:
        os.close(fd)
    return decoder


def assert_decodes_like_qemu_img(
    name: str,
    image: Path,
    oracle: Path,
    out_dir: Path,
    make: Callable[[], Decoder],
    chunks: Iterable[int] = CHUNKS,
) -> None:
    """In every chunking: the same bytes as qemu-img, the same size, no more allocated."""
    for chunk in chunks:
        out = out_dir / f"out-{chunk}.raw"
        decode_to_file(image, out, chunk, make())
        assert out.stat().st_size == oracle.stat().st_size, name
        assert same_content(out, oracle), f"{name}: content differs with chunk {chunk}"
        assert out.stat().st_blocks <= oracle.stat().st_blocks, f"{name}: less sparse ({chunk})"
        out.unlink()
