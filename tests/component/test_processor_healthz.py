"""An aiohttp app hosting the processor stays responsive while qemu-img converts.

The upload server will run the data path inside its own event loop, so nothing the processor
does may block that loop: qemu-img runs as an asyncio subprocess and every open, fsync and
chmod runs on a thread. The probe is real: a loopback client polls ``/healthz`` on the same
loop while a vhdx (which only qemu-img converts) goes through Convert.
"""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from datapath import FileSource, Processor, ProcessPlan, Progress, TargetSpec
from tests.component.conftest import MiB, run, same_content

PAUSE = 0.01  # between probes


def vhdx_image(d: Path, size: int = 256 * MiB) -> tuple[Path, Path]:
    raw = d / "data.raw"
    rng = random.Random(3)
    with open(raw, "wb") as fh:
        for _ in range(size // (8 * MiB)):
            fh.write(rng.randbytes(8 * MiB))
    image = d / "disk.vhdx"
    run("qemu-img", "convert", "-f", "raw", "-O", "vhdx", raw, image)
    return image, raw


async def _probe(
    url: str, progress: Progress, job: asyncio.Task[object]
) -> list[tuple[str, float]]:
    samples: list[tuple[str, float]] = []
    async with aiohttp.ClientSession() as session:
        while not job.done():
            phase = progress.phase
            started = time.perf_counter()
            async with session.get(url) as response:
                assert response.status == 200
                await response.read()
            samples.append((phase, time.perf_counter() - started))
            await asyncio.sleep(PAUSE)
    return samples


async def test_healthz_answers_within_100_ms_while_a_vhdx_converts(tmp_path: Path) -> None:
    image, raw = vhdx_image(tmp_path)
    app = web.Application()

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    target = tmp_path / "disk.img"
    progress = Progress()
    plan = ProcessPlan(target=TargetSpec(str(target), block=False))
    try:
        job = asyncio.ensure_future(Processor(plan, FileSource(str(image)), progress).run())
        samples = await _probe(f"http://127.0.0.1:{port}/healthz", progress, job)
        result = job.result()
    finally:
        await runner.cleanup()
    assert result.succeeded, result
    assert same_content(target, raw)
    converting = [latency for phase, latency in samples if phase == "Converting"]
    assert len(converting) >= 5, f"too few probes during Convert: {samples}"
    assert max(converting) < 0.1, f"slowest answer during Convert: {max(converting):.3f} s"
