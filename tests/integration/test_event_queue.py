"""The controller's event queue under a burst, writing to the real API server.

While new objects wait for their first reconcile (``WorkQueue.urgent``), queued events wait
too, so their writes do not compete with the claim and pod creates someone is waiting for;
then every one is written, and an event repeated while it waited is one Event with ``count``
2 (client-go's correlator). The wait is bounded: ``max_delay`` after an event was queued it is
written even if the burst goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cdi.kube.client import AsyncKube
from cdi.kube.client import Kube as ProductKube
from cdi.kube.events import NORMAL, EventQueue, EventRecorder
from cdi.kube.workqueue import WorkQueue
from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path

pytestmark = pytest.mark.integration


@pytest.fixture
def async_kube(cluster: Cluster) -> Iterator[AsyncKube]:
    kube = AsyncKube(ProductKube(cluster.api_client()))
    yield kube
    kube.close()


def involved(kube: Kube, namespace: str) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "subject"}}
    created = kube.create(ns_path(namespace, "configmaps"), body)
    return {**created, "apiVersion": "v1", "kind": "ConfigMap"}


def reasons(kube: Kube, namespace: str) -> dict[str, int]:
    items = kube.get(ns_path(namespace, "events"))["items"]
    return {e["reason"]: e.get("count", 1) for e in items}


async def written(kube: Kube, namespace: str, count: int, within: float) -> dict[str, int]:
    """The events once there are ``count`` reasons (within ``within`` seconds)."""
    deadline = time.monotonic() + within
    while True:
        found = await asyncio.to_thread(reasons, kube, namespace)
        if len(found) >= count or time.monotonic() > deadline:
            return found
        await asyncio.sleep(0.1)


async def test_events_wait_for_a_burst_then_all_are_written_repeats_folded(
    kube: Kube, async_kube: AsyncKube, namespace: str
) -> None:
    burst = WorkQueue()
    burst.add("ns/new", first=True)  # a new object waits for its first reconcile
    queue = EventQueue(async_kube, busy=lambda: burst.urgent > 0, max_delay=60)
    queue.start()
    try:
        recorder = EventRecorder(async_kube, "burst-test", queue=queue)
        obj = involved(kube, namespace)
        for reason in ("Pending", "Pending", "Bound"):
            await recorder.emit(obj, NORMAL, reason, f"PVC subject {reason}")
        await asyncio.sleep(1.0)
        assert reasons(kube, namespace) == {}  # held back while the burst is served

        key = await burst.get()
        assert key is not None
        burst.done(key)  # its first reconcile is over: nothing urgent
        assert await written(kube, namespace, 2, 10) == {"Pending": 2, "Bound": 1}
        assert queue.folded == 1 and queue.dropped == 0
    finally:
        await queue.close()


async def test_an_event_waits_for_a_burst_at_most_max_delay(
    kube: Kube, async_kube: AsyncKube, namespace: str
) -> None:
    queue = EventQueue(async_kube, busy=lambda: True, max_delay=0.5)  # a burst without end
    queue.start()
    try:
        recorder = EventRecorder(async_kube, "burst-test", queue=queue)
        started = time.monotonic()
        await recorder.emit(involved(kube, namespace), NORMAL, "Bound", "PVC subject Bound")
        assert await written(kube, namespace, 1, 10) == {"Bound": 1}
        assert time.monotonic() - started >= 0.5
    finally:
        await queue.close()
