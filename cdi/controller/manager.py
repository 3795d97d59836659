"""The controller process: informers, one work queue, bounded workers, leader election.

Start-up: become leader (a Lease; a standby replica waits here), start informers, wait for
their caches, then run ``workers`` reconcilers off the queue. Watches only enqueue keys: a
DataVolume maps to itself, a PVC or importer Pod to the DataVolume that controls it (or that
it was created for), a StorageClass/StorageProfile/CDIConfig change to every DataVolume still
waiting for its claim. Shutdown (SIGTERM or lost leadership): stop the queue, let in-flight
reconciles finish (bounded by ``shutdown_grace``), release the Lease, stop informers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field
from typing import Any

from cdi.api.constants import ANN_CREATED_FOR_DATAVOLUME, KIND_DATAVOLUME, LABEL_COMPONENT
from cdi.controller.datavolume import Caches, ControllerConfig, DataVolumeReconciler
from cdi.controller.progress import HttpScraper
from cdi.kube.client import (
    CDI_CONFIGS,
    DATAVOLUMES,
    PODS,
    PVCS,
    STORAGE_CLASSES,
    STORAGE_PROFILES,
    AsyncKube,
    Kube,
    object_key,
)
from cdi.kube.events import EventRecorder
from cdi.kube.informer import Informer, wait_all_synced
from cdi.kube.leader import LeaderConfig, LeaderElector, LeadershipLost
from cdi.kube.workqueue import Backoff, WorkQueue, run_workers

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManagerConfig:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    leader: LeaderConfig | None = None  # None: no election (single replica, tests)
    workers: int = 3
    resync: float = 300.0
    shutdown_grace: float = 20.0
    sync_timeout: float = 60.0


def owner_key(obj: dict[str, Any]) -> str | None:
    """The DataVolume key a PVC or Pod belongs to, or None."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == KIND_DATAVOLUME:
            return f"{ns}/{ref.get('name')}"
    if (meta.get("annotations") or {}).get(ANN_CREATED_FOR_DATAVOLUME):
        return f"{ns}/{meta.get('name')}"  # an adopted claim has its DataVolume's name
    return None


class Manager:
    def __init__(self, kube: Kube, config: ManagerConfig, identity: str = "cdi-controller"):
        self.config = config
        self.kube = AsyncKube(kube)
        self.queue = WorkQueue(Backoff(base=0.1, cap=30.0))
        r = config.resync
        self.informers = {
            "dv": Informer(kube, DATAVOLUMES, resync=r),
            "pvc": Informer(kube, PVCS, resync=r),
            "pod": Informer(kube, PODS, label_selector=f"{LABEL_COMPONENT}=importer", resync=r),
            "sc": Informer(kube, STORAGE_CLASSES, resync=r),
            "profile": Informer(kube, STORAGE_PROFILES, resync=r),
            "config": Informer(kube, CDI_CONFIGS, resync=r),
        }
        self.scraper = HttpScraper()
        self.reconciler = DataVolumeReconciler(
            self.kube,
            Caches(
                pods=self.informers["pod"],
                storage_classes=self.informers["sc"],
                storage_profiles=self.informers["profile"],
                cdi_configs=self.informers["config"],
            ),
            EventRecorder(self.kube, "datavolume-controller", identity),
            self.scraper,
            config.controller,
        )
        self.elector = LeaderElector(self.kube, config.leader) if config.leader else None
        self._stop = asyncio.Event()

    def _wire(self) -> None:
        q = self.queue
        self.informers["dv"].add_handler(lambda o: q.add(object_key(o)))
        for name in ("pvc", "pod"):
            self.informers[name].add_handler(lambda o: self._enqueue_owner(o))
        for name in ("sc", "profile", "config"):
            self.informers[name].add_handler(lambda _o: self._enqueue_waiting())

    def _enqueue_owner(self, obj: dict[str, Any]) -> None:
        key = owner_key(obj)
        if key is not None:
            self.queue.add(key)

    def _enqueue_waiting(self) -> None:
        for dv in self.informers["dv"].items():
            if (dv.get("status") or {}).get("phase") in (None, "", "Pending"):
                self.queue.add(object_key(dv))

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        if self.elector is not None:
            acquiring: asyncio.Task[Any] = asyncio.create_task(self.elector.acquire())
            stopping: asyncio.Task[Any] = asyncio.create_task(self._stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not acquiring.done():
                acquiring.cancel()
                return
            stopping.cancel()
        self._wire()
        for informer in self.informers.values():
            informer.start()
        try:
            async with asyncio.timeout(self.config.sync_timeout):
                await wait_all_synced(list(self.informers.values()))
            log.info("caches synced; %d workers", self.config.workers)
            await self._run_until_stopped()
        finally:
            await self._shutdown()

    async def _run_until_stopped(self) -> None:
        workers = asyncio.create_task(
            run_workers(self.queue, self.reconciler.reconcile, self.config.workers)
        )
        watchers: list[asyncio.Task[Any]] = [asyncio.create_task(self._stop.wait())]
        if self.elector is not None:
            watchers.append(asyncio.create_task(self.elector.hold()))
        done, _ = await asyncio.wait([workers, *watchers], return_when=asyncio.FIRST_COMPLETED)
        for task in watchers:
            task.cancel()
        for task in done:
            if task is not workers and not task.cancelled() and task.exception():
                exc = task.exception()
                if isinstance(exc, LeadershipLost):
                    log.error("leadership lost; stopping")
        self.queue.shutdown()  # no new keys; running reconciles finish
        try:
            await asyncio.wait_for(workers, self.config.shutdown_grace)
        except TimeoutError:
            log.warning(
                "reconciles still running after %.0fs; abandoning them", self.config.shutdown_grace
            )

    async def _shutdown(self) -> None:
        for informer in self.informers.values():
            informer.stop()
        if self.elector is not None:
            await self.elector.release()
        await self.scraper.close()
        self.kube.close()


async def serve(manager: Manager) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, manager.stop)
    await manager.run()
