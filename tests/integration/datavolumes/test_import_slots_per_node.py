"""CDIConfig ``spec.maxConcurrentImportsPerNode`` on the real API server and scheduler, with the
product installed (issue 28, "Fair sharing"): the controller advertises the extended resource
``cdi.kubevirt.io/import-slots`` in the node's status, every importer pod requests one, and the
real kube-scheduler keeps the rest Pending. The testkit cluster has one node, so a limit of 1
with three DataVolumes shows it: never more than one live importer bound to the node, the later
two seen ``ImportQueued`` with a message that names the per-node limit, each bound only after
the one before it finished (creation order), and once the limit is lifted the node keeps the key
at ``UNLIMITED`` (100000, which the API server writes back as 100k: pods made under the limit
still fit)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cdi.api.constants import IMPORT_SLOTS_RESOURCE
from testkit.kubeclient import Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import Images, ImageServer, dv_path
from tests.integration.datavolumes.test_bandwidth import CONFIG, capped, importer

pytestmark = pytest.mark.integration


def node_slots(kube: Kube) -> dict[str, tuple[str | None, str | None]]:
    """Each node's advertised import slots: (capacity, allocatable)."""
    return {
        n["metadata"]["name"]: (
            (n["status"].get("capacity") or {}).get(IMPORT_SLOTS_RESOURCE),
            (n["status"].get("allocatable") or {}).get(IMPORT_SLOTS_RESOURCE),
        )
        for n in kube.get("/api/v1/nodes")["items"]
    }


@pytest.fixture
def one_per_node(kube: Kube, controller: Product) -> Iterator[None]:
    kube.patch(CONFIG, {"spec": {"maxConcurrentImportsPerNode": 1}})
    wait_until(
        lambda: all(v == ("1", "1") for v in node_slots(kube).values()),
        "every node advertising one import slot",
        30,
    )
    yield
    kube.patch(CONFIG, {"spec": {"maxConcurrentImportsPerNode": None}})
    try:
        wait_until(
            lambda: all(v == ("100k", "100k") for v in node_slots(kube).values()),
            "the limit lifted on every node",
            30,
        )
    except TimeoutError:
        raise AssertionError((node_slots(kube), controller.log()[-6000:])) from None


def bound_and_alive(pod: dict[str, Any]) -> bool:
    meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase", "Pending")
    alive = not meta.get("deletionTimestamp") and phase in ("Pending", "Running")
    return alive and bool(pod["spec"].get("nodeName"))


def scheduled_at(pod: dict[str, Any]) -> str:
    for c in pod["status"].get("conditions") or []:
        if c["type"] == "PodScheduled" and c["status"] == "True":
            return str(c["lastTransitionTime"])
    raise AssertionError(f"never scheduled: {pod['status']}")


def test_at_most_the_per_node_limit_of_importers_run_on_a_node_the_rest_wait_in_order(
    kube: Kube, namespace: str, one_per_node: None, image_server: ImageServer, images: Images
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    names = ["a-first", "b-second", "c-third"]
    for name in names:
        kube.create(dv_path(namespace), capped(name, url, "512Ki"))  # ~6 s each
        # the next only once this one's claim is bound: an importer waiting for its claim is
        # unschedulable for that (not a slot), and a later one whose claim bound first would
        # take the slot before it (seen under load); the order under test is the slot's
        claim = ns_path(namespace, "persistentvolumeclaims", name)
        wait_until(
            lambda c=claim: (kube.get_or_none(c) or {}).get("status", {}).get("phase") == "Bound",
            f"claim {name} bound",
            60,
        )
        time.sleep(0.3)  # distinct creation order, whole-second timestamps aside
    queued: dict[str, str] = {}
    most = 0

    def all_done() -> bool:
        nonlocal most
        pods = [p for p in kube.get(ns_path(namespace, "pods"))["items"]
                if p["metadata"]["name"].startswith("importer-")]  # fmt: skip
        most = max(most, sum(bound_and_alive(p) for p in pods))
        phases = []
        for name in names:
            status = kube.get(dv_path(namespace, name)).get("status") or {}
            phases.append(status.get("phase"))
            for c in status.get("conditions") or []:
                if c["type"] == "Running" and c.get("reason") == "ImportQueued":
                    queued[name] = c["message"]
                    assert status["phase"] == "ImportScheduled", status
        return all(p == "Succeeded" for p in phases)

    wait_until(all_done, "three DataVolumes Succeeded", 180, interval=0.2)
    assert most == 1, most
    assert {"b-second", "c-third"} <= set(queued), queued
    for message in queued.values():
        assert "at most 1 imports run on a node at once" in message, message
        assert "maxConcurrentImportsPerNode" in message, message
        assert IMPORT_SLOTS_RESOURCE in message, message  # the scheduler's own words follow
    pods = {name: importer(kube, namespace, name) for name in names}
    for pod in pods.values():
        resources = pod["spec"]["containers"][0]["resources"]
        assert resources["requests"][IMPORT_SLOTS_RESOURCE] == "1", resources
        assert resources["limits"][IMPORT_SLOTS_RESOURCE] == "1", resources
    for earlier, later in itertools.pairwise(names):
        finished = pods[earlier]["status"]["containerStatuses"][0]["state"]["terminated"]
        assert scheduled_at(pods[later]) >= finished["finishedAt"], (earlier, later)
