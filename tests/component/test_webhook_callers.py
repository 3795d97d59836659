"""The admission server on a real loopback TLS socket (``cdi.pki.contexts.required_client_context``,
the app of ``cdi.webhooks.server``): only the API server's client certificate gets a review read
(N2), and a flood of reviews does not hold up anyone else's (one user's excess is refused at
once, another user's review is served at the next free lookup slot).

The cluster lookups are a ``ClusterLookup`` whose claim lookups for the flood's DataVolumes
block until the test releases them: it stands for a slow API server, so the test can look at
who got served while the flood is stuck, instead of measuring times.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import ssl
import threading
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from cdi.api.cloneauth import AccessCheck
from cdi.pki.certs import KeyPair, issue_client, issue_serving, new_ca
from cdi.pki.contexts import TLSFiles, required_client_context
from cdi.webhooks.callers import ApiServerCaller
from cdi.webhooks.fairness import FairLookups
from cdi.webhooks.mutation import UserInfo
from cdi.webhooks.server import make_app

NOW = dt.datetime.now(dt.UTC)
API_SERVER = "front-proxy-client"
FLOOD = 12
PER_CALLER = 8


@dataclass
class SlowClaims:
    """Claim lookups: those of DataVolumes named ``flood-*`` wait for ``release``."""

    release: threading.Event = field(default_factory=threading.Event)
    started: list[str] = field(default_factory=list)

    def get_pvc(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        self.started.append(name)
        if name.startswith("flood-"):
            self.release.wait(60)
        return None

    def get_data_source(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        return None

    def claim_adoption_enabled(self) -> bool:
        return False

    def can_read(self, user: UserInfo, ns: str, group: str, resource: str, name: str) -> bool:
        return True

    def allows(self, user: UserInfo, namespace: str, check: AccessCheck) -> bool:
        return True


@dataclass
class Webhook:
    """The running server: its address, the CA of its serving and client certificates."""

    url: str
    ca: KeyPair
    claims: SlowClaims

    def client_context(self, cn: str | None) -> ssl.SSLContext:
        """A client trusting the server; with ``cn``, presenting a certificate made out to it
        by the CA the server trusts for clients."""
        ctx = ssl.create_default_context(cadata=self.ca.cert_pem.decode())
        ctx.check_hostname = False
        if cn is not None:
            files = TLSFiles()
            files.load(ctx, issue_client(self.ca, cn, NOW))
            files.close()
        return ctx


@pytest.fixture
async def webhook() -> AsyncIterator[Webhook]:
    ca = new_ca("apiserver-client-ca", NOW)
    serving = issue_serving(ca, ("cdi-webhook.cdi.svc", "127.0.0.1"), NOW)
    claims = SlowClaims()
    pool = ThreadPoolExecutor(4)
    loop = asyncio.get_running_loop()

    async def run_blocking(fn: Any, *args: Any) -> Any:
        return await loop.run_in_executor(pool, partial(fn, *args))

    files = TLSFiles()
    ctx = required_client_context(serving, files, client_ca=ca.cert_pem)
    lookups = FairLookups(run_blocking, 4, per_caller=PER_CALLER)
    caller = ApiServerCaller((API_SERVER,))
    runner = web.AppRunner(make_app(claims, run_blocking, claims, None, claims, caller, lookups))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield Webhook(f"https://127.0.0.1:{port}", ca, claims)
    finally:
        claims.release.set()
        await runner.cleanup()
        files.close()
        pool.shutdown(wait=False)


def review(user: str, name: str, namespace: str = "tenant") -> dict[str, Any]:
    dv = {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": {"blank": {}},
            "pvc": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    }
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"{user}-{name}",
            "operation": "CREATE",
            "namespace": namespace,
            "userInfo": {"username": user, "groups": ["system:authenticated"]},
            "object": dv,
        },
    }


async def raw_post(hook: Webhook, body: dict[str, Any], ctx: ssl.SSLContext) -> bytes:
    """What a caller gets back for one POST: the raw response, or b"" when the connection
    ends (or fails) without one."""
    port = int(hook.url.rsplit(":", 1)[1])
    data = json.dumps(body).encode()
    head = (
        f"POST /datavolume-mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
        writer.write(head + data)
        await writer.drain()
        answer = await reader.read()
        writer.close()
        return answer
    except (ssl.SSLError, ConnectionError):
        return b""


async def test_a_review_without_a_client_certificate_is_refused_in_the_tls_handshake(
    webhook: Webhook,
) -> None:
    forged = review("system:admin", "dv")
    answers = await asyncio.gather(
        *(raw_post(webhook, forged, webhook.client_context(None)) for _ in range(20))
    )
    assert answers == [b""] * 20
    assert webhook.claims.started == []


async def test_a_certificate_for_another_name_gets_403_before_the_review_is_read(
    webhook: Webhook,
) -> None:
    answer = await raw_post(webhook, review("system:admin", "dv"), webhook.client_context("alice"))
    assert answer.startswith(b"HTTP/1.1 403")
    assert b"signature" not in answer
    honest = await raw_post(webhook, review("alice", "dv"), webhook.client_context(API_SERVER))
    assert honest.startswith(b"HTTP/1.1 200") and b'"patch"' in honest


async def until(condition: Any, deadline: float = 60.0) -> None:
    """Wait for ``condition`` (not a timing claim: the deadline only bounds a failing test)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.02)


async def validate(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with session.post(f"{url}/datavolume-validate", json=body) as resp:
        assert resp.status == 200
        return (await resp.json())["response"]


async def test_a_flood_is_refused_beyond_its_bound_and_does_not_delay_another_users_review(
    webhook: Webhook,
) -> None:
    connector = aiohttp.TCPConnector(ssl=webhook.client_context(API_SERVER), limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        flood = [
            asyncio.create_task(validate(session, webhook.url, review("mallory", f"flood-{i}")))
            for i in range(FLOOD)
        ]
        # the reviews beyond mallory's bound are answered at once, while hers are stuck
        await until(lambda: sum(t.done() for t in flood) >= FLOOD - PER_CALLER)
        await until(lambda: len(webhook.claims.started) >= 3)  # her lookups in the API server
        refused = [t.result() for t in flood if t.done()]
        pending = [t for t in flood if not t.done()]
        assert len(refused) == FLOOD - PER_CALLER
        assert all(r["allowed"] is False and r["status"]["code"] == 429 for r in refused)
        assert "mallory" in refused[0]["status"]["message"]
        # alice's review goes through while mallory's are still stuck in the API server
        honest = await asyncio.wait_for(
            validate(session, webhook.url, review("alice", "honest")), 60
        )
        assert honest["allowed"] is True
        assert not webhook.claims.release.is_set() and all(not t.done() for t in pending)
        assert webhook.claims.started.index("honest") <= 3  # next free slot, not after the queue
        webhook.claims.release.set()
        admitted = await asyncio.gather(*pending)
        assert all(r["allowed"] is True for r in admitted)
        assert len(webhook.claims.started) == PER_CALLER + 1
