"""Slow clients against the real upload proxy and the real upload server on loopback
(security review 3, N3 and N4): clients that trickle a TLS handshake or a request head hold
no more than their address's share of the slots, and only for the total deadlines, so a
legitimate upload still goes through while they attack. Attackers connect from 127.0.0.2 and up, the
legitimate uploader from 127.0.0.1."""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from cdi.pki.certs import issue_serving, new_ca
from cdi.pki.contexts import serving_context, upstream_context
from cdi.upload.proxy import ProxyConfig
from cdi.upload.proxyserver import UploadProxy
from cdi.upload.token import UploadGrant, Verifier, issue
from tests.component.conftest import same_content
from tests.component.slow_clients import SlowClients
from tests.component.test_upload_proxy import NS, TableTargets, pvc
from tests.component.upload_peers import make_pki as make_proxy_pki
from tests.component.uploader_harness import (
    NOW,
    Pki,
    Running,
    data_target,
    free_port,
    make_pki,
    running_server,
    server_env,
)

MiB = 1024 * 1024
ATTACKERS = [f"127.0.0.{i}" for i in range(2, 12)]  # ten addresses, none the uploader's


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "image.raw"
    path.write_bytes(bytes(MiB) + random.Random(23).randbytes(7 * MiB))
    return path


def anonymous(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=pki.server_ca.cert_pem.decode())


@dataclass
class Proxied:
    url: str
    proxy: UploadProxy
    token: str
    client: ssl.SSLContext  # trusts the proxy's serving certificate


@pytest.fixture
async def server(pki: Pki, tmp_path: Path) -> AsyncIterator[Running]:
    env = server_env(pki, data_target(tmp_path), "64Mi", free_port())
    async with running_server(env) as srv:
        yield srv


@pytest.fixture
async def proxied(pki: Pki, server: Running) -> AsyncIterator[Proxied]:
    """The real UploadProxy (real TLS) in front of the real upload server (mutual TLS)."""
    tokens = make_proxy_pki().ring
    proxy_ca = new_ca("test-proxy-ca", NOW)
    targets = TableTargets(default_port=server.config.port)
    targets.add(pvc("disk"))

    async def keys() -> Mapping[str, bytes]:
        return tokens.public_keys()

    verifier = Verifier(keys, clock=lambda: NOW)
    proxy = UploadProxy(targets, verifier, upstream_context(pki.server_ca.cert_pem, pki.client))
    serving = serving_context(issue_serving(proxy_ca, ("127.0.0.1",), NOW))
    port = await proxy.start("127.0.0.1", 0, serving)
    client = ssl.create_default_context(cadata=proxy_ca.cert_pem.decode())
    token = issue(tokens, UploadGrant(NS, "disk", "uid-disk"), NOW)
    try:
        yield Proxied(f"https://127.0.0.1:{port}", proxy, token, client)
    finally:
        await proxy.stop()


async def _upload(url: str, ctx: ssl.SSLContext, image: Path, token: str = "") -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=60)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(
            url + "/v1beta1/upload", data=image.read_bytes(), headers=headers, ssl=ctx
        ) as resp,
    ):
        return resp.status


# -- the upload proxy (N3) ---------------------------------------------------------------------


async def test_a_legitimate_upload_goes_through_the_proxy_while_520_slow_clients_attack_it(
    pki: Pki, server: Running, proxied: Proxied, image: Path
) -> None:
    port = int(proxied.url.rsplit(":", 1)[1])
    half = 260
    with (
        SlowClients(port, ATTACKERS, half, kind="handshake") as shakers,
        SlowClients(port, ATTACKERS, half, kind="head", tls=proxied.client, pad=8192) as heads,
    ):
        await asyncio.to_thread(shakers.wait_open, half, 30)
        await asyncio.to_thread(heads.wait_open, 1, 30)
        await asyncio.sleep(2)  # every attacker has tried its connection once
        held = len(proxied.proxy.connections)
        status = await _upload(proxied.url, proxied.client, image, proxied.token)
        outcome = await asyncio.wait_for(server.task, 60)
    assert status == 200
    assert outcome.succeeded, outcome.message
    assert same_content(Path(server.config.destination), image, image.stat().st_size)
    cap = ProxyConfig().max_connections_per_address
    assert held <= cap * len(ATTACKERS) < ProxyConfig().max_connections


async def test_the_proxy_frees_slots_held_by_trickling_clients_at_the_total_deadlines(
    pki: Pki, server: Running
) -> None:
    config = ProxyConfig(handshake_timeout=1.0, head_timeout=2.0, max_connections_per_address=0)
    proxy_ca = new_ca("test-proxy-ca", NOW)
    targets = TableTargets(default_port=server.config.port)

    async def keys() -> Mapping[str, bytes]:
        return {}

    proxy = UploadProxy(
        targets, Verifier(keys), upstream_context(pki.server_ca.cert_pem, pki.client), config
    )
    port = await proxy.start(
        "127.0.0.1", 0, serving_context(issue_serving(proxy_ca, ("127.0.0.1",), NOW))
    )
    client = ssl.create_default_context(cadata=proxy_ca.cert_pem.decode())
    try:
        with (
            SlowClients(port, ATTACKERS, 20, kind="handshake", interval=0.2, reconnect=False) as a,
            SlowClients(
                port, ATTACKERS, 20, kind="head", tls=client, interval=0.2, reconnect=False
            ) as b,
        ):
            assert await asyncio.to_thread(a.wait_open, 20, 30) == 20
            assert await asyncio.to_thread(b.wait_open, 20, 30) == 20
            for clients in (a, b):
                await asyncio.to_thread(clients.wait_all_ended, 10)
            still_open = (a.open, b.open)
            await asyncio.sleep(0.2)  # the proxy's threads finish
            held = len(proxy.connections)
        assert still_open == (0, 0)  # each one cut while still trickling
        assert max(a.lifetimes) < config.handshake_timeout + 1.5
        assert max(b.lifetimes) < config.head_timeout + 1.5
        assert held == proxy.slots.in_use == 0
    finally:
        await proxy.stop()


def _pipeline_without_reading(port: int, ctx: ssl.SSLContext) -> ssl.SSLSocket:
    """Pipelined ``GET /healthz`` requests until the proxy stops taking them (its answers
    fill this client's small receive buffer, which is never read); the open connection."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.connect(("127.0.0.1", port))
    sock = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    sock.settimeout(2)
    batch = b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n" * 1000
    try:
        for _ in range(2000):
            sock.sendall(batch)
    except (TimeoutError, OSError):
        pass  # the proxy stopped reading: it is blocked writing answers, or gave up
    return sock


async def test_a_client_that_stops_reading_answers_holds_its_slot_only_for_the_write_timeout(
    pki: Pki, server: Running
) -> None:
    config = ProxyConfig(write_timeout=1.0)
    proxy_ca = new_ca("test-proxy-ca", NOW)

    async def keys() -> Mapping[str, bytes]:
        return {}

    upstream = upstream_context(pki.server_ca.cert_pem, pki.client)
    proxy = UploadProxy(TableTargets(), Verifier(keys), upstream, config)
    serving = serving_context(issue_serving(proxy_ca, ("127.0.0.1",), NOW))
    port = await proxy.start("127.0.0.1", 0, serving)
    client = ssl.create_default_context(cadata=proxy_ca.cert_pem.decode())
    try:
        sock = await asyncio.to_thread(_pipeline_without_reading, port, client)
        with sock:
            for _ in range(100):  # 10 s
                if not proxy.connections:
                    break
                await asyncio.sleep(0.1)
            held = len(proxy.connections)
        assert held == 0  # the thread gave the answer up and the connection ended
    finally:
        await proxy.stop()


# -- the upload server (N4) --------------------------------------------------------------------


async def test_certificate_less_trickling_connections_do_not_stop_an_mtls_upload(
    pki: Pki, tmp_path: Path, image: Path
) -> None:
    env = server_env(pki, data_target(tmp_path), "64Mi", free_port(), UPLOAD_HANDSHAKE_TIMEOUT="2")
    async with running_server(env) as srv:
        port = srv.config.port
        with (
            SlowClients(port, ATTACKERS[:1], 70, kind="handshake") as one_pod,
            SlowClients(port, ATTACKERS[1:], 63, kind="handshake") as many_pods,
            SlowClients(port, ATTACKERS[1:], 45, kind="head", tls=anonymous(pki)) as refused,
        ):
            await asyncio.to_thread(one_pod.wait_open, 1, 30)
            # more handshakes held at once than the 64 slots the server once had
            assert await asyncio.to_thread(many_pods.wait_open, 63, 30) == 63
            await asyncio.sleep(3.5)  # past the handshake deadline of the first ones held
            cut = [t for t in one_pod.lifetimes if t > 1.5]  # held (its address's 8), then cut
            status = await _upload(srv.url, pki.client_context(), image)
            outcome = await asyncio.wait_for(srv.task, 60)
        assert cut and max(cut) < 2 + 2.0  # by the 2 s handshake deadline, reconnected since
        assert refused.lifetimes and max(refused.lifetimes) < 2 + 2.0  # no certificate
    assert status == 200
    assert outcome.succeeded, outcome.message
    assert same_content(Path(env["DESTINATION"]), image, image.stat().st_size)
