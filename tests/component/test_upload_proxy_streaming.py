"""The upload proxy streams: 1 GiB passes through a separate proxy process whose peak RSS
(VmHWM from /proc) stays under 150 MB, and the peer receives every byte."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from cdi.upload.token import UploadGrant, issue
from tests.component.test_upload_proxy import pvc
from tests.component.upload_peers import UploadPeer, make_pki
from tests.component.upload_proxy_process import process_config

GiB = 1 << 30
PIECE = b"\xa5" * (1 << 20)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc status")


async def test_one_gib_streams_through_the_proxy_in_flat_memory(tmp_path: Path) -> None:
    pki = make_pki()
    peer = UploadPeer()
    runner = web.AppRunner(peer.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=pki.peer_serving())
    await site.start()
    peer_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    config = process_config(pki, [pvc("disk")], f"https://127.0.0.1:{peer_port}")
    (tmp_path / "proxy.json").write_text(json.dumps(config))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.component.upload_proxy_process",
            str(tmp_path / "proxy.json"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        # the proxy process checks expiry with the wall clock: issue the token now
        token = issue(pki.ring, UploadGrant("tenant", "disk", "uid-disk"), dt.datetime.now(dt.UTC))

        async def body() -> AsyncIterator[bytes]:
            for _ in range(GiB // len(PIECE)):
                yield PIECE

        headers = {"Authorization": f"Bearer {token}", "Content-Length": str(GiB)}
        connector = aiohttp.TCPConnector(ssl=pki.client_trusting_proxy())
        started = time.monotonic()
        async with (
            aiohttp.ClientSession(connector=connector) as s,
            s.post(f"https://127.0.0.1:{port}/v1beta1/upload", data=body(), headers=headers) as r,
        ):
            assert r.status == 200, await r.text()
        elapsed = time.monotonic() - started
        peak = peak_rss_mb(proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        await runner.cleanup()
    print(f"1 GiB through the proxy in {elapsed:.1f} s, proxy peak RSS {peak:.0f} MB")
    assert (peer.seen[0].received, peer.seen[0].complete) == (GiB, True)
    assert peak < 150, f"proxy peak RSS {peak:.0f} MB"
