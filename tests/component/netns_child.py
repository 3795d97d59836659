"""The inside of a network-policy test: runs in a fresh network and mount namespace that
``test_netpolicy_netns`` creates with ``unshare --net --mount``, never on the host's network.

Why a separate process: a network namespace belongs to a thread, and the importer dials from
worker threads; only a process that starts inside the namespace has every thread there. Before
touching anything it proves it is isolated (a different namespace than its parent's, and no
interface but ``lo``), then puts the refused addresses (metadata, link-local, private) on its own
loopback with a *canary* listener on each, bind-mounts a private ``/etc/hosts`` whose names
resolve to them, serves a small image and redirects from an allowed 127.0.0.1 server, runs one
import per URL with the given policy, and prints JSON: each import's reason and message, and how
many connections each canary accepted. The test asserts on that.

Input (stdin, JSON): ``parent_netns`` (inode of the parent's /proc/self/ns/net), ``workdir``,
``allowed`` (CIDRs), ``port`` (the canaries' port; they also listen on 80), ``urls`` (templates:
``{redirect}`` is the loopback redirector's origin, ``{port}`` the canary port).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

from cdi.api.netpolicy import NetPolicy
from tests.component.helpers import import_url

CANARIES = ("169.254.169.254", "10.0.0.1", "100.100.100.200", "192.168.1.1", "fd00:ec2::254")
HOSTS = """127.0.0.1 localhost
169.254.169.254 metadata.test
10.0.0.1 internal.test
fd00:ec2::254 imds6.test
127.0.0.1 mixed.test
10.0.0.1 mixed.test
"""


def _isolated(parent_netns: int) -> None:
    """Refuse to run anywhere but in a fresh namespace: the addresses added below must never
    land on a real host's interfaces."""
    if os.stat("/proc/self/ns/net").st_ino == parent_netns:
        raise SystemExit("netns_child: not in a new network namespace")
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True)
    names = {line.split(":")[1].strip() for line in links.stdout.splitlines()}
    if names != {"lo"}:
        raise SystemExit(f"netns_child: unexpected interfaces {names}")


def _set_up(workdir: Path) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    for address in CANARIES:
        family, prefix = ("-6", "128") if ":" in address else ("-4", "32")
        extra = ["nodad"] if family == "-6" else []
        cmd = ["ip", family, "addr", "add", f"{address}/{prefix}", "dev", "lo", *extra]
        subprocess.run(cmd, check=True)
    hosts = workdir / "hosts"
    hosts.write_text(HOSTS)
    subprocess.run(["mount", "--bind", str(hosts), "/etc/hosts"], check=True)


class Canary:
    """TCP listeners that count accepted connections and answer nothing."""

    def __init__(self, ports: tuple[int, ...]) -> None:
        self.hits: dict[str, int] = {a: 0 for a in CANARIES}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        for address in CANARIES:
            for port in ports:
                family = socket.AF_INET6 if ":" in address else socket.AF_INET
                server = socket.create_server((address, port), family=family)
                server.settimeout(0.1)
                thread = threading.Thread(target=self._serve, args=(server, address), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _serve(self, server: socket.socket, address: str) -> None:
        with server:
            while not self._stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                self.hits[address] += 1
                conn.close()
            server.setblocking(False)
            while True:  # connections queued while stopping count too
                try:
                    server.accept()[0].close()
                except BlockingIOError:
                    break
                self.hits[address] += 1

    def stop(self) -> dict[str, int]:
        self._stop.set()
        for thread in self._threads:
            thread.join()
        return self.hits


async def _redirector(image: Path) -> tuple[web.AppRunner, str]:
    """127.0.0.1: ``/image`` serves the image, ``/to?u=URL`` redirects to URL, ``/cut?u=URL``
    cuts the body halfway and redirects the resuming Range request to URL."""

    async def to(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(request.query["u"])

    async def cut(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Range"):
            raise web.HTTPFound(request.query["u"])
        data = image.read_bytes()
        resp = web.StreamResponse(headers={"Accept-Ranges": "bytes"})
        resp.content_length = len(data)
        await resp.prepare(request)
        if request.method == "GET":
            await resp.write(data[: len(data) // 2])
            assert request.transport is not None
            request.transport.abort()
        return resp

    app = web.Application()
    app.router.add_get("/to", to)
    app.router.add_get("/cut", cut)
    app.router.add_get("/image", lambda _: web.FileResponse(image))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _run(spec: dict[str, Any]) -> dict[str, Any]:
    workdir = Path(spec["workdir"])
    image = workdir / "image.raw"
    image.write_bytes(os.urandom(256 * 1024))
    canary = Canary((80, int(spec["port"])))
    runner, redirect = await _redirector(image)
    policy = NetPolicy.parse(spec["allowed"])
    results = []
    try:
        for i, template in enumerate(spec["urls"]):
            url = template.format(redirect=redirect, port=spec["port"])
            target = workdir / f"disk{i}.img"
            result = await import_url(url, target, policy=policy, attempts=2, resumes=1)
            results.append({"url": url, "reason": result.reason, "message": result.message})
    finally:
        await runner.cleanup()
        hits = canary.stop()
    return {"results": results, "canary": hits}


def main() -> None:
    spec = json.load(sys.stdin)
    _isolated(int(spec["parent_netns"]))
    _set_up(Path(spec["workdir"]))
    print(json.dumps(asyncio.run(_run(spec))))


if __name__ == "__main__":
    main()
