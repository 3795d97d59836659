"""The controller process: informers, one work queue per reconciler, bounded workers, leader
election, and the metrics endpoint.

Start-up: become leader (a Lease; a standby replica waits here), start informers, wait for
their caches, then run each reconciler's workers off its own queue (a key is only ever
"namespace/name" of that reconciler's kind). Watches only enqueue keys:

- DataVolumes: a DataVolume maps to itself (ahead of the queue while it has no status: its
  first reconcile creates the claim and the worker pod), a PVC or importer Pod to the
  DataVolume that controls it (or that it was created for), and a StorageClass/StorageProfile/
  CDIConfig change to every DataVolume still waiting for its claim;
- StorageProfiles: a StorageClass or a StorageProfile maps to the profile of that name;
- CDIConfig: any StorageClass or CDIConfig change maps to the singleton ``config``; a CDIConfig
  change also sets the process's log level from ``logVerbosity`` (``cdi.lifecycle``);
- populators (one loop per source kind: import, upload, clone): a claim whose ``dataSourceRef``
  names that kind maps to itself, its prime claim and importer pods to it, an upload server
  pod through the prime that owns it (``cdi.controller.populators``).
- DataImportCrons: a cron maps to itself, and its poller pod, imports (DataVolumes) and
  DataSource map to it by their ``cdi.kubevirt.io/dataImportCron`` label.
- VolumeSnapshots and their classes, watched only once the cluster serves the snapshot API
  (``cdi.controller.snapshotwatch``, outside the cache-sync wait): a snapshot maps to the
  DataVolume a temporary one was made for, and to the DataVolumes and DataSources naming it;
  a class to every StorageProfile and to the DataVolumes still waiting for a claim.

Events of every reconciler go through one ``EventQueue`` (``cdi.kube.events``), written by a
background task, so no reconcile waits for an event's round trip. Under a burst of new
DataVolumes (``WorkQueue.urgent``) their first reconciles go first: follow-up reconciles are
limited to a quarter of the workers and events wait (at most 5 s) until the burst is served.

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
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from cdi.api.constants import (
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_SELECTED_NODE,
    CDICONFIG_NAME,
    KIND_DATAVOLUME,
    LABEL_COMPONENT,
)
from cdi.controller.cdiconfig import CDIConfigReconciler
from cdi.controller.dataimportcron import CronSettings, DataImportCronReconciler
from cdi.controller.dataimportcron_desired import DATAIMPORTCRONS, LABEL_CRON
from cdi.controller.datasource import DataSourceReconciler, keys_naming
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
from cdi.controller.metrics import ControllerMetrics, Sources, cron_view, serve_metrics
from cdi.controller.populators import claim_target_key, worker_pod_target_key
from cdi.controller.populators.clone import ClonePopulator
from cdi.controller.populators.handover import PrimePopulator
from cdi.controller.populators.import_ import ImportPopulator
from cdi.controller.populators.upload import UploadPopulator
from cdi.controller.progress import HttpScraper
from cdi.controller.proxycreds import keep_proxy_credentials
from cdi.controller.seal import Seal
from cdi.controller.snapshotwatch import SnapshotWatch, datavolume_keys
from cdi.controller.storageprofile import StorageProfileReconciler
from cdi.controller.uploadpvc import UploadPVCReconciler, is_upload_target, owned_by_datavolume
from cdi.kube.client import (
    CDI_CONFIGS,
    DATA_SOURCES,
    DATAVOLUMES,
    PODS,
    PVCS,
    STORAGE_CLASSES,
    STORAGE_PROFILES,
    AsyncKube,
    Kube,
    object_key,
)
from cdi.kube.events import EventQueue, EventRecorder
from cdi.kube.informer import Informer, wait_all_synced
from cdi.kube.informer_slim import SLIM_PAGE, Slim, kubevirt_and
from cdi.kube.leader import LeaderConfig, LeaderElector, LeadershipLost
from cdi.kube.workqueue import Backoff, Reconcile, WorkQueue, run_workers
from cdi.lifecycle import LogVerbosity
from cdi.render.clone import ANN_CLONE_OF, ANN_CLONE_REQUEST
from cdi.render.prime import is_prime
from cdi.render.upload_pod import UPLOAD_COMPONENT, upload_pod_name

log = logging.getLogger(__name__)
KIND_PVC = "PersistentVolumeClaim"
# The worker pods the controller follows: importers and upload servers.
WORKER_PODS = f"{LABEL_COMPONENT} in (importer,{UPLOAD_COMPONENT})"


def is_upload_pod(pod: dict[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_COMPONENT) == UPLOAD_COMPONENT


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
    config_recheck: float = 60.0
    # HMAC key of the signed requester record (cdi.api.requester.trusted_requester), from
    # --requester-key-secret / --requester-key-file; None: no record is trusted.
    requester_key: bytes | None = None
    # --log-level: what the process logs while CDIConfig logVerbosity is unset
    log_level: int = logging.INFO


@dataclass(frozen=True)
class Loop:
    """One reconciler: its queue, its (timed) reconcile function and how many workers."""

    name: str
    queue: WorkQueue
    reconcile: Reconcile
    workers: int

    def enqueue(self, key: str | None, *, first: bool = False) -> None:
        if key:
            self.queue.add(key, first=first)


def new_queue(follow_ups_while_urgent: int | None = None) -> WorkQueue:
    return WorkQueue(Backoff(base=0.1, cap=30.0), follow_ups_while_urgent=follow_ups_while_urgent)


def owner_key(obj: dict[str, Any]) -> str | None:
    """The DataVolume key a PVC or Pod belongs to, or None. An upload server pod is owned by
    its PVC, which has its DataVolume's name (or is a plain PVC: the upload PVC loop's key)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in (KIND_DATAVOLUME, KIND_PVC):
            return f"{ns}/{ref.get('name')}"
    if (meta.get("annotations") or {}).get(ANN_CREATED_FOR_DATAVOLUME):
        return f"{ns}/{meta.get('name')}"  # an adopted claim has its DataVolume's name
    return None


def is_new(dv: dict[str, Any]) -> bool:
    """A DataVolume the controller has not written a status to yet."""
    return not (dv.get("status") or {}).get("phase")


def cron_key(obj: dict[str, Any]) -> str | None:
    """The DataImportCron a poller pod, import or DataSource belongs to, by its label."""
    meta = obj.get("metadata") or {}
    cron = (meta.get("labels") or {}).get(LABEL_CRON)
    return f"{meta.get('namespace')}/{cron}" if cron else None


# What the caches of tenant-written kinds keep (cdi.kube.informer_slim, security review N8):
# DataVolumes whole but bounded (their labels and annotations are copied to the claim; the
# reconciler reads a partial one fresh), claims and DataSources only the keys the controller
# reads of them, DataImportCrons only their keys (the reconciler GETs the cron).
CLAIM_KEYS = kubevirt_and({ANN_SELECTED_NODE, ANN_CLONE_REQUEST, ANN_CLONE_OF})


def controller_informers(kube: Kube, resync: float) -> dict[str, Informer]:
    slim = SLIM_PAGE  # objects per list page where tenants write the objects
    return {
        "dv": Informer(kube, DATAVOLUMES, resync=resync, transform=Slim(), page_size=slim),
        "pvc": Informer(kube, PVCS, resync=resync, transform=Slim(CLAIM_KEYS), page_size=slim),
        "pod": Informer(kube, PODS, label_selector=WORKER_PODS, resync=resync),
        "sc": Informer(kube, STORAGE_CLASSES, resync=resync),
        "profile": Informer(kube, STORAGE_PROFILES, resync=resync),
        "config": Informer(kube, CDI_CONFIGS, resync=resync),
        "cron": Informer(kube, DATAIMPORTCRONS, resync=resync, transform=cron_view, page_size=slim),
        "ds": Informer(
            kube, DATA_SOURCES, resync=resync, transform=Slim(CLAIM_KEYS), page_size=slim
        ),
    }


class Manager:
    def __init__(self, kube: Kube, config: ManagerConfig, identity: str = "cdi-controller"):
        self.config = config
        self.elector: LeaderElector | None = None
        if config.leader:
            # the Lease's requests: not fenced, and two threads of their own so a renewal never
            # waits behind a burst of reconciles; everything else writes only while leading
            self.elector = LeaderElector(AsyncKube(kube, max_threads=2), config.leader)
            kube = kube.fenced(self.elector.fence)
        self.kube = AsyncKube(kube)
        self.informers = controller_informers(kube, config.resync)
        self.snapshots = SnapshotWatch(kube, self.kube, config.resync, config.config_recheck)
        self.scraper = HttpScraper()
        # every recorder's events, written off the reconciles, after new DataVolumes' claims
        # and pods while a burst of them waits (bounded delay)
        self.events = EventQueue(self.kube, busy=self._burst)
        self.metrics = ControllerMetrics(
            Sources(
                self.informers["dv"],
                self.informers["sc"],
                self.informers["profile"],
                self.informers["cron"],
                ready=lambda: self._ready,
            )
        )
        self.loops = self._loops(identity)
        self.verbosity = LogVerbosity(flag_level=config.log_level)
        self._metrics_runner: web.AppRunner | None = None
        self._ready = False  # leading with synced caches (kubevirt_cdi_cr_ready)
        self._stop = asyncio.Event()
        self.lost_leadership = False

    def _burst(self) -> bool:
        """New DataVolumes are waiting for (or in) their first reconcile."""
        return self.loops["datavolume"].queue.urgent > 0

    def _recorder(self, component: str, identity: str) -> EventRecorder:
        return EventRecorder(self.kube, component, identity, self.events)

    def _loops(self, identity: str) -> dict[str, Loop]:
        i, cfg = self.informers, self.config
        datavolumes = DataVolumeReconciler(
            self.kube,
            Caches(
                pods=i["pod"],
                storage_classes=i["sc"],
                storage_profiles=i["profile"],
                cdi_configs=i["config"],
                datavolumes=i["dv"],
                claims=i["pvc"],
            ),
            self._recorder("datavolume-controller", identity),
            self.scraper,
            # the clone flavour checks the webhook's signed requester record with this key
            dataclasses.replace(cfg.controller, requester_key=cfg.requester_key),
            burst=lambda: self.loops["datavolume"].queue.first_waiting > 0,
        )
        self.datavolumes = datavolumes
        profiles = StorageProfileReconciler(self.kube, utc_now)
        cdi_config = CDIConfigReconciler(self.kube, i["sc"], cfg.namespace, cfg.config_recheck)
        crons = DataImportCronReconciler(
            self.kube,
            CronSettings(
                cfg.controller.importer_image,
                cfg.controller.pull_policy,
                cfg.controller.cluster_cidrs,
            ),
            i["dv"],
        )
        # seals the records that authorize acts beyond a tenant's reach (cdi.controller.seal)
        seal = Seal.from_shared_key(cfg.requester_key)
        deps = FlavourDeps(self.kube, datavolumes.events, self.scraper, seal=seal)
        uploads = UploadPVCReconciler(
            self.kube,
            UploadWorker(deps, cfg.controller.upload),
            self._recorder("upload-controller", identity),
            i["sc"],
            datavolumes.cdi_config,
        )
        populator = ImportPopulator(
            self.kube,
            i["pod"],
            i["sc"],
            datavolumes.cdi_config,
            self._recorder("import-populator", identity),
            seal,
            ImportFlavour(deps, import_settings(cfg.controller)),
        )
        upload_populator = UploadPopulator(
            self.kube,
            i["sc"],
            datavolumes.cdi_config,
            self._recorder("upload-populator", identity),
            seal,
            UploadWorker(deps, cfg.controller.upload),
        )
        clone_populator = ClonePopulator(
            self.kube,
            i["sc"],
            datavolumes.cdi_config,
            self._recorder("clone-populator", identity),
            seal,
        )
        self.populators: dict[str, PrimePopulator] = {
            "populator": populator,
            "populator-upload": upload_populator,
            "populator-clone": clone_populator,
        }
        # a source in another namespace is read only for a creator the webhook signed (N7)
        datasources = DataSourceReconciler(self.kube, utc_now, cfg.requester_key)
        reconcilers: list[tuple[str, Reconcile, int]] = [
            ("datavolume", datavolumes.reconcile, cfg.workers),
            ("uploadpvc", uploads.reconcile, 1),
            ("populator", populator.reconcile, cfg.workers),
            ("populator-upload", upload_populator.reconcile, 1),
            ("populator-clone", clone_populator.reconcile, 1),
            ("dataimportcron", crons.reconcile, 1),
            ("storageprofile", profiles.reconcile, 1),
            ("cdiconfig", cdi_config.reconcile, 1),
            ("datasource", datasources.reconcile, 1),
        ]
        # a burst of new DataVolumes: their first reconciles get the workers, follow-ups a
        # quarter of them (WorkQueue.urgent)
        limits = {"datavolume": max(1, cfg.workers // 4)}
        return {
            name: Loop(name, new_queue(limits.get(name)), self.metrics.timed(name, fn), workers)
            for name, fn, workers in reconcilers
        }

    def _wire(self) -> None:
        dvs, profiles, config = (
            self.loops[n] for n in ("datavolume", "storageprofile", "cdiconfig")
        )
        own_dvs, own_claims = self.datavolumes.own_dvs, self.datavolumes.own_claims
        # a DataVolume with no status yet has never been reconciled: its claim and worker pod
        # come first (WorkQueue: ahead of the status follow-ups of DataVolumes under way); the
        # echo of the reconciler's own status write or claim create triggers nothing
        self.informers["dv"].add_handler(
            lambda o: None if own_dvs.echoes(o) else dvs.enqueue(object_key(o), first=is_new(o))
        )
        claims = self.informers["pvc"]

        def claim_changed(obj: dict[str, Any]) -> None:
            if claims.get(object_key(obj)) is None:
                own_claims.gone(obj)  # deleted: our own last write of it no longer stands in
            elif own_claims.echoes(obj):
                return
            dvs.enqueue(owner_key(obj))

        claims.add_handler(claim_changed)
        self.informers["pod"].add_handler(lambda o: dvs.enqueue(owner_key(o)))
        uploads = self.loops["uploadpvc"]
        self.informers["pvc"].add_handler(lambda o: uploads.enqueue(self._upload_key(o)))
        self.informers["pod"].add_handler(
            lambda o: uploads.enqueue(owner_key(o) if is_upload_pod(o) else None)
        )
        for name, populator in self.populators.items():
            self._wire_populator(self.loops[name], populator.kinds)
        for name in ("sc", "profile"):
            self.informers[name].add_handler(lambda o: profiles.enqueue(object_key(o)))
        for name in ("sc", "config"):
            self.informers[name].add_handler(lambda _o: config.enqueue(CDICONFIG_NAME))
        for name in ("sc", "profile", "config"):
            self.informers[name].add_handler(lambda _o: self._enqueue_waiting())
        # logVerbosity, from the cache (an event may be a deletion): while leading
        self.informers["config"].add_handler(
            lambda _o: self.verbosity.apply(self.datavolumes.cdi_config())
        )
        crons = self.loops["dataimportcron"]
        self.informers["cron"].add_handler(lambda o: crons.enqueue(object_key(o)))
        for name in ("dv", "pod", "ds"):
            self.informers[name].add_handler(lambda o: crons.enqueue(cron_key(o)))
        config.enqueue(CDICONFIG_NAME)  # created if missing, even before any event
        self._wire_datasources()
        self._wire_snapshots()

    def _wire_snapshots(self) -> None:
        dvs, profiles = self.loops["datavolume"], self.loops["storageprofile"]
        datasources, store = self.loops["datasource"], self.informers["ds"]

        def snapshot_changed(obj: dict[str, Any]) -> None:
            for key in datavolume_keys(obj, self.informers["dv"].items()):
                dvs.enqueue(key)
            meta = obj.get("metadata") or {}
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            for key in keys_naming(store.items(), "snapshot", ns, name):
                datasources.enqueue(key)

        def class_changed(_obj: dict[str, Any]) -> None:
            for sc in self.informers["sc"].items():
                profiles.enqueue(object_key(sc))
            self._enqueue_waiting()

        self.snapshots.on_snapshot(snapshot_changed)
        self.snapshots.on_class(class_changed)

    def _wire_populator(self, loop: Loop, kinds: tuple[str, ...]) -> None:
        """A target claim maps to itself, its prime to it; a worker pod to the claim that owns
        it: the target (importer pods) or, through the prime, the target (upload servers)."""
        claims = self.informers["pvc"]
        claims.add_handler(lambda o: loop.enqueue(claim_target_key(o, kinds)))
        self.informers["pod"].add_handler(
            lambda o: loop.enqueue(worker_pod_target_key(o, claims.get, kinds))
        )

    def _wire_datasources(self) -> None:
        """A DataSource maps to itself and to those naming it; a PVC or DataVolume to every
        DataSource naming a PVC of its name (a DataSource follows its DataVolume's phase)."""
        loop, store = self.loops["datasource"], self.informers["ds"]

        def naming(kind: str, obj: dict[str, Any]) -> None:
            meta = obj.get("metadata") or {}
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            for key in keys_naming(store.items(), kind, ns, name):
                loop.enqueue(key)

        def itself_and_referrers(obj: dict[str, Any]) -> None:
            loop.enqueue(object_key(obj))
            naming("dataSource", obj)

        store.add_handler(itself_and_referrers)
        for name in ("pvc", "dv"):
            self.informers[name].add_handler(lambda o: naming("pvc", o))

    def _upload_key(self, pvc: dict[str, Any]) -> str | None:
        """A plain PVC that is an upload target, or any PVC with an upload server that is no
        target any more or is being deleted (the server must go first)."""
        meta = pvc.get("metadata") or {}
        server = f"{meta.get('namespace')}/{upload_pod_name(str(meta.get('name')))}"
        has_server = self.informers["pod"].get(server) is not None
        if has_server and meta.get("deletionTimestamp"):
            return object_key(pvc)
        if owned_by_datavolume(pvc) or is_prime(pvc):
            return None
        return object_key(pvc) if is_upload_target(pvc) or has_server else None

    def _enqueue_waiting(self) -> None:
        dvs = self.loops["datavolume"]
        for dv in self.informers["dv"].items():
            if (dv.get("status") or {}).get("phase") in (None, "", "Pending"):
                dvs.enqueue(object_key(dv))

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Serve metrics from the start (a standby too, as controller-runtime does: its cache
        metrics are simply empty), lead, then reconcile until stopped."""
        if self.config.metrics_port is not None:
            self._metrics_runner = await serve_metrics(
                self.metrics, self.config.metrics_host, self.config.metrics_port
            )
        try:
            await self._lead_and_run()
        finally:
            if self._metrics_runner is not None:
                await self._metrics_runner.cleanup()

    async def _lead_and_run(self) -> None:
        if self.elector is not None:
            acquiring: asyncio.Task[Any] = asyncio.create_task(self.elector.acquire())
            stopping: asyncio.Task[Any] = asyncio.create_task(self._stop.wait())
            await asyncio.wait({acquiring, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not acquiring.done():
                acquiring.cancel()
                return
            stopping.cancel()
        self._wire()
        self.events.start()
        for informer in self.informers.values():
            informer.start()
        try:
            async with asyncio.timeout(self.config.sync_timeout):
                await wait_all_synced(list(self.informers.values()))
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
            keep_proxy_credentials(self.kube, self.config.controller.upload.namespace)
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
            *(run_workers(loop.queue, loop.reconcile, loop.workers) for loop in self.loops.values())
        )

    async def _shutdown(self) -> None:
        for informer in self.informers.values():
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
