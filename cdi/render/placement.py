"""Where a worker pod may run: the pod spec's ``nodeSelector``, ``tolerations`` and ``affinity``.

Three inputs, combined so that each can only narrow what the one before allowed:

1. the CDI resource's ``spec.workload`` (CDI's ``NodePlacement``, carried to the renderers in
   CDIConfig's status): the cluster admin's nodeSelector, tolerations and affinity, applied to
   every worker pod as CDI applies them (importer, DataImportCron poller, upload server, clone
   source);
2. per DataVolume, the annotation ``cdi.kubevirt.io/storage.pod.nodeSelector`` (a JSON object of
   node labels). CDI reads it on the claim for VDDK imports only (CDI PR #4096, where it
   *replaces* the workload nodeSelector); per-DataVolume placement for every import was asked
   for (CDI#4000, #1695, #1942) and not done there. Here it applies to the pods that write the
   DataVolume's claim (importer, upload server), and it is *added* to the workload placement as
   required node affinity, so a tenant can choose among the nodes the admin allows but never
   leave them; a selector that no allowed node matches leaves the pod unschedulable, and the
   DataVolume waits with ``Running`` False ``Unschedulable`` (never ``Failed``). Tolerations and
   affinity per DataVolume are not taken: a toleration would let a tenant onto nodes the admin
   tainted to keep worker pods off;
3. the node the volume is on (``node``): a claim the scheduler already placed
   (``volume.kubernetes.io/selected-node``: a WaitForFirstConsumer claim, a prime claim of such a
   target) or a clone source read on one node (CDI's required affinity for a ReadWriteOnce source
   mounted by another pod). Pinned by required node affinity on the node's name
   (``matchFields metadata.name``), which holds whatever labels the node has.

Every required addition is ANDed into each of the workload's ``nodeSelectorTerms`` (the terms
are ORed by the scheduler, so adding to each keeps the admin's alternatives and the addition).
Pure: the renderers call ``pod_placement`` and put its fields into the pod spec.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from cdi.api.config import NodePlacement
from cdi.api.constants import ANN_SELECTED_NODE, GROUP

ANN_POD_NODE_SELECTOR = f"{GROUP}/storage.pod.nodeSelector"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


class PlacementError(ValueError):
    """An annotation that is not a JSON object of label strings."""


def node_selector_annotation(annotations: Mapping[str, str]) -> dict[str, str]:
    """The per-DataVolume node selector; {} when absent. ``PlacementError`` when malformed
    (the webhook refuses such a DataVolume with this message)."""
    raw = annotations.get(ANN_POD_NODE_SELECTOR)
    if raw is None or raw == "":
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise PlacementError(f"{ANN_POD_NODE_SELECTOR}: not JSON: {exc}") from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise PlacementError(f"{ANN_POD_NODE_SELECTOR}: must be a JSON object of strings")
    return dict(value)


def requested_selector(annotations: Mapping[str, str]) -> dict[str, str]:
    """``node_selector_annotation`` for a renderer: a malformed value (only a claim written
    directly can carry one; the webhook refuses it on a DataVolume) adds nothing."""
    try:
        return node_selector_annotation(annotations)
    except PlacementError:
        return {}


def selected_node(claim: Mapping[str, Any]) -> str | None:
    ann = (claim.get("metadata") or {}).get("annotations") or {}
    return ann.get(ANN_SELECTED_NODE) or None


def pod_placement(
    workload: NodePlacement,
    labels: Mapping[str, str] | None = None,
    node: str | None = None,
) -> dict[str, Any]:
    """The pod spec fields for ``workload`` narrowed by node ``labels`` and pinned to ``node``."""
    affinity: dict[str, Any] = (
        copy.deepcopy(dict(workload.affinity)) if isinstance(workload.affinity, Mapping) else {}
    )
    expressions = [
        {"key": k, "operator": "In", "values": [v]} for k, v in sorted((labels or {}).items())
    ]
    fields = [{"key": "metadata.name", "operator": "In", "values": [node]}] if node else []
    if expressions or fields:
        node_affinity = affinity.setdefault("nodeAffinity", {})
        required = node_affinity.setdefault(REQUIRED, {})
        terms = required.get("nodeSelectorTerms") or [{}]
        required["nodeSelectorTerms"] = [_and(t, expressions, fields) for t in terms]
    out: dict[str, Any] = {}
    if workload.node_selector:
        out["nodeSelector"] = dict(workload.node_selector)
    if workload.tolerations:
        out["tolerations"] = [copy.deepcopy(t) for t in workload.tolerations]
    if affinity:
        out["affinity"] = affinity
    return out


def _and(
    term: Mapping[str, Any], expressions: list[dict[str, Any]], fields: list[dict[str, Any]]
) -> dict[str, Any]:
    out = copy.deepcopy(dict(term))
    if expressions:
        out["matchExpressions"] = [*(out.get("matchExpressions") or []), *expressions]
    if fields:
        out["matchFields"] = [*(out.get("matchFields") or []), *fields]
    return out


def prefer_pods_with(
    placement: dict[str, Any], namespace: str, labels: Mapping[str, str], weight: int = 100
) -> dict[str, Any]:
    """``placement`` with a preferred pod affinity to the pods labelled ``labels`` in
    ``namespace`` on the same node (CDI's clone source beside its upload server)."""
    out = copy.deepcopy(placement)
    pod_affinity = out.setdefault("affinity", {}).setdefault("podAffinity", {})
    term = {
        "weight": weight,
        "podAffinityTerm": {
            "labelSelector": {"matchLabels": dict(labels)},
            "namespaces": [namespace],
            "topologyKey": "kubernetes.io/hostname",
        },
    }
    pod_affinity[PREFERRED] = [*(pod_affinity.get(PREFERRED) or []), term]
    return out
