"""The DataImportCron reconciler: poll the tag's digest, import each new digest once, point the
managed DataSource at the newest successful import, collect the old ones, and say so in status.

Level-triggered like the others: the key is the cron's ``namespace/name``; its poller pod, its
imports (DataVolumes labelled ``cdi.kubevirt.io/dataImportCron``) and its DataSource map back to
it by that label (``WATCHES``), so tampering (the DataSource repointed or deleted, the last
import deleted) is repaired by the next reconcile, which simply makes the world match
``dataimportcron_desired`` again. The
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

from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME
from cdi.api.errors import WorkerError
from cdi.controller import dataimportcron_desired as desired
from cdi.controller.dataimportcron_desired import (
    ANN_DESIRED_DIGEST,
    ANN_DESIRED_RELEASE,
    ANN_NEXT_CRON_TIME,
    ANN_POLL_ERROR,
    ANN_POLLER_UID,
    DATAIMPORTCRONS,
    GC_NEVER,
    LABEL_CRON,
    Cron,
)
from cdi.controller.workerpod import Trust, assess, create_pod, remove_impostor
from cdi.kube.client import CDI_CONFIGS, DATA_SOURCES, DATAVOLUMES, PODS, AsyncKube
from cdi.kube.errors import Conflict
from cdi.kube.watches import For, Maps, Watches, one
from cdi.kube.workqueue import Result
from cdi.render.importer_pod import ImporterPodConfig

log = logging.getLogger(__name__)
JSON = dict[str, Any]
POLL_RETRY = dt.timedelta(seconds=30)  # after a failed poll
WATCH_INTERVAL = 2.0  # while a poll or an import runs


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
        *(Maps(r, one(cron_key)) for r in (DATAVOLUMES, PODS, DATA_SOURCES)),
    )
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
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.datavolumes = datavolumes
        self.clock = clock

    async def reconcile(self, key: str) -> Result:
        namespace, _, name = key.partition("/")
        obj = await self.kube.get_or_none(DATAIMPORTCRONS, name, namespace)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()  # children go by owner references (retentionPolicy None) or stay
        cron = Cron.from_obj(obj)
        if not cron.managed or not cron.source_url or not desired.valid_schedule(cron.schedule):
            log.warning("%s: not a usable DataImportCron (the webhook would refuse it)", key)
            return Result()
        now = self.clock()
        obj, polling, executed = await self._poll(cron, obj, now, await self._cdi_config())
        cron = Cron.from_obj(obj)
        status, busy = await self._import(cron, obj, now)
        if executed:
            status["lastExecutionTimestamp"] = desired.rfc3339(now)
        if status != (obj.get("status") or {}):
            try:
                await self.kube.replace(DATAIMPORTCRONS, {**obj, "status": status}, sub="status")
            except Conflict:
                return Result(requeue_after=0.5)
        return Result(requeue_after=_soonest(cron, now, polling or busy))

    # -- polling --------------------------------------------------------------------------

    async def _poll(
        self, cron: Cron, obj: JSON, now: dt.datetime, config: CDIConfig
    ) -> tuple[JSON, bool, bool]:
        """(cron object, still polling, a poll finished now)."""
        pod = await self.kube.get_or_none(PODS, cron.poller_name, cron.namespace)
        recorded = cron.annotations.get(ANN_POLLER_UID)
        seen = assess(pod, recorded)
        if seen.impostor is not None:
            await remove_impostor(self.kube, seen.impostor, cron.namespace)  # never read
            return obj, True, False
        if seen.trust == Trust.ABSENT:
            if not desired.poll_due(cron, now):
                return obj, False, False
            poller = desired.poller_pod(cron, self._pod_config(config))
            uid = await create_pod(self.kube, poller, cron.namespace)
            if uid is None:  # someone's pod at the name: the next reconcile judges it
                return obj, True, False
            return await self._annotate(cron, {ANN_POLLER_UID: uid or None}), True, False
        outcome = seen.outcome
        if outcome is None:
            return obj, True, False
        await self.kube.delete_if_present(PODS, cron.poller_name, cron.namespace, uid=recorded)
        term = outcome.termination
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
            }
            return await self._annotate(cron, changes), False, True
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
        }
        return await self._annotate(cron, changes), False, True

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

    # -- importing ------------------------------------------------------------------------

    async def _import(self, cron: Cron, obj: JSON, now: dt.datetime) -> tuple[JSON, bool]:
        """The status to write, and whether an import is still running."""
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
        dv = await self.kube.get_or_none(DATAVOLUMES, name, cron.namespace)
        if dv is None:
            try:
                want = desired.desired_import(cron, digest, release)
            except WorkerError as exc:  # a release record that does not check out: no import
                refused = (False, exc.reason, exc.message)
                conds = desired.cron_conditions(previous, stamp, desired.NO_IMPORT, refused)
                return {**old, "conditions": conds}, False
            dv = await self.kube.create(DATAVOLUMES, want)
        phase = (dv.get("status") or {}).get("phase") or ""
        current: JSON = {"dataVolumeName": name, "Digest": digest}
        if release.get("release"):
            current["release"] = release["release"]
        status = {**old, "currentImports": [current]}
        if phase != "Succeeded":
            conds = desired.cron_conditions(
                previous,
                stamp,
                (True, "ImportProgressing", f"Import DataVolume phase {phase or 'Pending'}"),
                poll_error or (False, "ImportProgressing", "Import is progressing"),
            )
            return {**status, "conditions": conds}, True
        await self._point_data_source(cron, name, dv, release)
        await self._collect(cron, name)
        status["lastImportedPVC"] = {"name": name, "namespace": cron.namespace}
        if release.get("release"):
            status["sourceRelease"] = dict(release)
        status.setdefault("lastImportTimestamp", stamp)
        if old.get("lastImportedPVC") != status["lastImportedPVC"]:
            status["lastImportTimestamp"] = stamp
        up_to_date = poll_error or (True, "UpToDate", "Latest import is up to date")
        conds = desired.cron_conditions(previous, stamp, desired.NO_IMPORT, up_to_date)
        return {**status, "conditions": conds}, False

    async def _point_data_source(
        self, cron: Cron, pvc: str, dv: JSON, release: Mapping[str, str]
    ) -> None:
        labels = {
            k: v
            for k, v in ((dv.get("metadata") or {}).get("labels") or {}).items()
            if ".kubevirt.io/" in k and not k.startswith("cdi.kubevirt.io/")
        }
        try:
            labels.update(desired.release_labels(release))
            annotations = desired.release_annotations(release)
        except WorkerError:  # the record was checked when the import was made; now tampered
            annotations = {}
        want = desired.desired_data_source(cron, pvc, labels, annotations)
        found = await self.kube.get_or_none(DATA_SOURCES, cron.managed, cron.namespace)
        if found is None:
            await self.kube.create(DATA_SOURCES, want)
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
        if cron.garbage_collect == GC_NEVER:
            return
        ours = [
            dv
            for dv in self.datavolumes.items()
            if (dv.get("metadata") or {}).get("namespace") == cron.namespace
            and ((dv.get("metadata") or {}).get("labels") or {}).get(LABEL_CRON) == cron.name
        ]
        for name in desired.to_collect(ours, current, cron.keep):
            await self.kube.delete_if_present(DATAVOLUMES, name, cron.namespace)


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
