"""CDIConfig maxConcurrentImportsPerNode (issue 28), the pure parts: what a node should
advertise (``cdi.controller.nodeslots``), what its cache keeps, the importer's slot request
(``cdi.render.importer_pod``), and when an Unschedulable importer is a waiter for a node's slot
(``cdi.controller.importslots.node_queued``) rather than a pod that cannot be placed."""

from __future__ import annotations

from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import IMPORT_SLOTS_RESOURCE
from cdi.api.types import DataVolume
from cdi.controller.importslots import QUEUED_REASON, full_nodes, node_queued
from cdi.controller.nodeslots import UNLIMITED, node_view, slots_patch, wanted
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod

KEY = IMPORT_SLOTS_RESOURCE


def node(capacity: str | None = None, allocatable: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"capacity": {"cpu": "4"}, "allocatable": {"cpu": "4"}}
    if capacity is not None:
        status["capacity"][KEY] = capacity
    if allocatable is not None:
        status["allocatable"][KEY] = allocatable
    return {"metadata": {"name": "n1"}, "status": status}


def test_a_node_advertises_the_limit_once_and_keeps_a_lifted_one_unlimited() -> None:
    assert wanted(node(), 2) == "2"
    assert wanted(node("2", "2"), 2) is None  # already right: no write
    assert wanted(node("2", None), 2) == "2"  # an agent that did not copy it to allocatable
    assert wanted(node("2", "2"), 3) == "3"
    assert wanted(node(), None) is None and wanted(node(), 0) is None  # never advertised
    assert wanted(node("2", "2"), None) == UNLIMITED  # waiting pods still request a slot
    assert wanted(node(UNLIMITED, UNLIMITED), 0) is None
    assert wanted(node("100k", "100k"), 0) is None  # as the API server writes it back
    assert wanted(node("1k", "1k"), 1000) is None
    assert wanted(node("x", "x"), 2) == "2"  # not a quantity: written over
    assert slots_patch("2") == {"status": {"capacity": {KEY: "2"}, "allocatable": {KEY: "2"}}}


def test_the_node_cache_keeps_only_the_name_and_the_slots() -> None:
    big = node("2", "2")
    big["metadata"].update(labels={"a": "b"}, uid="u", resourceVersion="7")
    big["status"].update(images=[{"names": ["x"]}], conditions=[{"type": "Ready"}])
    assert node_view(big) == {
        "metadata": {"name": "n1", "uid": "u", "resourceVersion": "7"},
        "status": {"capacity": {KEY: "2"}, "allocatable": {KEY: "2"}},
    }


def importer(name: str, node_name: str | None, phase: str = "Pending", slot: bool = True,
             unschedulable: bool = False) -> dict[str, Any]:  # fmt: skip
    requests = {KEY: "1"} if slot else {}
    conditions = []
    if unschedulable:
        said = f"0/1 nodes are available: 1 Insufficient {KEY}."
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "message": said})  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "ns", "labels": {"cdi.kubevirt.io": "importer"}},
        "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": requests}}]},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_a_node_is_full_when_its_live_slot_holders_reach_the_limit() -> None:
    pods = [
        importer("a", "n1", "Running"),
        importer("b", "n2", "Succeeded"),  # finished: frees its slot
        importer("c", "n2", "Running", slot=False),  # made before the limit: holds none
        importer("d", None),  # not bound anywhere yet
    ]
    assert full_nodes(pods, 1) == {"n1"}
    assert full_nodes(pods, 2) == set()


def test_an_unschedulable_importer_is_queued_only_while_some_node_is_full() -> None:
    waiting = importer("w", None, unschedulable=True)
    running = importer("a", "n1", "Running")
    reason, message = node_queued(waiting, 1, [running, waiting]) or ("", "")
    assert reason == QUEUED_REASON
    assert "at most 1 imports run on a node at once" in message
    assert f"Insufficient {KEY}" in message  # the scheduler's words, for the rest of the story
    assert node_queued(waiting, 2, [running, waiting]) is None  # no node full: not a slot wait
    assert node_queued(waiting, 0, [running, waiting]) is None
    assert node_queued(importer("w", None, slot=False, unschedulable=True), 1, [running]) is None
    assert node_queued(importer("w", None), 1, [running]) is None  # not (yet) unschedulable


def test_an_importer_unschedulable_for_another_reason_is_not_said_to_wait_for_a_slot() -> None:
    """Its claim not bound yet, while a node is full (CI of stop 35: the first of three
    DataVolumes was reported ImportQueued and the scheduler's words said the claim)."""
    waiting = importer("w", None, unschedulable=True)
    said = "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    waiting["status"]["conditions"][0]["message"] = said
    assert node_queued(waiting, 1, [importer("a", "n1", "Running"), waiting]) is None


def dv() -> DataVolume:
    return DataVolume.from_dict({
        "metadata": {"name": "d", "namespace": "ns", "uid": "u1"},
        "spec": {"source": {"http": {"url": "http://example.com/x.img"}},
                 "pvc": {"resources": {"requests": {"storage": "1Gi"}}}},
    })  # fmt: skip


def test_the_importer_requests_one_slot_only_under_a_per_node_limit() -> None:
    claim = {"metadata": {"name": "d", "namespace": "ns"},
             "spec": {"resources": {"requests": {"storage": "1Gi"}}}}  # fmt: skip
    config = ImporterPodConfig(image="importer", cdi_config=CDIConfig(), import_slot=True)
    resources = render_importer_pod(dv(), claim, config)["spec"]["containers"][0]["resources"]
    assert resources["requests"][KEY] == "1" and resources["limits"][KEY] == "1"
    assert resources["requests"]["cpu"]  # CDIConfig's own requests stay
    plain = ImporterPodConfig(image="importer", cdi_config=CDIConfig())
    resources = render_importer_pod(dv(), claim, plain)["spec"]["containers"][0]["resources"]
    assert KEY not in resources.get("requests", {}) and KEY not in resources.get("limits", {})
