"""The import proxy relay's copy rate (S4, ``docs/security.md``): 1 GiB through a CONNECT tunnel
on loopback, with the relay, a stand-in upstream proxy and the client in one process (so on one
core; the relay alone does better). ``.venv/bin/python benchmarks/import_proxy_relay.py``; a
measurement, not a timed test."""

from __future__ import annotations

import asyncio
import base64
import time

from cdi.importproxy.relay import ImportProxyRelay, Upstream, Upstreams
from cdi.importproxy.ticket import issue

KEY = b"k" * 32
SIZE = 1 << 30
PIECE = 1 << 20


async def upstream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A proxy that answers CONNECT and then sends ``SIZE`` bytes down the tunnel."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
    chunk = bytes(PIECE)
    for _ in range(SIZE // PIECE):
        writer.write(chunk)
        await writer.drain()
    writer.close()


async def main() -> None:
    server = await asyncio.start_server(upstream, "127.0.0.1", 0)
    target = Upstream("127.0.0.1", server.sockets[0].getsockname()[1])

    async def upstreams() -> Upstreams:
        return Upstreams(target, target)

    relay = ImportProxyRelay(KEY, upstreams)
    port = await relay.start("127.0.0.1", 0)
    ticket = base64.b64encode(issue("ns", "claim", time.time(), 60).userinfo(KEY).encode())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"CONNECT x:443 HTTP/1.1\r\nProxy-Authorization: Basic " + ticket + b"\r\n\r\n")
    started, moved = time.perf_counter(), 0
    while data := await reader.read(PIECE):
        moved += len(data)
    took = time.perf_counter() - started
    mib = moved / 2**20
    print(f"{mib:.0f} MiB in {took:.2f} s = {mib / took:.0f} MiB/s (all three in one process)")
    await relay.stop()
    server.close()


if __name__ == "__main__":
    asyncio.run(main())
