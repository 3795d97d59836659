"""Watches of the CSI snapshot API, started only once the cluster serves it.

VolumeSnapshots and VolumeSnapshotClasses are CRDs that many clusters do not have. An informer
on a kind that is not served would list 404 forever and never sync, and the manager waits for
its informers to sync before it reconciles: a cluster without the CRDs would never start. So
these two informers are kept out of that wait: ``run`` asks the API (a one-item list of
VolumeSnapshotClasses) until it answers, every ``recheck`` seconds (CRDs installed later are
picked up), then starts both. Until then nothing watches snapshots and the clone flavour,
which reads them directly, simply polls (and falls back to host-assisted copy for lack of a
class, as CDI does).

What an event maps to is declared by the reconcilers it wakes (``cdi.kube.watches``; the
manager hands these two informers to its caches as deferred ones, ``cdi.controller.caches``): a
temporary snapshot to the DataVolume it was made for and a snapshot to the DataVolumes naming
it (``datavolume_keys``, ``cdi.controller.datavolume``), to the DataSources naming it
(``cdi.controller.datasource``), a class to every StorageProfile (their default strategy
depends on it) and to the DataVolumes still waiting for a claim.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

from cdi.kube.client import VOLUME_SNAPSHOT_CLASSES, VOLUME_SNAPSHOTS, AsyncKube, Kube
from cdi.kube.errors import KubeError, NotFound
from cdi.kube.informer import Informer
from cdi.render.clone import ANN_MOVE_TARGET

log = logging.getLogger(__name__)


class SnapshotWatch:
    def __init__(self, kube: Kube, api: AsyncKube, resync: float, recheck: float = 60.0) -> None:
        self.kube = api
        self.recheck = recheck
        self.snapshots = Informer(kube, VOLUME_SNAPSHOTS, resync=resync)
        self.classes = Informer(kube, VOLUME_SNAPSHOT_CLASSES, resync=resync)
        self.started = False

    async def served(self) -> bool:
        try:
            await self.kube.list(VOLUME_SNAPSHOT_CLASSES, limit=1)
        except NotFound:
            return False
        except KubeError as exc:
            log.warning("snapshot API discovery failed: %s", exc)
            return False
        return True

    async def run(self) -> None:
        """Start the informers once the API is served; return then (or run until cancelled)."""
        while True:  # a poll of the API: nothing here could set an event
            if await self.served():
                break
            await asyncio.sleep(self.recheck)
        self.snapshots.start()
        self.classes.start()
        self.started = True
        log.info("the snapshot API is served: watching VolumeSnapshots and their classes")

    def stop(self) -> None:
        self.snapshots.stop()
        self.classes.stop()


def datavolume_keys(
    snapshot: Mapping[str, Any], datavolumes: Iterable[Mapping[str, Any]]
) -> list[str]:
    """The DataVolumes a snapshot event concerns: the one a temporary snapshot was made for,
    and those whose ``source.snapshot`` names it."""
    meta = snapshot.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name")
    keys = []
    target = (meta.get("annotations") or {}).get(ANN_MOVE_TARGET)
    if target:
        keys.append(str(target))
    for dv in datavolumes:
        dv_meta = dv.get("metadata") or {}
        ref = ((dv.get("spec") or {}).get("source") or {}).get("snapshot") or {}
        if ref.get("name") == name and (ref.get("namespace") or dv_meta.get("namespace")) == ns:
            keys.append(f"{dv_meta.get('namespace')}/{dv_meta.get('name')}")
    return keys
