"""The controller's ``/metrics`` answers 503 while the API server cannot review a token
(``cdi.controller.metrics_auth``: TokenReview and SubjectAccessReview), remembers nothing of
it, and answers 200 again as soon as the API server is back; on the real API server.

The guard is given its API client through its constructor, as the manager gives it one. Here
that client reaches the real API server through a loopback TCP relay the test can cut and
restore (``Relay``: a listener that forwards byte for byte, TLS end to end, so the API server's
certificate is verified as usual). A second guard's client points at a loopback port nothing
listens on. The guards serve through the controller's own ``/metrics`` app
(``ControllerMetrics.app``) on loopback, scraped over HTTP with a real reader token."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from cdi.controller.metrics import ControllerMetrics, Sources, serve_metrics
from cdi.controller.metrics_auth import MetricsGuard
from cdi.kube.client import AsyncKube
from cdi.kube.client import Kube as ProductKube
from testkit.cluster import Cluster, free_port
from testkit.kubeclient import Kube
from testkit.kubeconfig import ADMIN
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.metrics_env import get, service_account_token
from tests.integration.datavolumes.test_metrics_auth import (  # noqa: F401
    may_get_metrics,
    reader_binding,
)

pytestmark = pytest.mark.integration


class Relay:
    """A loopback TCP relay to ``target``; ``cut()`` drops every connection and refuses new
    ones (each is closed at once) until ``restore()``."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.live: set[socket.socket] = set()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                conn.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.live |= {conn, upstream}
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for s in self.live:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.live.clear()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


class _Nothing:
    def items(self) -> list[dict[str, Any]]:
        return []


def _guard(cluster: Cluster, host: str) -> tuple[MetricsGuard, AsyncKube]:
    """A guard whose reviews go to ``host`` (the API server's certificate and CA as usual)."""
    api = cluster.api_client(ADMIN)
    api.configuration.host = host
    kube = AsyncKube(ProductKube(api), max_threads=2)
    return MetricsGuard(kube), kube


@pytest.fixture
def relay(cluster: Cluster) -> Iterator[Relay]:
    server = urllib.parse.urlsplit(cluster.server)
    r = Relay((server.hostname or "127.0.0.1", server.port or 443))
    yield r
    r.close()


def test_metrics_answer_503_while_the_api_server_is_unreachable_and_200_once_it_is_back(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    product: Product,  # the ClusterRole cdi-metrics-reader is installed
    reader_binding: tuple[str, str],  # noqa: F811
    relay: Relay,
) -> None:
    sa, _ = reader_binding
    user = f"system:serviceaccount:{namespace}:{sa}"
    wait_until(lambda: may_get_metrics(kube, user), "the binding seen by the authorizer", 30, 0.5)
    first, second = (service_account_token(kube, namespace, sa) for _ in range(2))
    through_relay, relay_kube = _guard(cluster, f"https://127.0.0.1:{relay.port}")
    dead, dead_kube = _guard(cluster, f"https://127.0.0.1:{free_port()}")  # nothing listens
    metrics = ControllerMetrics(Sources(_Nothing(), _Nothing(), _Nothing()))

    async def scenario() -> dict[str, Any]:
        port, dead_port = free_port(), free_port()
        runners = [
            await serve_metrics(metrics, through_relay, "127.0.0.1", port),
            await serve_metrics(metrics, dead, "127.0.0.1", dead_port),
        ]
        url, dead_url = (f"http://127.0.0.1:{p}/metrics" for p in (port, dead_port))

        async def scrape(at: str, token: str) -> tuple[int, str]:
            return await asyncio.to_thread(get, at, token)

        try:
            seen: dict[str, Any] = {"up": await scrape(url, first)}
            relay.cut()
            seen["cut, remembered token"] = await scrape(url, first)  # its answer is cached
            seen["cut, new token"] = await scrape(url, second)
            seen["cut, again"] = await scrape(url, second)
            seen["dead address"] = await scrape(dead_url, first)
            reviews = through_relay.reviews_sent
            relay.restore()
            seen["restored"] = await scrape(url, second)  # the 503 was not remembered
            seen["reviews after restore"] = through_relay.reviews_sent - reviews
            return seen
        finally:
            for runner in runners:
                await runner.cleanup()

    try:
        seen = asyncio.run(scenario())
    finally:
        relay_kube.close()
        dead_kube.close()
    assert seen["up"][0] == 200, seen["up"]
    assert seen["cut, remembered token"][0] == 200
    for case in ("cut, new token", "cut, again", "dead address"):
        status, body = seen[case]
        assert status == 503, (case, status, body)
        assert body.startswith("the token could not be reviewed"), (case, body)
        assert first not in body and second not in body  # no token in the answer
    assert seen["restored"][0] == 200, seen["restored"]
    assert seen["reviews after restore"] == 1  # asked again, not answered from memory
