"""A stand-in for the upload server on a clone's target: ``POST /v1beta1/upload`` over mutual
TLS, only from the client certificate whose CN names the clone, written through the data path
(``datapath.Processor`` over a ``StreamSource`` of the request body), as ``uploader/`` does.

The clone benchmark (``benchmarks/clone.py``) runs it as its own process, so its peak RSS is
the target pod's; the clone source's component tests (``tests/component/test_clone_source.py``)
run the same app in-process. ``python -m benchmarks.clone_receiver --target T [--block] --cert C
--key K --client-ca CA --client-name N --port-file F`` serves one upload and exits with its
termination message on stdout.

``--threaded`` measures the upload server's proposed next step instead of aiohttp: the request
is read on a thread from a blocking TLS socket (headers and chunk-size lines through a small
buffer, chunk data ``readinto`` a fresh 4 MiB buffer: OpenSSL decrypts straight into it) and each
chunk is handed to the same data path on the event loop; only one copy (bytearray -> bytes, the
data path's type) is left of the four that asyncio's TLS layer and aiohttp make.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from cdi.api.constants import ContentType
from cdi.api.termination import TerminationMessage
from datapath import Processor, ProcessPlan, StreamSource, TargetSpec

PIECE = 1024 * 1024
RESULT = web.AppKey("result", list[TerminationMessage])
KINDS = web.AppKey("kinds", list[str])  # the x-cdi-content-type of each accepted stream
DONE = web.AppKey("done", asyncio.Event)


def peer_cn(request: web.Request) -> str | None:
    cert: Any = request.transport.get_extra_info("peercert") if request.transport else None
    names = [v for rdn in (cert or {}).get("subject", ()) for k, v in rdn if k == "commonName"]
    return names[0] if len(names) == 1 else None


def make_app(target: str, block: bool, client_name: str) -> web.Application:
    """One route: a clone stream into ``target`` (a file or a device; a tree beside it)."""

    async def upload(request: web.Request) -> web.Response:
        if peer_cn(request) != client_name:
            return web.Response(status=401, text="client not allowed")
        kind = ContentType(request.headers.get("x-cdi-content-type", "blockdevice-clone"))
        request.app[KINDS].append(str(kind))
        tree = kind == ContentType.FILESYSTEM_CLONE
        spec = TargetSpec(str(Path(target).parent) if tree else target, block)
        body = StreamSource(request.content.iter_chunked(PIECE), size=request.content_length)
        result = await Processor(ProcessPlan(spec, content_type=kind), body).run()
        request.app[RESULT].append(result)
        request.app[DONE].set()
        return web.Response(status=200 if result.succeeded else 500, text=result.message)

    app = web.Application(client_max_size=0)
    app[RESULT] = []
    app[KINDS] = []
    app[DONE] = asyncio.Event()
    app.router.add_post("/v1beta1/upload", upload)
    return app


def serving_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=client_ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def serve_once(args: argparse.Namespace) -> TerminationMessage:
    app = make_app(args.target, args.block, args.client_name)
    runner = web.AppRunner(app)
    await runner.setup()
    ctx = serving_context(args.cert, args.key, args.client_ca)
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    Path(args.port_file).write_text(str(port))
    await app[DONE].wait()
    await runner.cleanup()
    return app[RESULT][0]


def _read_headers(f: Any) -> dict[str, str]:
    f.readline()  # the request line: this stand-in serves one route
    headers = {}
    while (line := f.readline()) not in (b"\r\n", b""):
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return headers


def _read_body(f: Any, headers: dict[str, str], put: Callable[[bytes | None], None]) -> None:
    """Hand the body's bytes to ``put`` in chunks of up to 4 MiB, then None."""
    try:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int(f.readline().split(b";")[0], 16):
                _read_into(f, size, put)
                f.readline()
            f.readline()
        else:
            _read_into(f, int(headers.get("content-length", "0")), put)
    finally:
        put(None)


def _read_into(f: Any, size: int, put: Callable[[bytes | None], None]) -> None:
    while size:
        buf = bytearray(min(size, 4 << 20))
        view, got = memoryview(buf), 0
        while got < len(buf):
            n = f.readinto(view[got:])
            if not n:
                raise ConnectionError("the body was cut")
            got += n
        put(bytes(buf))
        size -= got


async def serve_threaded(args: argparse.Namespace) -> TerminationMessage:
    """The data path fed from a thread that reads the request from a blocking TLS socket."""
    loop = asyncio.get_running_loop()
    ctx = serving_context(args.cert, args.key, args.client_ca)
    listener = socket.create_server(("127.0.0.1", 0))
    Path(args.port_file).write_text(str(listener.getsockname()[1]))
    raw, _ = await loop.run_in_executor(None, listener.accept)
    conn = await loop.run_in_executor(None, lambda: ctx.wrap_socket(raw, server_side=True))
    cert: Any = conn.getpeercert()
    names = [v for rdn in (cert or {}).get("subject", ()) for k, v in rdn if k == "commonName"]
    if names != [args.client_name]:
        raise PermissionError(f"client {names} not allowed")
    f = conn.makefile("rb", buffering=64 * 1024)
    headers = await loop.run_in_executor(None, _read_headers, f)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=2)

    def put(chunk: bytes | None) -> None:
        asyncio.run_coroutine_threadsafe(queue.put(chunk), loop).result()

    async def pieces() -> AsyncIterator[bytes]:
        while (chunk := await queue.get()) is not None:
            yield chunk

    reading = loop.run_in_executor(None, _read_body, f, headers, put)
    kind = ContentType(headers.get("x-cdi-content-type", "blockdevice-clone"))
    tree = kind == ContentType.FILESYSTEM_CLONE
    spec = TargetSpec(str(Path(args.target).parent) if tree else args.target, args.block)
    length = int(headers["content-length"]) if "content-length" in headers else None
    result = await Processor(
        ProcessPlan(spec, content_type=kind), StreamSource(pieces(), size=length)
    ).run()
    await reading
    text = result.message.encode()
    status = b"200 OK" if result.succeeded else b"500 Internal Server Error"
    head = b"HTTP/1.1 %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (status, len(text))
    await loop.run_in_executor(None, conn.sendall, head + text)
    conn.close()
    listener.close()
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--block", action="store_true")
    p.add_argument("--threaded", action="store_true", help="blocking-TLS thread, no aiohttp")
    for name in ("--cert", "--key", "--client-ca", "--client-name", "--port-file"):
        p.add_argument(name, required=True)
    args = p.parse_args(argv)
    result = asyncio.run(serve_threaded(args) if args.threaded else serve_once(args))
    print(result.to_json())
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
