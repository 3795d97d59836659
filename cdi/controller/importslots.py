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
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api.constants import LABEL_COMPONENT

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
