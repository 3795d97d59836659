"""Each node's import slots: CDIConfig ``spec.maxConcurrentImportsPerNode`` as the extended
resource ``cdi.kubevirt.io/import-slots`` in the node's status (issue 28, not in CDI).

Why the scheduler and not a count in the controller: an importer's node is known only once the
scheduler has bound it, and by then nothing the controller counts can keep a second importer off
that node (a pod pinned to a claim's node is the exception, not the rule). An extended resource
is what Kubernetes offers for a per-node count the scheduler must respect: the node advertises
N, every importer pod requests one (``cdi.render.importer_pod``), the scheduler never binds more
than N of them to a node, and the kubelet refuses a pod that would exceed it (a pod given a
``nodeName`` directly too). The waiting pods stay Pending in the scheduler's queue, in its
order (priority, then the time each entered the queue, which for importers of one priority is
the order the controller created them), and start as slots free; their DataVolumes show
``ImportQueued`` (``cdi.controller.importslots.node_queued``).

The price is one privilege: the controller patches ``nodes/status``. A ValidatingAdmissionPolicy
(``deploy/18-node-status-policy.yaml``) confines those patches to this one key of
``status.capacity`` and ``status.allocatable``; everything else of a node (conditions,
addresses, cpu and memory, labels) the controller's identity cannot change.

The key is per node: ``reconcile(name)`` writes the advertised value when it differs from
CDIConfig's, once, by a merge patch of the status subresource (the kubelet keeps extended
resources it does not manage and copies capacity to allocatable; both are written so a node
whose agent does not is right at once). A node that re-registers (its extended resources
reset) is patched again when its watch event arrives. With the limit unset or 0, a node that
advertised slots keeps the key at ``UNLIMITED`` instead of losing it: importer pods created
under the limit and still waiting request a slot, and would never be scheduled on a node that
has none; a node that never advertised stays untouched.

What wakes it (``watches``): a node whose advertised value is not the wanted one, and any
CDIConfig change, which maps to every node in the cache.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from cdi.api.config import CDIConfig
from cdi.api.constants import IMPORT_SLOTS_RESOURCE
from cdi.api.quantity import QuantityError, parse_quantity
from cdi.kube.client import CDI_CONFIGS, NODES, AsyncKube
from cdi.kube.watches import For, Maps, Watches
from cdi.kube.workqueue import Result

JSON = dict[str, Any]
# Advertised once the limit is lifted: more than any node runs pods (the kubelet's default
# maxPods is 110), so it never binds, and pods created under the limit still schedule.
UNLIMITED = "100000"


class Store(Protocol):
    def get(self, key: str) -> JSON | None: ...

    def items(self) -> list[JSON]: ...


def node_view(obj: JSON) -> JSON:
    """What the node cache keeps (an informer transform): the name and the slot key. Nodes
    are large (images, conditions) and change every few seconds; this is all that is read."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    kept: JSON = {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta}}
    kept["status"] = {
        part: {IMPORT_SLOTS_RESOURCE: (status.get(part) or {})[IMPORT_SLOTS_RESOURCE]}
        for part in ("capacity", "allocatable")
        if IMPORT_SLOTS_RESOURCE in (status.get(part) or {})
    }
    return kept


def wanted(node: JSON, limit: int | None) -> str | None:
    """The value the node should advertise, or None when it already does (or should not)."""
    status = node.get("status") or {}
    have = [
        (status.get(part) or {}).get(IMPORT_SLOTS_RESOURCE) for part in ("capacity", "allocatable")
    ]
    if limit and limit > 0:
        want = str(limit)
    elif any(v is not None for v in have):
        want = UNLIMITED
    else:
        return None
    return None if all(_same(v, want) for v in have) else want


def _same(have: object, want: str) -> bool:
    """The API server keeps a quantity in its canonical form (100000 reads back as 100k)."""
    if not isinstance(have, str):
        return False
    try:
        return parse_quantity(have) == parse_quantity(want)
    except QuantityError:
        return False


def slots_patch(value: str) -> JSON:
    return {
        "status": {
            "capacity": {IMPORT_SLOTS_RESOURCE: value},
            "allocatable": {IMPORT_SLOTS_RESOURCE: value},
        }
    }


class NodeSlotsReconciler:
    def __init__(self, kube: AsyncKube, nodes: Store, cdi_config: Callable[[], CDIConfig]) -> None:
        self.kube = kube
        self.nodes = nodes
        self.cdi_config = cdi_config

    def limit(self) -> int | None:
        return self.cdi_config().spec.max_concurrent_imports_per_node

    def watches(self) -> Watches:
        def every_node(_obj: JSON) -> list[str]:
            return [str(n["metadata"]["name"]) for n in self.nodes.items()]

        def off(node: JSON) -> bool:
            return wanted(node, self.limit()) is not None

        return Watches((For(NODES, where=off), Maps(CDI_CONFIGS, every_node)))

    async def reconcile(self, name: str) -> Result:
        node = self.nodes.get(name)
        if node is None:
            return Result()
        value = wanted(node, self.limit())
        if value is not None:
            await self.kube.patch(NODES, name, slots_patch(value), sub="status")
        return Result()
