"""Micro-benchmark: the streaming qcow2 decoder against ``qemu-img convert -O raw``.

Builds a 256 MiB-virtual qcow2 holding ~100 MB of data (random, compressible patterns, and
zero pages inside allocated clusters), then times, round-robin:
- ``decoder``: read the qcow2 from the page cache in 4 MiB chunks, feed the decoder, ``pwrite``
  its writes into a fresh sparse file, ``ftruncate`` + ``fsync``;
- ``qemu-img``: ``qemu-img convert -O raw`` + ``sync FILE`` (qemu-img itself does not fsync).
It prints medians and the ratio (qemu-img time / decoder time; > 1 means the decoder is
faster). ``--compressed`` benchmarks a ``qemu-img convert -c`` image instead.

Usage: .venv/bin/python -m benchmarks.qcow2_decode [--rounds 5] [--compressed] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from datapath.decode.qcow2 import Qcow2StreamDecoder

MiB = 1024 * 1024
VIRTUAL = 256 * MiB
CHUNK = 4 * MiB


def build_source(path: Path, seed: int = 42) -> None:
    """~100 MB of data in a 256 MiB raw disk: random extents, patterns, embedded zero pages."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.truncate(VIRTUAL)
        offset = 0
        written = 0
        while written < 100 * 10**6:
            offset += rng.randrange(0, 4 * MiB, 4096)
            length = rng.randrange(64 * 1024, 3 * MiB, 4096)
            if offset + length > VIRTUAL:
                break
            f.seek(offset)
            block = rng.randbytes(length // 2) + bytes(length // 4)
            f.write(block + bytes([rng.randrange(1, 255)]) * (length - len(block)))
            offset += length
            written += length


def run_decoder(image: Path, out: Path) -> tuple[float, int]:
    start = time.perf_counter()
    decoder = Qcow2StreamDecoder()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        with open(image, "rb", buffering=0) as f:
            while chunk := f.read(CHUNK):
                for offset, data in decoder.feed(chunk):
                    os.pwrite(fd, data, offset)
        for offset, data in decoder.finish():
            os.pwrite(fd, data, offset)
        assert decoder.virtual_size is not None
        os.ftruncate(fd, decoder.virtual_size)
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - start, decoder.spill_bytes_peak


def run_qemu_img(image: Path, out: Path) -> float:
    start = time.perf_counter()
    subprocess.run(["qemu-img", "convert", "-O", "raw", str(image), str(out)], check=True)
    subprocess.run(["sync", str(out)], check=True)
    return time.perf_counter() - start


def warm(path: Path) -> None:
    """Pull the file into the page cache: both routes then read the same cached bytes."""
    with open(path, "rb", buffering=0) as f:
        while f.read(CHUNK):
            pass


def same(a: Path, b: Path) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(16 * MiB), fb.read(16 * MiB)
            if x != y:
                return False
            if not x:
                return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--compressed", action="store_true")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        work = Path(tmp)
        raw, image = work / "src.raw", work / "src.qcow2"
        build_source(raw)
        extra = ["-c"] if args.compressed else []
        subprocess.run(
            ["qemu-img", "convert", "-O", "qcow2", *extra, str(raw), str(image)], check=True
        )
        warm(image)
        ours, theirs = work / "ours.raw", work / "theirs.raw"
        t_dec: list[float] = []
        t_qemu: list[float] = []
        spill = 0
        for _ in range(args.rounds):
            elapsed, spill = run_decoder(image, ours)
            t_dec.append(elapsed)
            t_qemu.append(run_qemu_img(image, theirs))
        assert same(ours, theirs), "decoder output differs from qemu-img convert"
        report(image, t_dec, t_qemu, spill, ours, theirs)


def report(
    image: Path, t_dec: list[float], t_qemu: list[float], spill: int, ours: Path, theirs: Path
) -> None:
    dec, qemu = statistics.median(t_dec), statistics.median(t_qemu)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    size = image.stat().st_size
    print(f"qcow2 file {size / 1e6:.1f} MB, virtual {VIRTUAL // MiB} MiB")
    print(
        f"decoder  median {dec:.3f} s  (min {min(t_dec):.3f}, max {max(t_dec):.3f})  "
        f"{size / dec / 1e6:,.0f} MB/s of input, spill peak {spill} B, "
        f"allocated {ours.stat().st_blocks * 512 / MiB:.1f} MiB"
    )
    print(
        f"qemu-img median {qemu:.3f} s  (min {min(t_qemu):.3f}, max {max(t_qemu):.3f})  "
        f"allocated {theirs.stat().st_blocks * 512 / MiB:.1f} MiB"
    )
    print(f"ratio qemu-img/decoder = {qemu / dec:.2f}x  (peak RSS of this process {rss} MiB)")


if __name__ == "__main__":
    main()
