"""``cdi demo``: the main job on an embedded default, no cluster needed.

Builds a small OS-like disk (an ext4 filesystem holding this project and the Python standard
library, made with ``mkfs.ext4 -d``, the rest holes), converts it to qcow2, serves it over
loopback HTTP and imports
it with the same code path as ``cdi import`` and the import pod, then checks the result against
``qemu-img convert`` of the same image.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from aiohttp import web

from cdi.api.netpolicy import LOOPBACK, NetPolicy
from commands.output import print_result, with_progress
from datapath import TargetSpec, parse_checksum
from importer.config import HttpOptions, ImportConfig, build_plan, parse_size


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def build_image(work: Path, size: str) -> Path:
    """An ext4 disk with real files in it, as qcow2."""
    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    # Real files: this project and the Python standard library (~80 MB on any machine).
    skip = shutil.ignore_patterns("__pycache__", "site-packages", "test", "tests", ".venv")
    root = Path(__file__).resolve().parent.parent
    for package in ("cdi", "importer"):
        shutil.copytree(root / package, stage / package, ignore=skip)
    shutil.copytree(
        os.path.dirname(os.__file__), stage / "usr/lib/python3", ignore=skip, symlinks=True
    )
    raw, qcow2 = work / "source.raw", work / "disk.qcow2"
    raw.unlink(missing_ok=True)
    with open(raw, "wb") as fh:
        fh.truncate(parse_size(size))
    subprocess.run(["mkfs.ext4", "-q", "-F", "-L", "demo", "-d", str(stage), str(raw)], check=True)
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True
    )
    return qcow2


async def _serve_and_import(image: Path, image_bytes: int, target: Path) -> int:
    app = web.Application()
    app.router.add_static("/", image.parent)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    url = f"http://127.0.0.1:{port}/{image.name}"
    print(f"serving {image.name} ({image_bytes:,} bytes) at {url}")
    source = HttpOptions(url=url, policy=NetPolicy.parse(LOOPBACK))  # served on loopback
    plan = build_plan(
        source,
        TargetSpec(path=str(target), block=False),
        checksum=parse_checksum(f"sha256:{_sha256(image)}"),  # verified on the way in
        scratch_dir=None,
    )
    config = ImportConfig(plan=plan, source=source)
    try:
        message = await with_progress(config, show=sys.stderr.isatty())
    finally:
        await runner.cleanup()
    print_result(message, as_json=False)
    return 0 if message.succeeded else 1


def run_demo(workdir: str, size: str) -> int:
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    print(f"building a {size} ext4 disk image as qcow2 in {work} ...")
    image = build_image(work, size)
    target = work / "vol" / "disk.img"
    target.parent.mkdir(exist_ok=True)
    target.unlink(missing_ok=True)
    status = asyncio.run(_serve_and_import(image, image.stat().st_size, target))
    if status:
        return status
    reference = work / "reference.raw"
    subprocess.run(
        ["qemu-img", "convert", "-f", "qcow2", "-O", "raw", str(image), str(reference)], check=True
    )
    ours, theirs = _sha256(target), _sha256(reference)
    allocated = target.stat().st_blocks * 512
    print(f"  disk.img:      {target} ({allocated:,} bytes allocated of {target.stat().st_size:,})")
    print(f"  sha256:        {ours}")
    print(f"  qemu-img says: {theirs} -> {'identical' if ours == theirs else 'DIFFERENT'}")
    reference.unlink()
    return 0 if ours == theirs else 1
