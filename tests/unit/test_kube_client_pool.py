"""The API client's concurrency budget: ``AsyncKube`` runs ``API_CONCURRENCY`` requests at once
and urllib3 keeps as many connections, so a burst of reconciles neither queues behind a small
thread pool nor opens and drops a connection per request (docs/controller.md, "Under load")."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

from cdi.kube.client import API_CONCURRENCY, AsyncKube, Kube, load_api_client

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def test_connection_pool_keeps_as_many_connections_as_requests_in_flight(
    tmp_path: Path,
) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    api = load_api_client(path)
    assert api.configuration.connection_pool_maxsize >= API_CONCURRENCY
    assert api.rest_client.pool_manager.connection_pool_kw["maxsize"] >= API_CONCURRENCY


def test_async_kube_runs_api_concurrency_calls_at_once(tmp_path: Path) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(KUBECONFIG)
    kube = AsyncKube(Kube(load_api_client(path)))
    # Every call blocks until all of them are running: a smaller pool breaks the barrier.
    barrier = threading.Barrier(API_CONCURRENCY, timeout=5.0)

    async def burst() -> list[int]:
        return await asyncio.gather(*(kube.call(barrier.wait) for _ in range(API_CONCURRENCY)))

    try:
        assert sorted(asyncio.run(burst())) == list(range(API_CONCURRENCY))
    finally:
        kube.close()
