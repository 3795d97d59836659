"""Where the loop-device provisioner puts a new volume on a cluster of several nodes
(``testkit.volumeplacement``): the selected node, the clone source's node, else the least
loaded node the class allows."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.volumeplacement import (
    HOSTNAME,
    PlacementRefused,
    allowed_nodes,
    choose_node,
    node_affinity,
    pv_node,
)

NODES = ("n1", "n2", "n3")
PLAIN: dict[str, Any] = {"metadata": {"name": "plain"}}


def only(*nodes: str, key: str = HOSTNAME) -> dict[str, Any]:
    expr = {"key": key, "values": list(nodes)}
    return {
        "metadata": {"name": "pinned"},
        "allowedTopologies": [{"matchLabelExpressions": [expr]}],
    }


def choose(**kw: Any) -> str:
    args: dict[str, Any] = {
        "wffc": False,
        "selected": None,
        "source_node": None,
        "cls": PLAIN,
        "nodes": NODES,
        "labels": {},
        "volumes_on": [],
    }
    args.update(kw)
    return choose_node(**args)


def test_a_pv_records_its_node_and_reads_it_back() -> None:
    pv = {"spec": {"nodeAffinity": node_affinity("n2")}}
    assert pv_node(pv) == "n2"
    assert pv_node({"spec": {}}) is None
    assert pv_node({"spec": {"local": {"path": "/x"}}}) is None


def test_immediate_volumes_spread_to_the_least_loaded_node_in_order() -> None:
    assert choose() == "n1"
    assert choose(volumes_on=["n1"]) == "n2"
    assert choose(volumes_on=["n1", "n2"]) == "n3"
    assert choose(volumes_on=["n1", "n2", "n3", None, "elsewhere"]) == "n1"
    assert choose(volumes_on=["n2", "n2", "n1"]) == "n3"


def test_allowed_topologies_restrict_the_candidates_by_hostname_or_other_labels() -> None:
    assert choose(cls=only("n2"), volumes_on=["n2", "n2"]) == "n2"
    zone = only("a", key="topology.kubernetes.io/zone")
    labels = {
        "n1": {"topology.kubernetes.io/zone": "b"},
        "n3": {"topology.kubernetes.io/zone": "a"},
    }
    assert allowed_nodes(zone, NODES, labels) == ["n3"]
    assert allowed_nodes(PLAIN, NODES, {}) == list(NODES)
    with pytest.raises(PlacementRefused, match="allowedTopologies of class pinned"):
        choose(cls=only("elsewhere"))


def test_a_clone_goes_to_its_source_node_whatever_the_load() -> None:
    assert choose(source_node="n3", volumes_on=["n3"] * 5) == "n3"
    with pytest.raises(PlacementRefused, match="clone source is on node n3"):
        choose(source_node="n3", cls=only("n1"))


def test_an_immediate_claim_may_name_its_node() -> None:
    assert choose(selected="n2") == "n2"
    with pytest.raises(PlacementRefused, match="not served here"):
        choose(selected="other")


def test_wait_for_first_consumer_takes_the_scheduler_s_node_only() -> None:
    assert choose(wffc=True, selected="n3") == "n3"
    assert choose(wffc=True, selected="n2", source_node="n2") == "n2"
    with pytest.raises(PlacementRefused, match="not served here"):
        choose(wffc=True, selected=None)
    with pytest.raises(PlacementRefused, match="cannot be cloned to another node"):
        choose(wffc=True, selected="n1", source_node="n2")
