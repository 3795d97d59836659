"""A stand-in for the upload server on a clone's target: ``POST /v1beta1/upload`` over mutual
TLS, only from the client certificate whose CN names the clone, written through the data path
(``datapath.Processor`` over a ``StreamSource`` of the request body), as ``uploader/`` does.

The clone benchmark (``benchmarks/clone.py``) runs it as its own process, so its peak RSS is
the target pod's; the clone source's component tests (``tests/component/test_clone_source.py``)
run the same app in-process. ``python -m benchmarks.clone_receiver --target T [--block] --cert C
--key K --client-ca CA --client-name N --port-file F`` serves one upload and exits with its
termination message on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", required=True)
    p.add_argument("--block", action="store_true")
    for name in ("--cert", "--key", "--client-ca", "--client-name", "--port-file"):
        p.add_argument(name, required=True)
    result = asyncio.run(serve_once(p.parse_args(argv)))
    print(result.to_json())
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
