"""The upload proxy as its own process, so a test can measure its memory from /proc.

``python -m tests.component.upload_proxy_process CONFIG.json`` starts ``make_proxy_app`` on
127.0.0.1 with the test's certificates, public keys and a fixed PVC table (every PVC's upload
server is the test's peer), prints the port on stdout and serves until SIGTERM. Test-only: the
product process is ``cdi uploadproxy``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from cdi.upload.proxy import make_proxy_app
from cdi.upload.readiness import UploadServer
from cdi.upload.tls import serving_context, upstream_context
from cdi.upload.token import Verifier
from cdi.webhooks.certs import KeyPair


class FixedTargets:
    def __init__(self, pvcs: list[dict[str, Any]], peer: str) -> None:
        self.pvcs = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pvcs}
        self.peer = peer

    async def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pvcs.get(f"{namespace}/{name}")

    async def upload_server(self, namespace: str, pvc_name: str) -> UploadServer:
        return UploadServer(self.peer)


async def serve(config: dict[str, Any]) -> None:
    keys = {k: v.encode() for k, v in config["public_keys"].items()}

    async def load() -> Mapping[str, bytes]:
        return keys

    upstream = upstream_context(
        config["server_ca"].encode(),
        KeyPair(config["client_cert"].encode(), config["client_key"].encode()),
    )
    app = make_proxy_app(FixedTargets(config["pvcs"], config["peer"]), Verifier(load), upstream)
    runner = web.AppRunner(app)
    await runner.setup()
    pair = KeyPair(config["proxy_cert"].encode(), config["proxy_key"].encode())
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=serving_context(pair))
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)  # type: ignore[union-attr]
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        asyncio.run(serve(json.load(fh)))
