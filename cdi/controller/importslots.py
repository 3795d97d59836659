"""How many imports run at once, cluster-wide (issue 28: imports that share the network fairly).

CDIConfig ``spec.maxConcurrentImports`` (not in CDI) bounds the importer pods alive at once
(Pending or Running, not being deleted; a DataImportCron's digest poller does not count). A
DataVolume beyond it waits before its importer pod is created, in phase ``ImportScheduled``
with Running=False reason ``ImportQueued`` and a message that says how many are ahead of it;
the waiting ones start in creation order (creationTimestamp, then namespace and name) as
slots free. The queue knows only the DataVolumes that asked, so a waiter starts no sooner
than ``SETTLE`` seconds after it first asked: the DataVolumes of a burst, reconciled one
after the other, are all in line by then, and the oldest goes first (an import under a limit
starts ~1-2 s later than without one).

What holds a slot is read from the controller's worker-pod informer (every importer pod in the
cluster), so a new leader counts the imports already running and a deleted DataVolume's pod
frees its slot when it goes; only two things are kept in memory: the pods admitted in the last
``RECENT`` seconds that the cache may not show yet, and the queue of waiters, each dropped when
its reconcile stops asking for ``WAIT_TTL`` seconds (a deleted DataVolume's place is not kept).

Per node, CDIConfig ``spec.maxConcurrentImportsPerNode`` (not in CDI either) is kept by the
scheduler, not here: which node an importer lands on is known only once the scheduler has
bound it, and a count kept by the controller could not stop the scheduler from putting a
second importer on a node. So every node advertises the extended resource
``cdi.kubevirt.io/import-slots`` (``cdi.controller.nodeslots``), every importer pod requests
one (``cdi.render.importer_pod``), and the pods beyond it stay Pending, Unschedulable, in the
scheduler's queue (priority, then the time each entered it: the order they were created).
This module only tells such a waiter apart from a pod that cannot be placed at all
(``node_queued``): it is Unschedulable, it requests a slot, and some node has every slot
taken, counted from the same informer; its DataVolume then shows ``ImportQueued`` too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api.constants import IMPORT_SLOTS_RESOURCE, LABEL_COMPONENT

RECENT = 15.0  # seconds an admitted pod counts before the informer shows it
WAIT_TTL = 20.0  # seconds a waiter keeps its place without asking again
SETTLE = 1.0  # seconds a waiter is queued before it may start: the others of a burst line up
REQUEUE = 2.0  # how often a waiter asks again
QUEUED_REASON = "ImportQueued"
IMPORTER = "importer"

Key = tuple[str, str]  # (namespace, name)


def alive_importers(pods: Iterable[Mapping[str, Any]]) -> set[Key]:
    """The importer pods that hold a slot: Pending or Running, not being deleted, no poller."""
    alive: set[Key] = set()
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        owners = {str(ref.get("kind")) for ref in meta.get("ownerReferences") or []}
        if labels.get(LABEL_COMPONENT) != IMPORTER or "DataImportCron" in owners:
            continue  # a cron's digest poller reads a manifest, not an image
        if meta.get("deletionTimestamp"):
            continue
        if (pod.get("status") or {}).get("phase", "Pending") not in ("Pending", "Running"):
            continue
        alive.add((str(meta.get("namespace") or ""), str(meta.get("name") or "")))
    return alive


def requests_slot(pod: Mapping[str, Any]) -> bool:
    """The pod asks the scheduler for one of a node's import slots."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        if IMPORT_SLOTS_RESOURCE in ((container.get("resources") or {}).get("requests") or {}):
            return True
    return False


def full_nodes(pods: Iterable[Mapping[str, Any]], limit: int) -> set[str]:
    """The nodes on which ``limit`` or more slot-holding importer pods are alive."""
    listed = list(pods)
    alive = alive_importers(listed)
    held: dict[str, int] = {}
    for pod in listed:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        if node and key in alive and requests_slot(pod):
            held[str(node)] = held.get(str(node), 0) + 1
    return {node for node, n in held.items() if n >= limit}


def node_queued(
    pod: Mapping[str, Any], limit: int, pods: Iterable[Mapping[str, Any]]
) -> tuple[str, str] | None:
    """(reason, message) of the Running condition for an importer pod waiting in the scheduler
    for a node's import slot; None when it is not one (the pod's own problem stands)."""
    if not limit or limit <= 0 or not requests_slot(pod):
        return None
    scheduled = None
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled":
            scheduled = cond
    if scheduled is None or scheduled.get("status") != "False":
        return None
    if scheduled.get("reason") != "Unschedulable":
        return None
    said = str(scheduled.get("message") or "")
    if IMPORT_SLOTS_RESOURCE not in said:
        return None  # unschedulable for another reason (an unbound claim, a selector): its own
    full = full_nodes(pods, limit)
    if not full:
        return None
    said = said[:256]
    return QUEUED_REASON, (
        f"waiting for an import slot on a node: at most {limit} imports run on a node at once "
        f"(CDIConfig spec.maxConcurrentImportsPerNode), {len(full)} node(s) have none free; "
        f"the scheduler: {said}"
    )


@dataclass
class ImportSlots:
    clock: Callable[[], float] = time.monotonic
    recent: dict[Key, float] = field(default_factory=dict)  # admitted pod -> when
    # waiter -> (its place: creationTimestamp, namespace, name; first asked; last asked)
    waiting: dict[Key, tuple[tuple[str, str, str], float, float]] = field(default_factory=dict)

    def take(
        self,
        dv: Key,
        created: str,
        pod: Key,
        limit: int,
        pods: Iterable[Mapping[str, Any]],
    ) -> int | None:
        """None: ``dv`` may create its importer pod ``pod`` now (the slot is counted from here
        on); else how many waiters are ahead of it. ``created`` is its creationTimestamp."""
        now = self.clock()
        alive = alive_importers(pods)
        self.recent = {k: t for k, t in self.recent.items() if now - t < RECENT and k not in alive}
        self.waiting = {k: v for k, v in self.waiting.items() if now - v[2] < WAIT_TTL}
        if pod in alive or pod in self.recent:
            self.waiting.pop(dv, None)
            return None  # its pod holds a slot already
        first = self.waiting[dv][1] if dv in self.waiting else now
        self.waiting[dv] = ((created, dv[0], dv[1]), first, now)
        queue = sorted(self.waiting, key=lambda k: self.waiting[k][0])
        position = queue.index(dv)
        settled = now - first >= SETTLE
        if settled and position < limit - len(alive) - len(self.recent):
            del self.waiting[dv]
            self.recent[pod] = now
            return None
        return position

    @staticmethod
    def message(limit: int, ahead: int) -> str:
        return (
            f"waiting for an import slot: at most {limit} imports run at once "
            f"(CDIConfig spec.maxConcurrentImports); {ahead} DataVolume(s) ahead of this one"
        )
