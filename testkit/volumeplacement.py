"""Which node a new local volume of the loop-device provisioner goes to (pure).

The provisioner's volumes are node-local, as local PVs, TopoLVM or local-path volumes are:
each PV carries required node affinity to the one node it was made on, and the scheduler
sends every pod that mounts it there. On a cluster of several nodes the provisioner serves
them all (``ProvisionerConfig.nodes``) and decides as a topology-aware CSI driver behind the
external-provisioner does:

1. **WaitForFirstConsumer**: the node the scheduler chose for the first consumer
   (``volume.kubernetes.io/selected-node``), nothing else; a claim whose selected node is not
   one of ours is not ours to make.
2. **A clone** (``dataSource`` a PVC): the source volume's node. A local volume is copied
   where it is; a local-storage driver cannot copy one to another node, so a
   WaitForFirstConsumer clone whose selected node is not the source's is refused
   (:class:`PlacementRefused`, with both names), as TopoLVM refuses it. CDI then has to move
   the bytes itself (a host-assisted clone), which is exactly what cross-node tests exercise.
3. **Immediate**, no clone source: the node named by ``selected-node`` if a client set it on
   the claim (the external-provisioner honours it in either binding mode), else one of the
   nodes the class's ``allowedTopologies`` admits (all of them without it), the one holding
   the fewest of our volumes, ties to the earliest in the configured order. That spreads
   volumes as a capacity-aware driver does (the external-provisioner hands the driver every
   node for an Immediate claim and the driver picks by capacity), and stays deterministic so
   a test can predict it; a test that wants a volume on one node names it with a class whose
   ``allowedTopologies`` holds that node's ``kubernetes.io/hostname``.

Snapshot restores (``dataSource`` a VolumeSnapshot) are placed as rule 1 or 3: the snapshots
are copies kept beside the nodes (``<state>/snapshots``), as a backup target keeps them, not
on the volume's node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

HOSTNAME = "kubernetes.io/hostname"

JSON = dict[str, Any]


class PlacementRefused(ValueError):
    """No node can hold this volume; the message says why (logged, retried by the poll)."""


def node_affinity(node: str) -> JSON:
    """A PV's ``nodeAffinity`` to ``node`` by its hostname label."""
    term = {"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": [node]}]}
    return {"required": {"nodeSelectorTerms": [term]}}


def pv_node(pv: Mapping[str, Any]) -> str | None:
    """The node a PV made by :func:`node_affinity` is on; None for any other PV."""
    terms = (((pv.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}).get(
        "nodeSelectorTerms"
    ) or []
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            values = expr.get("values") or []
            if expr.get("key") == HOSTNAME and expr.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


def allowed_nodes(
    cls: Mapping[str, Any], nodes: Sequence[str], labels: Mapping[str, Mapping[str, str]]
) -> list[str]:
    """``nodes`` (in order) that the class's ``allowedTopologies`` admits: a node passes if
    any term's ``matchLabelExpressions`` all hold for its labels (a node not registered yet
    has only its hostname label)."""
    terms = cls.get("allowedTopologies") or []
    if not terms:
        return list(nodes)

    def admits(term: Mapping[str, Any], node_labels: Mapping[str, str]) -> bool:
        return all(
            node_labels.get(str(e.get("key"))) in (e.get("values") or [])
            for e in term.get("matchLabelExpressions") or []
        )

    out = []
    for node in nodes:
        node_labels = {HOSTNAME: node, **(labels.get(node) or {})}
        if any(admits(t, node_labels) for t in terms):
            out.append(node)
    return out


def least_loaded(candidates: Sequence[str], volumes_on: Iterable[str | None]) -> str:
    """The candidate holding the fewest volumes; ties to the earliest candidate."""
    count = dict.fromkeys(candidates, 0)
    for node in volumes_on:
        if node in count:
            count[node] += 1
    return min(candidates, key=lambda n: (count[n], candidates.index(n)))


def choose_node(
    *,
    wffc: bool,
    selected: str | None,
    source_node: str | None,
    cls: Mapping[str, Any],
    nodes: Sequence[str],
    labels: Mapping[str, Mapping[str, str]],
    volumes_on: Iterable[str | None],
) -> str:
    """The node for a new volume by the rules in the module docstring. ``source_node`` is the
    clone source's node (None when the claim clones nothing); ``volumes_on`` the node of every
    volume already made or being made."""
    if wffc:
        if selected not in nodes:
            raise PlacementRefused(f"selected node {selected!r} is not served here")
        if source_node is not None and source_node != selected:
            raise PlacementRefused(
                f"the clone source is on node {source_node} and the claim's selected node is"
                f" {selected}: a local volume cannot be cloned to another node"
            )
        return str(selected)
    if source_node is not None:
        if source_node not in allowed_nodes(cls, nodes, labels):
            raise PlacementRefused(
                f"the clone source is on node {source_node}, which class"
                f" {(cls.get('metadata') or {}).get('name')} does not allow"
            )
        return source_node
    if selected:
        if selected not in nodes:
            raise PlacementRefused(f"selected node {selected!r} is not served here")
        return selected
    candidates = allowed_nodes(cls, nodes, labels)
    if not candidates:
        raise PlacementRefused(
            f"no node of {list(nodes)} is in the allowedTopologies of class"
            f" {(cls.get('metadata') or {}).get('name')}"
        )
    return least_loaded(candidates, volumes_on)
