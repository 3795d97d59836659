"""The controller process: the composition root of informers, one work queue per reconciler,
bounded workers, leader election, and the metrics endpoint.

Start-up: become leader (a Lease; a standby replica waits here), wire, start informers, wait
for their caches, then run each reconciler's workers off its own queue (a key is only ever
"namespace/name" of that reconciler's kind).

Wiring: what wakes a reconciler is declared beside it (``cdi.kube.watches``: ``For``, ``Owns``,
``Maps``; ``watches``/``WATCHES`` in ``cdi.controller.datavolume``, ``uploadpvc``,
``populators``, ``dataimportcron``, ``storageprofile``, ``cdiconfig``, ``cdiresource``,
``datasource``, ``nodeslots``). Here
each reconciler is built with its declaration, one informer is made per kind that a reconciler
reads or watches (``cdi.controller.caches``: shared by all of them), and each declared watch
becomes one handler on its kind's informer that adds the keys it maps an object to to that
reconciler's queue. Watches only enqueue keys. What is not a declaration stays here, explicit:

- the burst priority of new DataVolumes: their ``For`` puts them ahead of the queue; under a
  burst of them (``WorkQueue.urgent``) follow-up reconciles are limited to a quarter of the
  workers, and events wait (at most 5 s) until the burst is served;
- VolumeSnapshots and their classes are watched only once the cluster serves the snapshot API:
  their informers are ``SnapshotWatch``'s (``cdi.controller.snapshotwatch``), started by it and
  outside the cache-sync wait; declarations name them like any other kind;
- a CDIConfig change also sets the process's log level from ``logVerbosity``
  (``cdi.lifecycle``), while leading;
- ``/metrics`` answers only a bearer token the API server reviews and allows
  (``cdi.controller.metrics_auth``); its reviews go through an unfenced client of their own,
  since a standby is scraped too.

Events of every reconciler go through one ``EventQueue`` (``cdi.kube.events``), written by a
background task, so no reconcile waits for an event's round trip.

Shutdown (SIGTERM or lost leadership): stop the queues, let in-flight reconciles finish
(bounded by ``shutdown_grace``), write the queued events (a few seconds at most), release the
Lease (only on SIGTERM: a lost one runs out), stop informers and the metrics server. After a
lost Lease, ``serve`` starts a fresh Manager that stands by again. Every write of the
reconcilers and events goes through a client fenced by the Lease (``cdi.kube.leader``): once
the renew deadline has passed without a renewal, none is sent, so the reconciles that finish
after a lost leadership change nothing, and none still in flight can land after a successor
may act.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cdi.controller import (
    cdiconfig,
    cdiresource,
    dataimportcron,
    datasource,
    populators,
    storageprofile,
)
from cdi.controller import uploadpvc as uploadpvcs
from cdi.controller.caches import Informers
from cdi.controller.cdiconfig import CDIConfigReconciler
from cdi.controller.cdiresource import CDIResourceReconciler
from cdi.controller.dataimportcron import CronSettings, DataImportCronReconciler
from cdi.controller.dataimportcron_desired import DATAIMPORTCRONS
from cdi.controller.datasource import DataSourceReconciler
from cdi.controller.datavolume import (
    Caches,
    ControllerConfig,
    DataVolumeReconciler,
    import_settings,
    utc_now,
)
from cdi.controller.flavours import FlavourDeps
from cdi.controller.flavours.import_ import ImportFlavour
from cdi.controller.flavours.upload import UploadWorker
from cdi.controller.metrics import ControllerMetrics, Sources
from cdi.controller.metrics_auth import MetricsGuard
from cdi.controller.metrics_serving import MetricsServer, MetricsServing, metrics_cert_config
from cdi.controller.nodeslots import NodeSlotsReconciler
from cdi.controller.populators.clone import ClonePopulator
from cdi.controller.populators.handover import PrimePopulator
from cdi.controller.populators.import_ import ImportPopulator
from cdi.controller.populators.upload import UploadPopulator
from cdi.controller.progress import HttpScraper
from cdi.controller.proxycreds import keep_proxy_credentials
from cdi.controller.seal import Seal
from cdi.controller.snapshotwatch import SnapshotWatch
from cdi.controller.storageprofile import StorageProfileReconciler
from cdi.controller.uploadpvc import UploadPVCReconciler
from cdi.kube.client import (
    CDI_CONFIGS,
    CDIS,
    DATA_SOURCES,
    DATAVOLUMES,
    NODES,
    PODS,
    PVCS,
    STORAGE_CLASSES,
    STORAGE_PROFILES,
    AsyncKube,
    Kube,
)
from cdi.kube.events import EventQueue, EventRecorder
from cdi.kube.informer import wait_all_synced
from cdi.kube.leader import LeaderConfig, LeaderElector, LeadershipLost
from cdi.kube.watches import Watch, Watches
from cdi.kube.workqueue import Backoff, Reconcile, WorkQueue, run_workers
from cdi.lifecycle import LogVerbosity

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManagerConfig:
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    leader: LeaderConfig | None = None  # None: no election (single replica, tests)
    workers: int = 3
    resync: float = 300.0
    shutdown_grace: float = 20.0
    sync_timeout: float = 60.0
    namespace: str = "cdi"  # where the upload proxy is deployed
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = 8080  # None: no metrics server
    metrics_tls: bool = False  # /metrics over TLS (cdi.controller.metrics_serving)
    config_recheck: float = 60.0
    # HMAC key of the signed requester record (cdi.api.requester.trusted_requester), from
    # --requester-key-secret / --requester-key-file; None: no record is trusted.
    requester_key: bytes | None = None
    # --log-level: what the process logs while CDIConfig logVerbosity is unset
    log_level: int = logging.INFO


@dataclass(frozen=True)
class Controller:
    """One reconciler as the manager runs it: its (timed) reconcile function, how many
    workers, and what wakes it."""

    name: str
    reconcile: Reconcile
    watches: Watches
    workers: int = 1


@dataclass(frozen=True)
class Loop:
    """One reconciler with its queue."""

    controller: Controller
    queue: WorkQueue

    def deliver(self, watch: Watch, obj: dict[str, Any]) -> None:
        """An event on ``obj``, seen through one of this reconciler's watches."""
        for request in watch.requests(obj):
            self.queue.add(request.key, first=request.first)


def new_queue(follow_ups_while_urgent: int | None = None) -> WorkQueue:
    return WorkQueue(Backoff(base=0.1, cap=30.0), follow_ups_while_urgent=follow_ups_while_urgent)


class Manager:
    def __init__(self, kube: Kube, config: ManagerConfig, identity: str = "cdi-controller"):
        self.config = config
        self.elector: LeaderElector | None = None
        if config.leader:
            # the Lease's requests: not fenced, and two threads of their own so a renewal never
            # waits behind a burst of reconciles; everything else writes only while leading
            self.elector = LeaderElector(AsyncKube(kube, max_threads=2), config.leader)
        # a standby answers scrapes too: the metrics' reviews are not fenced, own threads
        self.metrics_guard = MetricsGuard(AsyncKube(kube, max_threads=2))
        self._unfenced = kube  # the metrics certificate is kept by a standby too
        if self.elector is not None:
            kube = kube.fenced(self.elector.fence)
        self.kube = AsyncKube(kube)
        self.informers = Informers(kube, config.resync)
        self.snapshots = SnapshotWatch(kube, self.kube, config.resync, config.config_recheck)
        # watched like any kind, but started by SnapshotWatch once the API is served
        self.informers.defer(self.snapshots.snapshots, self.snapshots.classes)
        self.scraper = HttpScraper()
        # every recorder's events, written off the reconciles, after new DataVolumes' claims
        # and pods while a burst of them waits (bounded delay)
        self.events = EventQueue(self.kube, busy=self._burst)
        i = self.informers
        self.metrics = ControllerMetrics(
            Sources(
                i[DATAVOLUMES],
                i[STORAGE_CLASSES],
                i[STORAGE_PROFILES],
                i[DATAIMPORTCRONS],
                ready=lambda: self._ready,
            )
        )
        # a burst of new DataVolumes: their first reconciles get the workers, follow-ups a
        # quarter of them (WorkQueue.urgent)
        limits = {"datavolume": max(1, config.workers // 4)}
        self.loops = {
            c.name: Loop(
                dataclasses.replace(c, reconcile=self.metrics.timed(c.name, c.reconcile)),
                new_queue(limits.get(c.name)),
            )
            for c in self._controllers(identity)
        }
        self.verbosity = LogVerbosity(flag_level=config.log_level)
        self._metrics_server: MetricsServer | None = None
        self._ready = False  # leading with synced caches (kubevirt_cdi_cr_ready)
        self._stop = asyncio.Event()
        self.lost_leadership = False

    def _burst(self) -> bool:
        """New DataVolumes are waiting for (or in) their first reconcile."""
        return self.loops["datavolume"].queue.urgent > 0

    def _recorder(self, component: str, identity: str) -> EventRecorder:
        return EventRecorder(self.kube, component, identity, self.events)

    def _controllers(self, identity: str) -> list[Controller]:
        """Every reconciler, built with the caches it reads, and its declared watches."""
        i, cfg = self.informers, self.config
        datavolumes = DataVolumeReconciler(
            self.kube,
            Caches(
                pods=i[PODS],
                storage_classes=i[STORAGE_CLASSES],
                storage_profiles=i[STORAGE_PROFILES],
                cdi_configs=i[CDI_CONFIGS],
                datavolumes=i[DATAVOLUMES],
                claims=i[PVCS],
            ),
            self._recorder("datavolume-controller", identity),
            self.scraper,
            # the clone flavour checks the webhook's signed requester record with this key
            dataclasses.replace(cfg.controller, requester_key=cfg.requester_key),
            burst=lambda: self.loops["datavolume"].queue.first_waiting > 0,
        )
        self.datavolumes = datavolumes
        # seals the records that authorize acts beyond a tenant's reach (cdi.controller.seal)
        seal = Seal.from_shared_key(cfg.requester_key)
        deps = FlavourDeps(
            self.kube, datavolumes.events, self.scraper, seal=seal, worker_pods=i[PODS].items
        )
        settings = cfg.controller
        uploads = UploadPVCReconciler(
            self.kube,
            UploadWorker(deps, settings.upload),
            self._recorder("upload-controller", identity),
            i[STORAGE_CLASSES],
            datavolumes.cdi_config,
        )
        self.populators = self._populators(identity, seal, deps)
        crons = DataImportCronReconciler(
            self.kube,
            CronSettings(settings.importer_image, settings.pull_policy, settings.cluster_cidrs),
            i[DATAVOLUMES],
            # signs the on-behalf record of a cross-namespace pvc source (cdi.api.onbehalf)
            requester_key=cfg.requester_key,
        )
        profiles = StorageProfileReconciler(self.kube, utc_now)
        cdi_config = CDIConfigReconciler(
            self.kube, i[STORAGE_CLASSES], cfg.namespace, cfg.config_recheck, i[CDIS]
        )
        cdi_resources = CDIResourceReconciler(self.kube, i[CDIS], cfg.namespace, cfg.config_recheck)
        # a source in another namespace is read only for a creator the webhook signed (N7)
        datasources = DataSourceReconciler(self.kube, utc_now, cfg.requester_key)
        node_slots = NodeSlotsReconciler(self.kube, i[NODES], datavolumes.cdi_config)
        claims = i[PVCS].get
        return [
            Controller(
                "datavolume",
                datavolumes.reconcile,
                datavolumes.watches(i[DATAVOLUMES]),
                cfg.workers,
            ),
            Controller("uploadpvc", uploads.reconcile, uploadpvcs.watches(i[PODS])),
            *(
                Controller(
                    name,
                    populator.reconcile,
                    populators.watches(populator.kinds, claims),
                    cfg.workers if name == "populator" else 1,
                )
                for name, populator in self.populators.items()
            ),
            Controller(
                "dataimportcron", crons.reconcile, dataimportcron.watches(i[DATAIMPORTCRONS])
            ),
            Controller(
                "storageprofile", profiles.reconcile, storageprofile.watches(i[STORAGE_CLASSES])
            ),
            Controller("cdiconfig", cdi_config.reconcile, cdiconfig.WATCHES),
            Controller("nodeslots", node_slots.reconcile, node_slots.watches()),
            Controller("cdi", cdi_resources.reconcile, cdiresource.watches(i[CDIS])),
            Controller(
                "datasource",
                datasources.reconcile,
                datasource.watches(i[DATA_SOURCES]),
            ),
        ]

    def _populators(
        self, identity: str, seal: Seal, deps: FlavourDeps
    ) -> dict[str, PrimePopulator]:
        """One populator per source kind: import, upload, clone."""
        i, settings = self.informers, self.config.controller
        config = self.datavolumes.cdi_config
        return {
            "populator": ImportPopulator(
                self.kube,
                i[PODS],
                i[STORAGE_CLASSES],
                config,
                self._recorder("import-populator", identity),
                seal,
                ImportFlavour(deps, import_settings(settings)),
            ),
            "populator-upload": UploadPopulator(
                self.kube,
                i[STORAGE_CLASSES],
                config,
                self._recorder("upload-populator", identity),
                seal,
                UploadWorker(deps, settings.upload),
            ),
            "populator-clone": ClonePopulator(
                self.kube,
                i[STORAGE_CLASSES],
                config,
                self._recorder("clone-populator", identity),
                seal,
            ),
        }

    def wire(self) -> None:
        """Each declared watch: one handler on the informer of its kind, feeding its queue."""
        for loop in self.loops.values():
            for watch in loop.controller.watches.watches:
                self.informers[watch.resource].add_handler(functools.partial(loop.deliver, watch))
            for key in loop.controller.watches.initial:
                loop.queue.add(key)
        # logVerbosity, from the cache (an event may be a deletion): while leading
        self.informers[CDI_CONFIGS].add_handler(
            lambda _o: self.verbosity.apply(self.datavolumes.cdi_config())
        )

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Serve metrics from the start (a standby too, as controller-runtime does: its cache
        metrics are simply empty), lead, then reconcile until stopped."""
        c = self.config
        if c.metrics_port is not None:
            tls = metrics_cert_config(c.namespace) if c.metrics_tls else None
            serving = MetricsServing(c.metrics_host, c.metrics_port, tls)
            server = MetricsServer(self._unfenced, self.metrics, self.metrics_guard, serving)
            await server.start()
            self._metrics_server = server
        try:
            await self._lead_and_run()
        finally:
            if self._metrics_server is not None:
                await self._metrics_server.stop()
            self.metrics_guard.kube.close()

    async def _lead_and_run(self) -> None:
        if self.elector is not None:
            acquiring: asyncio.Task[Any] = asyncio.create_task(self.elector.acquire())
            stopping: asyncio.Task[Any] = asyncio.create_task(self._stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not acquiring.done():
                acquiring.cancel()
                return
            stopping.cancel()
        self.wire()
        self.events.start()
        informers = list(self.informers.started_here())  # the snapshot kinds start later
        for informer in informers:
            informer.start()
        try:
            async with asyncio.timeout(self.config.sync_timeout):
                await wait_all_synced(informers)
            log.info("caches synced; %d workers", self.config.workers)
            self._ready = True
            await self._run_until_stopped()
        finally:
            self._ready = False
            await self._shutdown()

    async def _run_until_stopped(self) -> None:
        workers = asyncio.create_task(self._run_loops())
        snapshots = asyncio.create_task(self.snapshots.run())  # returns once it watches
        proxy_credentials = asyncio.create_task(
            keep_proxy_credentials(
                self.kube,
                self.config.controller.upload.namespace,
                self.datavolumes.cdi_config,
                server_default=self.config.controller.upload.cert_lifetime,
            )
        )
        watchers: list[asyncio.Task[Any]] = [asyncio.create_task(self._stop.wait())]
        if self.elector is not None:
            watchers.append(asyncio.create_task(self.elector.hold()))
        done, _ = await asyncio.wait([workers, *watchers], return_when=asyncio.FIRST_COMPLETED)
        for task in [*watchers, snapshots, proxy_credentials]:
            task.cancel()
        for task in done:
            if task is not workers and not task.cancelled() and task.exception():
                exc = task.exception()
                if isinstance(exc, LeadershipLost):
                    log.error("leadership lost (%s); stopping this term", exc)
                    self.lost_leadership = True
        for loop in self.loops.values():
            loop.queue.shutdown()  # no new keys; running reconciles finish
        try:
            await asyncio.wait_for(workers, self.config.shutdown_grace)
        except TimeoutError:
            log.warning(
                "reconciles still running after %.0fs; abandoning them", self.config.shutdown_grace
            )

    async def _run_loops(self) -> None:
        await asyncio.gather(
            *(
                run_workers(loop.queue, loop.controller.reconcile, loop.controller.workers)
                for loop in self.loops.values()
            )
        )

    async def _shutdown(self) -> None:
        for informer in self.informers.started_here():
            informer.stop()
        self.snapshots.stop()
        await self.events.close()
        if self.elector is not None:
            if not self.lost_leadership:  # a lost Lease must run out: writes may be in flight
                await self.elector.release()
            self.elector.kube.close()
        await self.scraper.close()
        self.kube.close()


async def serve(make: Callable[[], Manager]) -> None:
    """Run until SIGTERM/SIGINT, then shut down gracefully.

    A lost Lease ends only a term: the Manager that led is shut down with everything it held in
    memory (caches, own writes, pods it made), and a fresh one from ``make`` (a new candidate
    identity) stands by for the Lease again, as a restarted process would, but without the
    kubelet's crash-loop back-off, which after a few control-plane outages left no standby
    ready to take over."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    current: list[Manager] = []

    def stop() -> None:
        stopping.set()
        for manager in current:
            manager.stop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop)
    while not stopping.is_set():
        manager = make()
        current[:] = [manager]
        await manager.run()
        if not manager.lost_leadership:
            break
        log.warning("standing by for the Lease again")
