"""Leader election when the API server stops answering: etcd is frozen (SIGSTOP), so the real
API server holds every request instead of failing it, as it does in an etcd outage.

The leader must give the Lease up on its own clock, by the renew deadline, not when the API
server answers again; from then on no write of its is sent, and a write it sent before is
abandoned by the time the Lease could pass to a standby. Otherwise an old leader's writes land
while its successor acts on what it listed (the duplicate importer pod issue 11's fault test
once saw after a 10 s etcd outage).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from cdi.kube.client import AsyncKube, Kube, Resource
from cdi.kube.errors import NotLeading, Unavailable
from cdi.kube.leader import LeaderConfig, LeaderElector, LeadershipLost
from testkit.cluster import Cluster

pytestmark = pytest.mark.integration

CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")


def configmap(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}


async def test_a_leader_whose_api_server_hangs_stops_writing_before_its_lease_can_pass_on(
    cluster: Cluster, namespace: str
) -> None:
    config = LeaderConfig(
        "fenced", namespace, "leader-a", lease_duration=6.0, renew_deadline=4.0, retry_period=1.0
    )
    kube = Kube(cluster.api_client())
    elector = LeaderElector(AsyncKube(kube, max_threads=2), config)
    await elector.acquire()
    fenced = kube.fenced(elector.fence)
    fenced.create(CONFIGMAPS, configmap("while-leading"), namespace)
    holding = asyncio.create_task(elector.hold())

    with cluster.paused("etcd"):
        frozen = time.monotonic()
        sent = asyncio.create_task(
            asyncio.to_thread(fenced.create, CONFIGMAPS, configmap("in-flight"), namespace)
        )
        with pytest.raises(LeadershipLost):
            await asyncio.wait_for(holding, config.lease_duration)
        # the last renewal was sent before the freeze: lost by its renew deadline
        assert time.monotonic() - frozen < config.renew_deadline + 0.5
        assert elector.fence() == 0.0

        began = time.monotonic()
        with pytest.raises(NotLeading):
            fenced.create(CONFIGMAPS, configmap("after-the-deadline"), namespace)
        assert time.monotonic() - began < 0.5  # refused here, never sent

        # the write sent while leading is given up before a standby could take the Lease
        with pytest.raises(Unavailable):
            await asyncio.wait_for(sent, config.lease_duration)
        assert time.monotonic() - frozen < config.lease_duration + 0.5

    elector.kube.close()
    names = [c["metadata"]["name"] for c in kube.list(CONFIGMAPS, namespace)["items"]]
    assert "while-leading" in names and "after-the-deadline" not in names
