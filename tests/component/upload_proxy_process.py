"""The upload proxy as its own process, so a test can measure its memory from /proc.

``python -m tests.component.upload_proxy_process CONFIG.json`` starts ``UploadProxy`` on
127.0.0.1 with the test's certificates, public keys and a fixed PVC table (every PVC's upload
server is the test's peer, or ``peers[<pvc>]`` when the config names one), prints the port on
stdout and serves until SIGTERM. Test-only: the product process is ``cdi uploadproxy``.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import Mapping
from typing import Any

from cdi.pki.certs import KeyPair
from cdi.pki.contexts import serving_context, upstream_context
from cdi.upload.proxyserver import UploadProxy
from cdi.upload.readiness import UploadServer
from cdi.upload.token import Verifier


def process_config(
    pki: Any, pvcs: list[dict[str, Any]], peer: str, peers: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The CONFIG.json for ``pki`` (``tests.component.upload_peers.Pki``): the proxy's serving
    pair, the upload servers' CA, the proxy's client pair, the token keys, the PVC table."""
    config = {
        "proxy_cert": pki.proxy.cert_pem.decode(),
        "proxy_key": pki.proxy.key_pem.decode(),
        "server_ca": pki.server_ca.cert_pem.decode(),
        "client_cert": pki.client.cert_pem.decode(),
        "client_key": pki.client.key_pem.decode(),
        "public_keys": {k: v.decode() for k, v in pki.ring.public_keys().items()},
        "pvcs": pvcs,
        "peer": peer,
    }
    return config | ({"peers": dict(peers)} if peers else {})


class FixedTargets:
    def __init__(
        self, pvcs: list[dict[str, Any]], peer: str, peers: Mapping[str, str] | None = None
    ) -> None:
        self.pvcs = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pvcs}
        self.peer, self.peers = peer, peers or {}

    async def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return self.pvcs.get(f"{namespace}/{name}")

    async def upload_server(self, namespace: str, pvc_name: str) -> UploadServer:
        return UploadServer(self.peers.get(pvc_name, self.peer))


async def serve(config: dict[str, Any]) -> None:
    keys = {k: v.encode() for k, v in config["public_keys"].items()}

    async def load() -> Mapping[str, bytes]:
        return keys

    upstream = upstream_context(
        config["server_ca"].encode(),
        KeyPair(config["client_cert"].encode(), config["client_key"].encode()),
    )
    targets = FixedTargets(config["pvcs"], config["peer"], config.get("peers"))
    proxy = UploadProxy(targets, Verifier(load), upstream)
    pair = KeyPair(config["proxy_cert"].encode(), config["proxy_key"].encode())
    print(await proxy.start("127.0.0.1", 0, serving_context(pair)), flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await proxy.stop()


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        asyncio.run(serve(json.load(fh)))
