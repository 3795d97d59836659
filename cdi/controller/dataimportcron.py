"""The DataImportCron reconciler: poll the source's identity (a tag's digest, a claim's UID, ...),
import each new one once, point the managed DataSource at the newest successful import (its
claim, or a VolumeSnapshot of it when the class's StorageProfile says
``dataImportCronSourceFormat: snapshot``), collect the old ones by ``lastUseTime``, and say so
in status, as CDI's ``dataimportcron-controller.go`` does (differences: ``docs/controller.md``,
"DataImportCron: CDI and here").

Level-triggered like the others: the key is the cron's ``namespace/name``; its poller pod, its
imports (DataVolumes, claims and snapshots labelled ``cdi.kubevirt.io/dataImportCron``) and its
DataSource map back to it by that label (``watches``; StorageProfiles and StorageClasses to the
crons importing into them), so tampering (the DataSource repointed or deleted, the last
import deleted) is repaired by the next reconcile, which simply makes the world match
``dataimportcron_desired`` again. A pvc source needs no pod: the controller reads the claim; one in
another namespace only once CDI's clone authorization allows the cron namespace's ``default``
ServiceAccount to clone it, and the import then carries a signed on-behalf record
(``cdi.api.onbehalf``) that the clone authorization checks again. The
poller pod is trusted only by the UID recorded on the cron when it was created, by the engine
every worker pod goes through (``cdi.controller.workerpod``), so a pod a tenant names like it
cannot choose the digest that gets imported: it is deleted by its UID, never read.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdi.api import onbehalf
from cdi.api.cloneauth import authorized, clone_checks, denial_message
from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME, ConditionReason
from cdi.api.errors import WorkerError
from cdi.controller import dataimportcron_desired as desired
from cdi.controller.dataimportcron_desired import (
    ANN_DESIRED_DIGEST,
    ANN_DESIRED_RELEASE,
    ANN_LAST_CRON_TIME,
    ANN_LAST_USE_TIME,
    ANN_NEXT_CRON_TIME,
    ANN_POLL_ERROR,
    ANN_POLLER_UID,
    ANN_RWO_FOR_CRON,
    ANN_SNAPSHOT_CLASS_FOR_CRON,
    ANN_STORAGE_CLASS,
    DATAIMPORTCRONS,
    FORMAT_SNAPSHOT,
    GC_NEVER,
    KIND_PVC,
    LABEL_CRON,
    Cron,
)
from cdi.controller.metrics import ANN_DEFAULT_CLASS, ANN_DEFAULT_VIRT_CLASS
from cdi.controller.policy import Outcome, pod_problem
from cdi.controller.registry_result import with_node_digest
from cdi.controller.source_reads import access_allowed
from cdi.controller.workerpod import Trust, assess, create_pod, remove_impostor
from cdi.kube.client import (
    CDI_CONFIGS,
    DATA_SOURCES,
    DATAVOLUMES,
    PODS,
    PVCS,
    STORAGE_CLASSES,
    STORAGE_PROFILES,
    VOLUME_SNAPSHOT_CLASSES,
    VOLUME_SNAPSHOTS,
    AsyncKube,
)
from cdi.kube.errors import Conflict, NotFound
from cdi.kube.watches import For, Maps, Watches, one
from cdi.kube.workqueue import Result
from cdi.render.clone_snapshot import choose_snapshot_class, ready
from cdi.render.importer_pod import ImporterPodConfig

log = logging.getLogger(__name__)
JSON = dict[str, Any]
POLL_RETRY = dt.timedelta(seconds=30)  # after a failed poll
WATCH_INTERVAL = 2.0  # while a poll, an import or a snapshot runs
# the profile asks for snapshots where the cluster serves no snapshot API (not a CDI reason)
NO_SNAPSHOT_API = (False, "SnapshotNotSupported", "The snapshot API is not served")


class Store(Protocol):
    def items(self) -> list[JSON]: ...


@dataclass(frozen=True)
class CronSettings:
    image: str
    pull_policy: str = "IfNotPresent"
    cluster_cidrs: tuple[str, ...] = ()


def cron_key(obj: Mapping[str, Any]) -> str | None:
    """The DataImportCron a poller pod, import or DataSource belongs to, by its label."""
    meta = obj.get("metadata") or {}
    cron = (meta.get("labels") or {}).get(LABEL_CRON)
    return f"{meta.get('namespace')}/{cron}" if cron else None


WATCHES = Watches(
    (
        For(DATAIMPORTCRONS),
        *(
            Maps(r, one(cron_key))
            for r in (DATAVOLUMES, PODS, DATA_SOURCES, PVCS, VOLUME_SNAPSHOTS)
        ),
    )
)


def watches(crons: Store) -> Watches:
    """``WATCHES``, and a StorageProfile to the crons whose imports land in its class (the
    template's, or no class named: the default's), as CDI's ``mapStorageProfileToCron``: a
    changed ``dataImportCronSourceFormat`` or snapshot class applies without waiting for the
    next poll; a StorageClass to the crons naming none (the default may have moved: CDI's
    ``addDefaultStorageClassUpdateWatch``). ``crons``: the cron cache (``metrics.cron_view``:
    the template's class)."""

    def using(profile: JSON) -> list[str]:
        name = (profile.get("metadata") or {}).get("name")
        keys = []
        for cron in crons.items():
            cls = (cron.get("spec") or {}).get("storageClassName")
            if not cls or cls == name:
                meta = cron.get("metadata") or {}
                keys.append(f"{meta.get('namespace')}/{meta.get('name')}")
        return keys

    def classless(_sc: JSON) -> list[str]:
        """A StorageClass (its default annotations may have moved): the crons naming none."""
        return [
            f"{(c.get('metadata') or {}).get('namespace')}/{(c.get('metadata') or {}).get('name')}"
            for c in crons.items()
            if not (c.get("spec") or {}).get("storageClassName")
        ]

    return Watches(
        (*WATCHES.watches, Maps(STORAGE_PROFILES, using), Maps(STORAGE_CLASSES, classless))
    )


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class DataImportCronReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        settings: CronSettings,
        datavolumes: Store,
        clock: Callable[[], dt.datetime] = _now,
        requester_key: bytes | None = None,
    ) -> None:
        """``requester_key``: signs the on-behalf record of a cross-namespace pvc source's
        imports (None: no cross-namespace pvc source is imported)."""
        self.kube = kube
        self.settings = settings
        self.datavolumes = datavolumes
        self.clock = clock
        self.requester_key = requester_key

    async def reconcile(self, key: str) -> Result:
        namespace, _, name = key.partition("/")
        obj = await self.kube.get_or_none(DATAIMPORTCRONS, name, namespace)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()  # children go by owner references (retentionPolicy None) or stay
        cron = Cron.from_obj(obj)
        if not cron.managed or not cron.usable or not desired.valid_schedule(cron.schedule):
            log.warning("%s: not a usable DataImportCron (the webhook would refuse it)", key)
            return Result()
        now = self.clock()
        if cron.kind == KIND_PVC:
            obj, polling = await self._poll_claim(cron, obj, now), False
        else:
            obj, polling = await self._poll(cron, obj, now, await self._cdi_config())
        cron = Cron.from_obj(obj)
        obj, moving = await self._follow_class(cron, obj)
        if moving:  # the import on the class no longer wanted is being deleted
            return Result(requeue_after=WATCH_INTERVAL)
        cron = Cron.from_obj(obj)
        status, busy = await self._import(cron, obj, now)
        executed = desired.parse_time(cron.annotations.get(ANN_LAST_CRON_TIME))
        if executed is not None:  # CDI's updateLastExecutionTimestamp
            status["lastExecutionTimestamp"] = desired.rfc3339(executed)
        if status != (obj.get("status") or {}):
            try:
                await self.kube.replace(DATAIMPORTCRONS, {**obj, "status": status}, sub="status")
            except Conflict:
                return Result(requeue_after=0.5)
        return Result(requeue_after=_soonest(cron, now, polling or busy))

    # -- polling --------------------------------------------------------------------------

    async def _poll_claim(self, cron: Cron, obj: JSON, now: dt.datetime) -> JSON:
        """A pvc source (CDI's ``updatePvcDesiredDigest``): no poller pod, the controller reads
        the source claim and its identity is ``uid:<its UID>``. A claim in another namespace
        is read only when CDI's clone authorization (#3970/#3971) allows the cron namespace's
        ``default`` ServiceAccount to clone it (``_clone_denial``, asked before the claim is
        read, so a refusal tells nothing of the claim); refused, the cron says
        ``NotAuthorized`` and polls again on its schedule, not sooner."""
        if not desired.poll_due(cron, now):
            return obj
        namespace, name = cron.source_claim
        nxt = desired.next_poll(cron.schedule, now)
        changes: dict[str, str | None] = {
            ANN_LAST_CRON_TIME: desired.rfc3339(now),
            ANN_NEXT_CRON_TIME: desired.rfc3339(nxt) if nxt else None,
        }
        denial = await self._clone_denial(cron)
        if denial is not None:
            error = {"reason": desired.NOT_AUTHORIZED[1], "message": denial}
            changes[ANN_POLL_ERROR] = json.dumps(error, sort_keys=True)
            return await self._annotate(cron, changes)
        claim = await self.kube.get_or_none(PVCS, name, namespace)
        if claim is not None and not claim["metadata"].get("deletionTimestamp"):
            changes[ANN_DESIRED_DIGEST] = desired.pvc_digest(str(claim["metadata"]["uid"]))
            changes[ANN_POLL_ERROR] = None
            return await self._annotate(cron, changes)
        # it may be made later: looked for again soon
        error = {"reason": "SourcePVCNotFound", "message": f"PVC {namespace}/{name} not found"}
        changes[ANN_NEXT_CRON_TIME] = desired.rfc3339(now + POLL_RETRY)
        changes[ANN_POLL_ERROR] = json.dumps(error, sort_keys=True)
        return await self._annotate(cron, changes)

    async def _clone_denial(self, cron: Cron) -> str | None:
        """None when the cron may clone its pvc source; else why not (CDI's wording). The
        same namespace needs nothing; another needs a signing key (for the on-behalf record)
        and CDI's SubjectAccessReviews for the namespace's ``default`` ServiceAccount."""
        namespace, name = cron.source_claim
        if namespace == cron.namespace:
            return None
        user = onbehalf.default_service_account(cron.namespace)
        prefix = "Not authorized to clone the source PVC"
        if not self.requester_key:
            return f"{prefix}: no requester signing key is configured"
        alternatives = clone_checks(False, name)
        answers = {
            check: await access_allowed(self.kube, user, namespace, check)
            for checks in alternatives
            for check in checks
        }
        if authorized(answers.__getitem__, alternatives):
            return None
        return f"{prefix}: {denial_message(user.username, namespace)}"

    async def _poll(
        self, cron: Cron, obj: JSON, now: dt.datetime, config: CDIConfig
    ) -> tuple[JSON, bool]:
        """(cron object, still polling)."""
        pod = await self.kube.get_or_none(PODS, cron.poller_name, cron.namespace)
        recorded = cron.annotations.get(ANN_POLLER_UID)
        seen = assess(pod, recorded)
        if seen.impostor is not None:
            await remove_impostor(self.kube, seen.impostor, cron.namespace)  # never read
            return obj, True
        if seen.trust == Trust.ABSENT:
            if not desired.poll_due(cron, now):
                return obj, False
            poller = desired.poller_pod(cron, self._pod_config(config))
            uid = await create_pod(self.kube, poller, cron.namespace)
            if uid is None:  # someone's pod at the name: the next reconcile judges it
                return obj, True
            return await self._annotate(cron, {ANN_POLLER_UID: uid or None}), True
        outcome = seen.outcome
        if outcome is None:
            problem = pod_problem(seen.pod or {})
            if problem is None or problem[0] != ConditionReason.IMAGE_PULL_FAILED:
                return obj, True
            # node pull: the kubelet cannot pull the tag (it would keep trying): a failed
            # poll, tried again with a new pod soon (CDI's "failed to pull image")
            outcome = Outcome(problem[0], problem[1], transient=True)
        await self.kube.delete_if_present(PODS, cron.poller_name, cron.namespace, uid=recorded)
        term = outcome.termination
        if term is not None and seen.pod is not None:
            term = with_node_digest(term, seen.pod)  # node pull: the kubelet's imageID
        digest = term.source_digest if term else None
        nxt = desired.next_poll(cron.schedule, now)
        if outcome.succeeded and digest:
            release = term.source_release if term else {}
            changes = {
                ANN_DESIRED_DIGEST: digest,
                ANN_DESIRED_RELEASE: json.dumps(release, sort_keys=True) if release else None,
                ANN_POLL_ERROR: None,
                ANN_POLLER_UID: None,
                ANN_NEXT_CRON_TIME: desired.rfc3339(nxt) if nxt else None,
                ANN_LAST_CRON_TIME: desired.rfc3339(now),
            }
            return await self._annotate(cron, changes), False
        log.info(
            "%s/%s: poll failed: %s: %s", cron.namespace, cron.name, outcome.reason, outcome.message
        )
        # A transient failure (the network) is retried soon; a permanent one (no validator, a
        # bad document) waits for the schedule or a forced poll: polling again cannot help.
        retry = now + POLL_RETRY if outcome.transient else nxt
        error = {"reason": outcome.reason, "message": outcome.message[:1024]}
        changes = {
            ANN_NEXT_CRON_TIME: desired.rfc3339(retry) if retry else None,
            ANN_POLL_ERROR: json.dumps(error, sort_keys=True),
            ANN_POLLER_UID: None,
            ANN_LAST_CRON_TIME: desired.rfc3339(now),
        }
        return await self._annotate(cron, changes), False

    async def _annotate(self, cron: Cron, changes: Mapping[str, str | None]) -> JSON:
        patch = {"metadata": {"annotations": dict(changes)}}
        return await self.kube.patch(DATAIMPORTCRONS, cron.name, patch, cron.namespace)

    def _pod_config(self, config: CDIConfig) -> ImporterPodConfig:
        return ImporterPodConfig(
            image=self.settings.image,
            command=(),
            pull_policy=self.settings.pull_policy,
            cdi_config=config,
        )

    async def _cdi_config(self) -> CDIConfig:
        raw = await self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        try:
            config = CDIConfig.from_dict(raw) if raw else CDIConfig()
        except SchemaError:
            config = CDIConfig()
        return config.with_cluster_cidrs(self.settings.cluster_cidrs)

    # -- the storage class ------------------------------------------------------------------

    async def _follow_class(self, cron: Cron, obj: JSON) -> tuple[JSON, bool]:
        """CDI's ``handleStorageClassChange``: the class imports land in is recorded on the
        cron (``storage.import.storageClass``); when it changes (a template naming no class,
        and the default class moved), the current digest's snapshot, DataVolume and claim on
        the old class are deleted, and once they are gone the new class is recorded and the
        digest imported again there. (cron object, still deleting)."""
        wanted = await self._storage_class(cron, None)
        recorded = cron.annotations.get(ANN_STORAGE_CLASS)
        if not wanted or recorded == wanted:
            return obj, False
        digest = cron.annotations.get(ANN_DESIRED_DIGEST)
        if recorded is not None and digest:
            name, ns = desired.import_name(cron.managed, digest), cron.namespace
            log.info("%s/%s: storage class %s -> %s: deleting %s", ns, cron.name, recorded,
                     wanted, name)  # fmt: skip
            await self.kube.delete_if_present(VOLUME_SNAPSHOTS, name, ns)
            await self.kube.delete_if_present(DATAVOLUMES, name, ns)
            await self.kube.delete_if_present(PVCS, name, ns)
            for there in (
                await self._get_snapshot(name, ns),
                await self.kube.get_or_none(DATAVOLUMES, name, ns),
                await self.kube.get_or_none(PVCS, name, ns),
            ):
                if there is not None:
                    return obj, True
        return await self._annotate(cron, {ANN_STORAGE_CLASS: wanted}), False

    async def _read_write_once(self, cron: Cron) -> bool:
        """The profile of the class imports land in says ``useReadWriteOnceForDataImportCron``."""
        cls = cron.annotations.get(ANN_STORAGE_CLASS) or await self._storage_class(cron, None)
        profile = await self.kube.get_or_none(STORAGE_PROFILES, cls) if cls else None
        annotations = ((profile or {}).get("metadata") or {}).get("annotations") or {}
        return annotations.get(ANN_RWO_FOR_CRON) == "true"

    # -- importing ------------------------------------------------------------------------

    async def _import(self, cron: Cron, obj: JSON, now: dt.datetime) -> tuple[JSON, bool]:
        """The status to write, and whether an import or a snapshot is still under way.

        CDI's ``update``: the import of the desired digest is a DataVolume, or once it
        succeeded its claim, or (``snapshot`` source format) the VolumeSnapshot of that claim
        named as it; an existing claim or snapshot at the name is reused, never imported
        again (a digest the cron had before, still kept)."""
        old = dict(obj.get("status") or {})
        stamp = desired.rfc3339(now)
        previous = old.get("conditions") or []
        digest = cron.annotations.get(ANN_DESIRED_DIGEST)
        poll_error = desired.poll_error(cron)
        if not digest:
            up_to_date = poll_error or (False, "NoDigest", "No source digest")
            conds = desired.cron_conditions(previous, stamp, desired.NO_IMPORT, up_to_date)
            return {**old, "conditions": conds}, False
        release = desired.desired_release(cron)
        name = desired.import_name(cron.managed, digest)
        ns = cron.namespace
        dv = await self.kube.get_or_none(DATAVOLUMES, name, ns)
        claim = await self.kube.get_or_none(PVCS, name, ns)
        snap = await self._get_snapshot(name, ns)
        if dv is None and claim is None and snap is None:
            try:
                rwo = await self._read_write_once(cron)
                want = desired.desired_import(cron, digest, release, use_time(now), rwo)
            except WorkerError as exc:  # a release record that does not check out: no import
                refused = (False, exc.reason, exc.message)
                conds = desired.cron_conditions(previous, stamp, desired.NO_IMPORT, refused)
                return {**old, "conditions": conds}, False
            if cron.kind == KIND_PVC and cron.source_claim[0] != ns:
                denial = await self._clone_denial(cron)  # asked again: rights may be revoked
                if denial is not None or not self.requester_key:
                    refused = (False, desired.NOT_AUTHORIZED[1], denial or "")
                    conds = desired.cron_conditions(previous, stamp, desired.NO_IMPORT, refused)
                    return {**old, "conditions": conds}, False
                want["metadata"]["annotations"].update(
                    onbehalf.signed_annotations(
                        self.requester_key,
                        ns,
                        name,
                        onbehalf.default_service_account(ns),
                        cron.source_claim,
                        self.clock(),
                    )
                )
            dv = await self.kube.create(DATAVOLUMES, want)
        current: JSON = {"dataVolumeName": name, "Digest": digest}
        if release.get("release"):
            current["release"] = release["release"]
        status = {**old, "currentImports": [current]}
        phase = str(((dv or {}).get("status") or {}).get("phase") or "")
        bound = ((claim or {}).get("status") or {}).get("phase") == "Bound"
        if (dv is not None and phase != "Succeeded") or (dv is None and snap is None and not bound):
            progressing = desired.import_progressing(phase)
            waiting = desired.import_up_to_date(digest, old.get("currentImports") or [])
            conds = desired.cron_conditions(previous, stamp, progressing, poll_error or waiting)
            return {**status, "conditions": conds}, True
        fmt = await self._source_format(cron, claim, snap)
        status["sourceFormat"] = fmt
        if fmt == FORMAT_SNAPSHOT:
            used, waiting_for = await self._snapshot_step(cron, claim, snap, now)
            if used is None:
                conds = desired.cron_conditions(
                    previous, stamp, desired.NO_IMPORT, poll_error or waiting_for
                )
                return {**status, "conditions": conds}, True
            source: JSON = used
        elif snap is not None and claim is None:
            # the format went back to pvc: CDI deletes the snapshot and imports again
            await self.kube.delete_if_present(VOLUME_SNAPSHOTS, name, ns)
            conds = desired.cron_conditions(
                previous, stamp, desired.NO_IMPORT, poll_error or desired.IMPORTING
            )
            return {**status, "conditions": conds}, True
        elif claim is not None:
            source = claim
        else:  # a succeeded DataVolume whose claim is gone: it is made again, then used
            conds = desired.cron_conditions(
                previous, stamp, desired.NO_IMPORT, poll_error or desired.IMPORTING
            )
            return {**status, "conditions": conds}, True
        pointer = {"name": name, "namespace": ns}
        await self._mark_used(source, fmt, now, refresh=old.get("lastImportedPVC") != pointer)
        await self._point_data_source(cron, name, source, release, fmt)
        await self._collect(cron, name)
        status["lastImportedPVC"] = pointer
        if release.get("release"):
            status["sourceRelease"] = dict(release)
        status.setdefault("lastImportTimestamp", stamp)
        if old.get("lastImportedPVC") != pointer:
            status["lastImportTimestamp"] = stamp
        up_to_date = poll_error or desired.UP_TO_DATE
        conds = desired.cron_conditions(previous, stamp, desired.NO_IMPORT, up_to_date)
        return {**status, "conditions": conds}, False

    async def _get_snapshot(self, name: str, namespace: str) -> JSON | None:
        """The snapshot at the import's name; None too where the snapshot API is not served
        (the API server answers 404 for the kind)."""
        return await self.kube.get_or_none(VOLUME_SNAPSHOTS, name, namespace)

    async def _source_format(self, cron: Cron, claim: JSON | None, snap: JSON | None) -> str:
        """The StorageProfile's ``dataImportCronSourceFormat`` for the import's class. A class
        that cannot be found keeps an existing snapshot (a lookup that failed must not throw
        a golden image away; CDI falls back to pvc and deletes it)."""
        cls = await self._storage_class(cron, claim)
        profile = await self.kube.get_or_none(STORAGE_PROFILES, cls) if cls else None
        if profile is None and snap is not None:
            return FORMAT_SNAPSHOT
        return desired.source_format(profile)

    async def _storage_class(self, cron: Cron, claim: JSON | None) -> str:
        """The claim's class; before it exists, the template's, else the default virt class,
        else the default class (CDI's ``GetStorageClassByNameWithVirtFallback``)."""
        named = ((claim or {}).get("spec") or {}).get("storageClassName")
        named = named or desired.template_claim(cron).get("storageClassName")
        if named:
            return str(named)
        classes = (await self.kube.list(STORAGE_CLASSES)).get("items") or []
        for key in (ANN_DEFAULT_VIRT_CLASS, ANN_DEFAULT_CLASS):
            for sc in sorted(classes, key=lambda c: str(c["metadata"]["name"])):
                if ((sc["metadata"].get("annotations") or {}).get(key)) == "true":
                    return str(sc["metadata"]["name"])
        return ""

    async def _snapshot_step(
        self, cron: Cron, claim: JSON | None, snap: JSON | None, now: dt.datetime
    ) -> tuple[JSON | None, desired.Condition]:
        """CDI's ``handleSnapshot``: snapshot the imported claim, and once the snapshot is
        ready delete the import's DataVolume and claim. The ready snapshot, or None and the
        ``UpToDate`` condition to show meanwhile."""
        if snap is None:
            if claim is None:
                return None, desired.SNAPSHOTTING
            cls = await self._snapshot_class(claim)
            body = desired.desired_snapshot(
                cron, claim, cls, _kubevirt_labels(claim), use_time(now)
            )
            try:
                await self.kube.create_if_absent(VOLUME_SNAPSHOTS, body, cron.namespace)
            except NotFound:  # the profile asks for snapshots where the API is not served
                return None, NO_SNAPSHOT_API
            return None, desired.SNAPSHOTTING
        if not ready(snap):
            return None, desired.SNAPSHOTTING
        name = str(snap["metadata"]["name"])
        if not await self.kube.delete_if_present(DATAVOLUMES, name, cron.namespace):
            await self.kube.delete_if_present(PVCS, name, cron.namespace)
        return snap, desired.UP_TO_DATE

    async def _snapshot_class(self, claim: JSON) -> str:
        """The profile's ``snapshotClassForDataImportCron`` annotation, else the smart clone's
        choice for the claim's driver (the profile's ``snapshotClass``, the default class, the
        first by name), else none (the snapshot controller's default)."""
        cls = str((claim.get("spec") or {}).get("storageClassName") or "")
        profile = await self.kube.get_or_none(STORAGE_PROFILES, cls) if cls else None
        meta = (profile or {}).get("metadata") or {}
        wanted = (meta.get("annotations") or {}).get(ANN_SNAPSHOT_CLASS_FOR_CRON)
        if wanted:
            return str(wanted)
        sc = await self.kube.get_or_none(STORAGE_CLASSES, cls) if cls else None
        driver = str((sc or {}).get("provisioner") or "")
        try:
            found = (await self.kube.list(VOLUME_SNAPSHOT_CLASSES)).get("items") or []
        except NotFound:
            return ""
        advised = ((profile or {}).get("status") or {}).get("snapshotClass")
        choice = choose_snapshot_class(driver, found, str(advised) if advised else None)
        return choice.name if choice else ""

    async def _mark_used(self, source: JSON, fmt: str, now: dt.datetime, refresh: bool) -> None:
        """``lastUseTime`` on the claim or snapshot the DataSource serves (CDI's
        ``updateSource``), which orders garbage collection. Written when it becomes the
        current import or has none, not on every reconcile as CDI does: only the order
        matters, and the current import is the newest either way."""
        if not refresh and desired.last_use(source):
            return
        name, ns = str(source["metadata"]["name"]), str(source["metadata"]["namespace"])
        patch = {"metadata": {"annotations": {ANN_LAST_USE_TIME: use_time(now)}}}
        try:
            if fmt == FORMAT_SNAPSHOT:
                await self.kube.patch(VOLUME_SNAPSHOTS, name, patch, ns)
            else:
                await self.kube.patch(PVCS, name, patch, ns)
        except NotFound:
            pass  # gone meanwhile: the next reconcile sees it

    async def _point_data_source(
        self, cron: Cron, name: str, source: JSON, release: Mapping[str, str], fmt: str
    ) -> None:
        labels = _kubevirt_labels(source)
        try:
            labels.update(desired.release_labels(release))
            annotations = desired.release_annotations(release)
        except WorkerError:  # the record was checked when the import was made; now tampered
            annotations = {}
        want = desired.desired_data_source(cron, name, labels, annotations, fmt)
        found = await self.kube.get_or_none(DATA_SOURCES, cron.managed, cron.namespace)
        if found is None:
            await self.kube.create(DATA_SOURCES, want)
        elif ((found.get("metadata") or {}).get("labels") or {}).get(LABEL_CRON) != cron.name:
            # CDI's ErrNotManagedByCron: a DataSource this cron did not make (or another
            # cron's) is never taken over
            log.info("%s/%s: DataSource %s is not managed by this cron; left as it is",
                     cron.namespace, cron.name, cron.managed)  # fmt: skip
        elif (found.get("spec") or {}).get("source") != want["spec"]["source"] or not _carries(
            found, want
        ):
            meta = {
                k: want["metadata"][k] for k in ("labels", "annotations") if k in want["metadata"]
            }
            patch = {"spec": want["spec"], "metadata": meta}
            await self.kube.patch(DATA_SOURCES, cron.managed, patch, cron.namespace)
        # Its Ready condition and status.source are the DataSource reconciler's (datasource.py).

    async def _collect(self, cron: Cron, current: str) -> None:
        """CDI's ``garbageCollectOldImports`` (``garbageCollect: Outdated``): claims and
        snapshots labelled for the cron beyond ``importsToKeep`` by ``lastUseTime`` (a claim
        through its DataVolume when it has one), and imports that never finished."""
        if cron.garbage_collect == GC_NEVER:
            return
        ns = cron.namespace
        ours = [
            dv
            for dv in self.datavolumes.items()
            if (dv.get("metadata") or {}).get("namespace") == ns
            and ((dv.get("metadata") or {}).get("labels") or {}).get(LABEL_CRON) == cron.name
        ]
        for name in desired.unfinished(ours, current):
            await self.kube.delete_if_present(DATAVOLUMES, name, ns)
        selector = f"{LABEL_CRON}={cron.name}"
        claims = _alive((await self.kube.list(PVCS, ns, label_selector=selector)).get("items"))
        for name in desired.beyond_keep(claims, current, cron.keep):
            if not await self.kube.delete_if_present(DATAVOLUMES, name, ns):
                await self.kube.delete_if_present(PVCS, name, ns)
        try:
            found = await self.kube.list(VOLUME_SNAPSHOTS, ns, label_selector=selector)
        except NotFound:
            return  # no snapshot API here
        for name in desired.beyond_keep(_alive(found.get("items")), current, cron.keep):
            await self.kube.delete_if_present(VOLUME_SNAPSHOTS, name, ns)


def use_time(now: dt.datetime) -> str:
    """A ``lastUseTime`` stamp: RFC 3339 with microseconds, so stamps sort as strings (CDI
    writes RFC3339Nano and sorts them as strings too)."""
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _alive(items: Any) -> list[JSON]:
    return [o for o in items or [] if not (o.get("metadata") or {}).get("deletionTimestamp")]


def _kubevirt_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """The labels CDI copies onward (``CopyAllowedLabels``): KubeVirt's (``*.kubevirt.io/``,
    such as the default instance type and preference), never CDI's own."""
    return {
        k: v
        for k, v in ((obj.get("metadata") or {}).get("labels") or {}).items()
        if ".kubevirt.io/" in k and not k.startswith("cdi.kubevirt.io/")
    }


def _carries(found: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    """Whether ``found`` has the labels and annotations ``want`` sets (others may be there)."""
    meta = found.get("metadata") or {}
    for key in ("labels", "annotations"):
        have = meta.get(key) or {}
        if any(have.get(k) != v for k, v in (want["metadata"].get(key) or {}).items()):
            return False
    return True


def _soonest(cron: Cron, now: dt.datetime, busy: bool) -> float | None:
    if busy:
        return WATCH_INTERVAL
    when = desired.parse_time(cron.annotations.get(ANN_NEXT_CRON_TIME))
    if when is None:
        return None
    return max(0.5, (when - now).total_seconds())
