"""The DataVolume reconciler: what every DataVolume shares, whichever flavour fills it.

``reconcile(key) -> Result`` is level-triggered: it reads the DataVolume from the informer
cache (seen through its own last status write, ``cdi.kube.own_writes``, so it does not fight
the cache's lag with 409s; a stale read still only costs a 409 and a retry, since the status
patch carries the resourceVersion read), the PVC from the claim cache too, seen through this
process's own claim writes (the import flavour's records, its pod UID records above all, go
through ``FlavourDeps.claims``, ``Flavour.claim_from_cache``; other flavours' claims are read
fresh: the upload and copy workers also serve other reconcilers, and a clone decides on claims
it does not write through it), or, when the claim cache has never seen it, not at all: it is
created straight away (a 409 says it exists after all, and it is read then). A guarded record
write over a stale cached claim costs a 409 and a retry in 0.5 s; an impostor verdict is
checked against a fresh GET before a pod is deleted (``ImportFlavour._recorded_now``). The
worker pods, storage classes and config from informer caches, picks the flavour from the
spec's source (``cdi.controller.flavours.table``: import, upload, clone from a PVC, a snapshot
or a DataSource; imageio and vddk map to ``Unsupported`` and are left alone), then takes at most
one step toward the goal and writes the status once:

1. no PVC: render it (``cdi.render.pvc``), let a flavour that shapes its claim reshape it
   first (``Flavour.before_claim``; clone: picks size, strategy and ``dataSource``, and may
   create no claim yet), and create it, owned by the DataVolume, with the
   flavour's first record on it (the import flavour's first pod name), so the worker pod can
   follow in the same pass without another write first; a PVC that
   exists and is not ours is adopted only when the DataVolume allows it
   (``allowClaimAdoption``; an adopted PVC gets no owner reference, so it outlives the DV).
   Volumes that already hold the data (``cdi.controller.static_volume``): a ``prePopulated``
   DataVolume creates no claim and waits for the user's; a claim ``populatedFor`` it (or a
   ``prePopulated`` DataVolume's claim) is adopted, owned and done without a worker; with
   ``checkStaticVolume`` the claim is made for the Available volumes pre-bound to it and
   succeeds, their data kept, once bound to one of them;
2. PVC not bound on a WaitForFirstConsumer class: wait (WaitForFirstConsumer) unless the DV
   asks for immediate binding, in which case the worker pod is the first consumer;
3. a claim that names a ``VolumeImportSource`` or ``VolumeUploadSource`` (created with it on
   CSI storage, or when ``storage.usePopulator`` asks) is the populator's to fill
   (``cdi.controller.populators``): its status is read from the claim, nothing is run here;
4. otherwise the flavour's ``sync`` takes one step of its work (import: create the attempt's
   importer pod, follow it, let the failure policy decide; upload: an upload server on the
   claim; clone: a copy's next step, a bind, a volume move) and says what it saw;
5. once the outcome is recorded on the PVC, the flavour's ``finish`` cleans up.

The status is the pure ``compute_status`` of what was seen, with the flavour's phases. Every
child name is deterministic and every create treats 409 AlreadyExists as "already done", so a
controller killed at any point and restarted neither duplicates pods nor loses progress.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig, StorageProfile, claim_adoption_allowed
from cdi.api.constants import (
    ANN_ALLOW_CLAIM_ADOPTION,
    ANN_CHECK_STATIC_VOLUME,
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_IMMEDIATE_BINDING,
    ANN_PERSISTENT_VOLUME_LIST,
    ANN_POPULATED_FOR,
    CDICONFIG_NAME,
    GATE_CLAIM_ADOPTION,
    KIND_DATAVOLUME,
    ConditionReason,
    ConditionType,
    Phase,
)
from cdi.api.termination import REASON_COMPLETED
from cdi.api.types import DataVolume, ObjectMeta
from cdi.controller.flavours import (
    Claim,
    Flavour,
    FlavourDeps,
    FlavourTable,
    PhaseEvent,
    Unsupported,
    select_flavour,
)
from cdi.controller.flavours.import_ import ImportSettings
from cdi.controller.flavours.table import standard_flavours
from cdi.controller.flavours.upload import UploadSettings
from cdi.controller.parsed import ParseCache
from cdi.controller.pods import owned_pods
from cdi.controller.policy import FailurePolicy
from cdi.controller.populators.datavolume import (
    POPULATED_KINDS,
    populated_claim,
    population_view,
)
from cdi.controller.progress import Scraper
from cdi.controller.proxy_relay import RelaySettings
from cdi.controller.record import OUTCOME_SUCCEEDED, ClaimRecord
from cdi.controller.refusals import POD_REFUSALS, QUOTA_RETRY, refused_claim
from cdi.controller.snapshotwatch import datavolume_keys
from cdi.controller.static_volume import (
    StaticState,
    listed_annotation,
    listed_volumes,
    populated_for,
    pre_populated,
    static_state,
    static_volumes,
)
from cdi.controller.status import ClaimProblem, View, compute_status
from cdi.kube.client import (
    CDI_CONFIGS,
    DATAVOLUMES,
    JSON,
    PODS,
    PVCS,
    PVS,
    STORAGE_CLASSES,
    STORAGE_PROFILES,
    VOLUME_SNAPSHOT_CLASSES,
    VOLUME_SNAPSHOTS,
    AsyncKube,
    object_key,
    split_key,
)
from cdi.kube.errors import Conflict, QuotaExceeded
from cdi.kube.events import NORMAL, WARNING, EventRecorder
from cdi.kube.informer_slim import is_partial
from cdi.kube.own_writes import OwnWrites
from cdi.kube.watches import For, Maps, Owns, Watches, one
from cdi.kube.workqueue import Result
from cdi.render import RenderError
from cdi.render.owner import datavolume_reference
from cdi.render.prime import PVC_KIND, populator_kind
from cdi.render.pvc import render_pvc

log = logging.getLogger(__name__)

ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
ANN_DEFAULT_VIRT_CLASS = "storageclass.kubevirt.io/is-default-virt-class"

CLAIM_EVENTS: Mapping[str, PhaseEvent] = {  # the phases every flavour shares
    Phase.PENDING: PhaseEvent(NORMAL, ConditionReason.PENDING, "PVC {claim} Pending"),
    Phase.WAIT_FOR_FIRST_CONSUMER: PhaseEvent(
        NORMAL, "WaitForFirstConsumer", "PVC {claim} waits for its first consumer"
    ),
    Phase.PVC_BOUND: PhaseEvent(NORMAL, ConditionReason.BOUND, "PVC {claim} Bound"),
}


class Store(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def items(self) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class Caches:
    pods: Store  # worker pods (today the importer's: label cdi.kubevirt.io=importer)
    storage_classes: Store
    storage_profiles: Store
    cdi_configs: Store
    # None: read DataVolumes, and look for claims, with GETs (a reconciler without informers)
    datavolumes: Store | None = None
    claims: Store | None = None


@dataclass(frozen=True)
class ControllerConfig:
    importer_image: str = "quay.io/cdi-py/cdi-importer:latest"
    pull_policy: str = "IfNotPresent"
    policy: FailurePolicy = field(default_factory=FailurePolicy)
    progress_interval: float = 2.0
    cluster_cidrs: tuple[str, ...] = ()  # pod/service/node ranges imports may not reach
    requester_key: bytes | None = None  # checks the webhook's requester record (clones)
    upload: UploadSettings = field(default_factory=UploadSettings)


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def import_settings(config: ControllerConfig) -> ImportSettings:
    return ImportSettings(
        image=config.importer_image,
        pull_policy=config.pull_policy,
        policy=config.policy,
        progress_interval=config.progress_interval,
        relay=RelaySettings(namespace=config.upload.namespace),
    )


class DataVolumeReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        caches: Caches,
        events: EventRecorder,
        scraper: Scraper,
        config: ControllerConfig,
        clock: Callable[[], float] = time.time,
        flavours: FlavourTable | None = None,
        own_claims: OwnWrites | None = None,
        burst: Callable[[], bool] | None = None,
    ) -> None:
        self.kube = kube
        self.caches = caches
        self.events = events
        self.config = config
        # claim writes (creates here, records by the flavours) the claim cache may not show
        # yet; an injected ``flavours`` table shares it through its ``FlavourDeps.claims``
        self.own_claims = own_claims if own_claims is not None else OwnWrites()
        if flavours is None:
            deps = FlavourDeps(
                kube,
                events,
                scraper,
                clock,
                self.own_claims,
                storage_class=caches.storage_classes.get,
                worker_pods=caches.pods.items,
            )
            if burst is not None:  # other new DataVolumes wait (the manager's queue says)
                deps = dataclasses.replace(deps, burst=burst)
            flavours = standard_flavours(
                deps, import_settings(config), config.upload, config.requester_key
            )
        self.flavours = flavours
        self.own_dvs = OwnWrites()  # status writes the DataVolume cache may not show yet
        # new DataVolumes wait for their first reconcile (the manager's queue says): a first
        # reconcile then creates the claim and the pod and leaves its status write to the
        # follow-up; the phase it would have written is kept here (key -> phase), so the
        # follow-up still emits that phase's event if it writes a later one
        self.burst = burst or (lambda: False)
        self.deferred_phases: dict[str, str] = {}
        # cached objects parsed once per resourceVersion (cdi.controller.parsed)
        self._datavolume = ParseCache(DataVolume.from_dict)
        self._cdi_config = ParseCache(lambda raw: self._config_of(CDIConfig.from_dict(raw)))
        self._storage_profile = ParseCache(StorageProfile.from_dict)

    async def reconcile(self, key: str) -> Result:
        namespace, name = split_key(key)
        obj = await self._read(key)
        if obj is None:
            # deleted: owner references let the garbage collector clean up, and flavours
            # that made objects in other namespaces undo them
            self.own_dvs.forget(key)
            self.own_claims.forget(key)
            self.deferred_phases.pop(key, None)
            for flavour in {id(f): f for f in self.flavours.values()}.values():
                if not isinstance(flavour, Unsupported):
                    await flavour.forget(namespace or "", name)
            return Result()
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        try:
            dv = self._datavolume(obj)
        except SchemaError as exc:
            log.warning("%s: unparsable DataVolume: %s", key, exc)
            return Result()
        flavour = select_flavour(dv, self.flavours)
        if isinstance(flavour, Unsupported):
            log.info("%s: left alone: %s: %s", key, flavour.source, flavour.message)
            return Result()
        return await Step(self, flavour, dv, obj).run()

    async def _read(self, key: str) -> JSON | None:
        store = self.caches.datavolumes
        if store is not None:
            cached = store.get(key)
            if cached is None:
                # gone from the cache: deleted (this reconciler never creates DataVolumes, so
                # the cache saw it before any write of ours). A status write of ours must not
                # bring it back: that made claims and pods for a deleted DataVolume until the
                # write's memory expired
                return None
            seen = self.own_dvs.freshest(key, cached)
            if not is_partial(seen):
                return seen
            # the cache dropped labels or annotations this DataVolume has (an oversized one,
            # cdi.kube.informer_slim): its claim is rendered from all of them, so read it whole
        namespace, name = split_key(key)
        return await self.kube.get_or_none(DATAVOLUMES, name, namespace)

    # -- cluster lookups -------------------------------------------------------------------
    def cdi_config(self) -> CDIConfig:
        raw = self.caches.cdi_configs.get(CDICONFIG_NAME)
        try:
            return self._cdi_config(raw) if raw else self._config_of(CDIConfig())
        except SchemaError:
            return self._config_of(CDIConfig())

    def _config_of(self, config: CDIConfig) -> CDIConfig:
        return config.with_cluster_cidrs(self.config.cluster_cidrs)

    def default_storage_class(self) -> str | None:
        classes = self.caches.storage_classes.items()
        for ann in (ANN_DEFAULT_VIRT_CLASS, ANN_DEFAULT_CLASS):
            for sc in sorted(classes, key=lambda s: str(s["metadata"]["name"])):
                if (sc["metadata"].get("annotations") or {}).get(ann) == "true":
                    return str(sc["metadata"]["name"])
        return None

    def storage_profile(self, dv: DataVolume) -> StorageProfile | None:
        claim = dv.spec.claim
        name = (claim.storage_class_name if claim else None) or self.default_storage_class()
        if not name:
            return None
        raw = self.caches.storage_profiles.get(name)
        try:
            if raw:
                return self._storage_profile(raw)
        except SchemaError:
            pass
        return StorageProfile(metadata=ObjectMeta(name=name))

    def binds_immediately(self, pvc: Mapping[str, Any]) -> bool:
        """The claim's class is known (cached) and binds Immediately (the default mode)."""
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        sc = self.caches.storage_classes.get(str(sc_name)) if sc_name else None
        return bool(sc) and (sc or {}).get("volumeBindingMode", "Immediate") == "Immediate"

    def waits_for_consumer(self, pvc: Mapping[str, Any]) -> bool:
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        sc = self.caches.storage_classes.get(str(sc_name)) if sc_name else None
        return bool(sc and sc.get("volumeBindingMode") == "WaitForFirstConsumer")

    # -- what wakes it (the manager wires it: cdi.kube.watches) ----------------------------
    def heard_claim(self, claim: JSON) -> bool:
        """A claim event is news unless it is the very version a write of ours returned; a
        deleted claim always is (and our last write of it no longer stands in for it)."""
        claims = self.caches.claims
        if claims is not None and claims.get(object_key(claim)) is None:
            self.own_claims.gone(claim)
            return True
        return not self.own_claims.echoes(claim)

    def watches(self, datavolumes: Store) -> Watches:
        """A DataVolume maps to itself, ahead of the queue while it has no status (its first
        reconcile creates the claim and the worker pod; the echo of the reconciler's own status
        write triggers nothing); a PVC to the DataVolume it was created for, a worker pod to
        the DataVolume or claim (of the DataVolume's name) that controls it; a StorageClass,
        StorageProfile, CDIConfig or VolumeSnapshotClass change to every DataVolume still
        waiting for its claim; a VolumeSnapshot to the DataVolume a temporary one was made for
        and those naming it (``cdi.controller.snapshotwatch``)."""

        def still_waiting(_obj: JSON) -> list[str]:
            return waiting(datavolumes.items())

        def claim_key(claim: JSON) -> str | None:
            """The owner's key; else the DataVolume of the claim's name, if there is one (a
            ``prePopulated`` DataVolume waits for the user's claim, which names no one)."""
            key = owner_key(claim)
            if key is None and datavolumes.get(object_key(claim)) is not None:
                return object_key(claim)
            return key

        return Watches(
            (
                For(DATAVOLUMES, first=is_new, where=lambda dv: not self.own_dvs.echoes(dv)),
                Maps(PVCS, one(claim_key), where=self.heard_claim),
                Owns(PODS, (KIND_DATAVOLUME, PVC_KIND)),
                *(Maps(r, still_waiting) for r in (STORAGE_CLASSES, STORAGE_PROFILES, CDI_CONFIGS)),
                Maps(VOLUME_SNAPSHOTS, lambda snap: datavolume_keys(snap, datavolumes.items())),
                Maps(VOLUME_SNAPSHOT_CLASSES, still_waiting),
            )
        )


def is_new(dv: Mapping[str, Any]) -> bool:
    """A DataVolume the controller has not written a status to yet."""
    return not (dv.get("status") or {}).get("phase")


def waiting(datavolumes: Iterable[JSON]) -> list[str]:
    """The DataVolumes still waiting for their claim (no phase yet, or Pending): what a new
    class, profile, config or snapshot class may unblock."""
    pending = (None, "", "Pending")
    return [
        object_key(dv) for dv in datavolumes if (dv.get("status") or {}).get("phase") in pending
    ]


def owner_key(obj: Mapping[str, Any]) -> str | None:
    """The DataVolume key a PVC belongs to, or None: its controller owner (the DataVolume, or
    for a prime the claim, which has the DataVolume's name), or, for an adopted claim (no owner
    reference), its own name when it says whom it was created for, or the DataVolume a user's
    claim says it is ``populatedFor``. Pods map by their controller owner alone (``Owns``)."""
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in (KIND_DATAVOLUME, PVC_KIND):
            return f"{ns}/{ref.get('name')}"
    annotations = meta.get("annotations") or {}
    if annotations.get(ANN_CREATED_FOR_DATAVOLUME):
        return f"{ns}/{meta.get('name')}"
    if annotations.get(ANN_POPULATED_FOR):  # a user's pre-populated claim (static_volume)
        return f"{ns}/{annotations[ANN_POPULATED_FOR]}"
    return None


class Step:
    """One reconcile of one DataVolume: the state it read and the status it will write."""

    def __init__(
        self, r: DataVolumeReconciler, flavour: Flavour, dv: DataVolume, obj: dict[str, Any]
    ) -> None:
        self.r = r
        self.flavour = flavour
        self.dv = dv
        self.obj = obj
        self.view = View(claim_name=dv.name, phases=flavour.phases)
        self.cached_claim = False  # the claim was read from the cache (seen through own writes)
        self.created_claim = False  # this reconcile created the claim

    async def run(self) -> Result:
        try:
            result = await self._advance()
        except Conflict:
            if not self.cached_claim:
                raise
            # a guarded claim write over a cached version the server had moved past: the
            # decision rested on a stale record, so it is not taken; again once caught up
            log.debug("%s/%s: claim conflict; requeued", self.dv.namespace, self.dv.name)
            return Result(requeue_after=0.5)
        if self._defer_status():
            return result
        try:
            await self._write_status()
        except Conflict:  # read from a cache behind the server: again, once it caught up
            log.debug("%s/%s: status conflict; requeued", self.dv.namespace, self.dv.name)
            return Result(requeue_after=0.5)
        return result

    def _see(self, **changes: Any) -> None:
        self.view = dataclasses.replace(self.view, **changes)

    # -- the steps -------------------------------------------------------------------------
    async def _advance(self) -> Result:
        dv, r = self.dv, self.r
        pvc, created = await self._read_claim(), False
        if pvc is None and pre_populated(dv):
            return Result()  # the user makes the claim; it maps here when it appears
        if pvc is None:
            try:
                pvc, result = await self._create_pvc()
            except Conflict:  # it exists: the claim cache had not seen it yet
                pvc = await r.kube.get_or_none(PVCS, dv.name, dv.namespace)
                if pvc is None:
                    return Result(requeue_after=1.0)
            else:
                if pvc is None or not self._starts_unbound(pvc):
                    return result
                created = self.created_claim = True  # go on with the claim the create returned
        if not created and not self._ours(pvc):
            adopted = await self._adopt(pvc)
            if adopted is None:
                return Result(requeue_after=30.0)
            pvc = adopted
        listed = listed_volumes(pvc)
        if listed is not None:  # a static volume: bound to one of these, nothing to fill
            return await self._settle_static(pvc, listed)
        record = ClaimRecord.from_pvc(pvc)
        phase = (pvc.get("status") or {}).get("phase") or "Pending"
        self._see(pvc_phase=phase, record=record)
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            deleting = f'Resource "{dv.name}" marked for deletion'
            self._see(problem=ClaimProblem(ConditionReason.PENDING, deleting))
            return Result(requeue_after=5.0)
        if populator_kind(pvc) in POPULATED_KINDS:  # a populator fills it
            self.view = population_view(self.view, pvc, r.waits_for_consumer(pvc))
            return Result()
        pods = owned_pods(r.caches.pods.items(), dv.uid)
        claim = Claim(dv, self.obj, pvc, record, pods, r.cdi_config())
        if record.done:
            await self.flavour.finish(claim)
            return Result()
        if phase == "Lost":
            return Result()
        waiting = r.waits_for_consumer(pvc)
        immediate = ANN_IMMEDIATE_BINDING in dv.annotations
        early = self.flavour.fills_unbound or self._starts_unbound(pvc)
        if phase != "Bound" and not (waiting and immediate) and not early:
            self._see(waiting_for_consumer=waiting)
            return Result()
        self.view, result = await self.flavour.sync(claim, self.view)
        return result

    async def _read_claim(self) -> JSON | None:
        """The claim; None without a request when the claim cache (and this process's own
        writes) have never seen it: then the create that follows says 409 if it exists after
        all. The import flavour's claim is the cached one seen through this process's own
        writes (its UID records above all); any other flavour's is read fresh (the clone
        flavours decide on claims they do not write through ``FlavourDeps.claims``)."""
        dv, r = self.dv, self.r
        cache, key = r.caches.claims, f"{dv.namespace}/{dv.name}"
        if cache is not None:
            seen = r.own_claims.freshest(key, cache.get(key))
            if seen is None:
                return None
            if self.flavour.claim_from_cache and not is_partial(seen):
                self.cached_claim = True
                return seen
        return await r.kube.get_or_none(PVCS, dv.name, dv.namespace)

    def _ours(self, pvc: Mapping[str, Any]) -> bool:
        meta = pvc.get("metadata") or {}
        refs = meta.get("ownerReferences") or []
        if any(ref.get("controller") and ref.get("uid") == self.dv.uid for ref in refs):
            return True
        return (meta.get("annotations") or {}).get(ANN_CREATED_FOR_DATAVOLUME) == self.dv.uid

    def _starts_unbound(self, pvc: Mapping[str, Any]) -> bool:
        """A worker pod (``pod_before_bind``: the importer) may be created before its claim is
        Bound when the claim's class binds Immediately: the scheduler holds the pod until the
        binder and provisioner are done, so the bind round trip overlaps the pod's creation
        (docs/controller.md)."""
        return (
            self.flavour.pod_before_bind
            and populator_kind(pvc) is None
            and self.r.binds_immediately(pvc)
        )

    def _render_pvc(self) -> dict[str, Any] | None:
        r = self.r
        try:
            return render_pvc(self.dv, r.storage_profile(self.dv), r.cdi_config())
        except RenderError as exc:
            self._see(problem=ClaimProblem(exc.reason, exc.message))
            return None

    async def _create_pvc(self) -> tuple[dict[str, Any] | None, Result]:
        """Create the claim; the created object, or None when there is none (yet) to go on
        with, and the result to return then."""
        desired = self._render_pvc()
        if desired is None:
            return None, Result(requeue_after=30.0)
        shaped, self.view, result = await self.flavour.before_claim(
            self.dv, self.obj, desired, self.view
        )
        if shaped is None:
            return None, result
        desired = shaped
        static = await self._static_volumes(desired)
        if static:  # pre-bound volumes hold the data: no populator, no worker's record
            desired["metadata"].setdefault("annotations", {}).update(listed_annotation(static))
        else:
            desired = await populated_claim(
                self.r.kube, self.dv, desired, self.r.caches.storage_classes
            )
            first = self.flavour.first_record(self.dv.name)
            if first and populator_kind(desired) is None:
                desired["metadata"].setdefault("annotations", {}).update(first)
        # a 409 (someone, or we before a restart, made it already) goes to the caller
        try:
            created = await self.r.kube.create(PVCS, desired, self.dv.namespace)
        except QuotaExceeded as exc:  # Pending until the quota admits it (cdi.controller.refusals)
            self._see(problem=refused_claim(exc))
            return None, Result(requeue_after=QUOTA_RETRY)
        self.r.own_claims.wrote(created)
        return created, Result(requeue_after=1.0)

    async def _static_volumes(self, desired: Mapping[str, Any]) -> list[str]:
        """With ``checkStaticVolume``: the Available volumes pre-bound to the claim that
        satisfy it (``cdi.controller.static_volume``); none without the annotation."""
        if ANN_CHECK_STATIC_VOLUME not in self.dv.annotations:
            return []
        pvs = await self.r.kube.list(PVS)
        return static_volumes(pvs.get("items") or [], desired)

    async def _settle_static(self, pvc: dict[str, Any], listed: list[str]) -> Result:
        """A claim made for static volumes: wait for the bind; bound to one of them, mark it
        populated and succeed (its data kept); bound to another, delete it to start again."""
        dv, r = self.dv, self.r
        phase = (pvc.get("status") or {}).get("phase") or "Pending"
        state = static_state(pvc, listed)
        if state is StaticState.WRONG_VOLUME:
            meta = pvc.get("metadata") or {}
            volume = (pvc.get("spec") or {}).get("volumeName")
            message = f"PVC {dv.name} bound to unexpected volume {volume}; recreating it"
            self._see(pvc_phase=phase, problem=ClaimProblem(ConditionReason.PENDING, message))
            await r.kube.delete_if_present(PVCS, dv.name, dv.namespace, uid=meta.get("uid"))
            return Result(requeue_after=1.0)
        if state is StaticState.WAITING:
            self._see(pvc_phase=phase)
            return Result()
        done = ClaimRecord(
            outcome=OUTCOME_SUCCEEDED, reason=REASON_COMPLETED, message="static volume"
        )
        annotations = {
            **done.annotations(),
            ANN_POPULATED_FOR: dv.name,
            ANN_PERSISTENT_VOLUME_LIST: None,
        }
        written = await r.kube.patch(
            PVCS, dv.name, {"metadata": {"annotations": annotations}}, dv.namespace
        )
        r.own_claims.wrote(written)
        self._see(pvc_phase=phase, record=ClaimRecord.from_pvc(written))
        return Result()

    async def _adopt_populated(self, pvc: dict[str, Any]) -> dict[str, Any] | None:
        """A claim that holds the DataVolume's data (``populatedFor``, or a ``prePopulated``
        DataVolume's claim): owned by the DataVolume from now on, as CDI adopts it, and its
        record done, so no worker ever runs on it. A claim another object controls stays
        theirs."""
        dv, r = self.dv, self.r
        meta = pvc.get("metadata") or {}
        refs = list(meta.get("ownerReferences") or [])
        if any(ref.get("controller") for ref in refs):
            msg = f'Resource "{dv.name}" already exists and is not managed by DataVolume'
            self._see(problem=ClaimProblem(ConditionReason.ERR_RESOURCE_EXISTS, msg))
            return None
        done = ClaimRecord(
            outcome=OUTCOME_SUCCEEDED, reason=REASON_COMPLETED, message="PVC pre-populated"
        )
        patch = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "ownerReferences": [*refs, datavolume_reference(dv)],
                "annotations": done.annotations(),
            }
        }
        adopted = await r.kube.patch(PVCS, dv.name, patch, dv.namespace)
        r.own_claims.wrote(adopted)
        return adopted

    async def _adopt(self, pvc: dict[str, Any]) -> dict[str, Any] | None:
        dv, r = self.dv, self.r
        if pre_populated(dv) or populated_for(pvc, dv):
            return await self._adopt_populated(pvc)
        # the webhook's rule; the gate read live from CDIConfig (the informer's copy)
        if not claim_adoption_allowed(
            dv.annotations.get(ANN_ALLOW_CLAIM_ADOPTION),
            lambda: r.cdi_config().gate(GATE_CLAIM_ADOPTION),
        ):
            msg = f'Resource "{dv.name}" already exists and is not managed by DataVolume'
            self._see(problem=ClaimProblem(ConditionReason.ERR_RESOURCE_EXISTS, msg))
            return None
        desired = self._render_pvc()
        if desired is None:
            return None
        annotations: dict[str, Any] = dict(desired["metadata"]["annotations"])
        # No owner reference: an adopted claim outlives its DataVolume.
        adopted = await r.kube.patch(
            PVCS, dv.name, {"metadata": {"annotations": annotations}}, dv.namespace
        )
        r.own_claims.wrote(adopted)
        return adopted

    # -- status ----------------------------------------------------------------------------
    async def _write_status(self) -> None:
        old = dict(self.obj.get("status") or {})
        new = compute_status(self.view, old, utc_now())
        if new == old:
            return
        meta = self.obj["metadata"]
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": new}
        written = await self.r.kube.patch(
            DATAVOLUMES, self.dv.name, patch, self.dv.namespace, sub="status"
        )
        self.r.own_dvs.wrote(written)
        deferred = self.r.deferred_phases.pop(self.key, None)
        if deferred and deferred not in (new.get("phase"), old.get("phase")):
            await self.r.events.emit(self.obj, *self._event_of(deferred))  # passed through
        if new.get("phase") != old.get("phase"):
            await self._phase_event(str(new["phase"]))
        await self._refusal_event(old)

    async def _refusal_event(self, old: Mapping[str, Any]) -> None:
        """A Warning event when a worker pod's create is refused (``cdi.controller.refusals``):
        once, when the Running condition takes the refusal's reason, not at every retry."""
        problem = self.view.pod_problem
        if problem is None or problem[0] not in POD_REFUSALS:
            return
        conditions = old.get("conditions") or []
        running: Mapping[str, Any] = next(
            (c for c in conditions if c.get("type") == ConditionType.RUNNING), {}
        )
        if running.get("reason") != problem[0]:
            await self.r.events.emit(self.obj, WARNING, *problem)

    def _defer_status(self) -> bool:
        """Under a burst, the first write of a DataVolume whose claim (and pod) this reconcile
        created is left to the follow-up (which the pod's watch event and the flavour's
        requeue bring): the other new DataVolumes' claims and pods go first. Only the phase
        is remembered, for its event."""
        if not (self.created_claim and not self.obj.get("status") and self.r.burst()):
            return False
        new = compute_status(self.view, {}, utc_now())
        if self.view.problem is None and new.get("phase"):
            self.r.deferred_phases[self.key] = str(new["phase"])
            return True
        return False

    @property
    def key(self) -> str:
        return f"{self.dv.namespace}/{self.dv.name}"

    def _event_of(self, phase: str) -> tuple[str, str, str]:
        """(type, reason, message) of the event for reaching ``phase`` without a problem."""
        view = self.view
        event = {**CLAIM_EVENTS, **self.flavour.events}.get(phase) or PhaseEvent(NORMAL, phase)
        message = event.message.format(claim=view.claim_name) or (
            f"{view.record.reason}: {view.record.message}" if view.record.reason else phase
        )
        return event.kind, event.reason, message

    async def _phase_event(self, phase: str) -> None:
        view = self.view
        if view.problem is not None:
            await self.r.events.emit(self.obj, WARNING, view.problem.reason, view.problem.message)
            return
        await self.r.events.emit(self.obj, *self._event_of(phase))
