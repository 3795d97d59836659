"""The DataSource reconciler: resolve a golden-image pointer and say whether it can be cloned.

A DataSource names a PVC, a VolumeSnapshot or another DataSource (one level deep). The reconciler
reads it fresh, resolves it to the object a clone would read, and writes the status once:
``status.source`` (the resolved source) and the ``Ready`` condition with CDI's reasons
(``pkg/controller/datasource-controller.go``):

============================================  ===========  =================================
source                                        Ready        reason / message
============================================  ===========  =================================
none                                          False        ``NoSource`` "No source PVC set"
PVC whose DataVolume has not succeeded        False        the DataVolume's phase ("Import
                                                           DataVolume phase ImportInProgress")
PVC (or its DataVolume Succeeded)             True         ``Ready``
PVC missing, no DataVolume                    False        ``NotFound`` "PVC not found"
snapshot missing / not readyToUse             False        ``NotFound`` / ``SnapshotNotReady``
DataSource -> DataSource                      as the inner one, after depth and self checks
============================================  ===========  =================================

The ``*.kubevirt.io/*`` labels of the source (DataVolume, PVC or snapshot) are copied onto the
DataSource (CDI: a golden image's preferred instance type travels with its pointer).

A source in another namespace is read only as far as the DataSource's creator may read it
(docs/security.md N7; upstream CDI reads any): the creator is the webhook's signed record
(``cdi.api.datasource_requester``) and each object (claim, DataVolume, snapshot) is read only
when a SubjectAccessReview says the creator may ``get`` it (``cdi.controller.source_reads``).
A DataSource without a signed record, or whose creator may read none of them, is
``Ready False`` ``SourceNotAuthorized``, the same whether the source exists or not, and gets no
labels; it is looked at again every ``source_reads.REMEMBER`` seconds (rights change).

Deciding is pure (``resolve``/``ready_condition``), so the table above is tested without a
cluster; the reconciler only gathers the objects. The key is "namespace/name" of a DataSource.
What wakes it (``watches``): a DataSource maps to itself and to the DataSources naming it; a
PVC or DataVolume to every DataSource naming a PVC of its name (a DataSource follows its
DataVolume's phase); a VolumeSnapshot (``cdi.controller.snapshotwatch``) to every DataSource
naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdi.api.codec import SchemaError
from cdi.api.constants import ConditionStatus, Phase
from cdi.api.datasource_requester import trusted_datasource_requester
from cdi.api.types import DataSource, DataSourceSource, ObjectRef
from cdi.controller.source_reads import REMEMBER, SourceReads
from cdi.controller.status import merge_conditions
from cdi.kube.client import (
    DATA_SOURCES,
    DATAVOLUMES,
    PVCS,
    VOLUME_SNAPSHOTS,
    AsyncKube,
    Resource,
    split_key,
)
from cdi.kube.errors import KubeError, NotFound
from cdi.kube.watches import For, Maps, Watches
from cdi.kube.workqueue import Result

log = logging.getLogger(__name__)

JSON = dict[str, Any]
READY = "Ready"
NO_SOURCE = "NoSource"
NOT_FOUND = "NotFound"
SNAPSHOT_NOT_READY = "SnapshotNotReady"
MAX_DEPTH_REACHED = "MaxReferenceDepthReached"
SELF_REFERENCE = "SelfReference"
CROSS_NAMESPACE_REFERENCE = "CrossNamespaceReference"
NOT_AUTHORIZED = "SourceNotAuthorized"
UNRECORDED_MESSAGE = (
    "the creator of this DataSource was not recorded by the admission webhook, so its source "
    "in namespace {ns} is not read"
)
UNAUTHORIZED_MESSAGE = "the creator of this DataSource may not read its source in namespace {ns}"
READY_MESSAGE = "DataSource is ready to be consumed"
LABEL_SUFFIX = ".kubevirt.io"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Observed:
    """What the reconciler found for the resolved source (None: absent)."""

    datavolume: Mapping[str, Any] | None = None
    pvc: Mapping[str, Any] | None = None
    snapshot: Mapping[str, Any] | None = None


def resolve(
    ds: DataSource, inner: DataSource | None
) -> tuple[DataSourceSource | None, Readiness | None]:
    """The source a clone of ``ds`` reads, or why there is none (``inner`` is the DataSource
    ``ds`` names, when it names one and it exists)."""
    src = ds.spec.source
    ref = src.data_source
    if ref is None:
        return src, None
    if (ref.namespace or ds.metadata.namespace) != ds.metadata.namespace:
        return None, Readiness(False, CROSS_NAMESPACE_REFERENCE, "Cross namespace reference")
    if ref.name == ds.metadata.name:
        return None, Readiness(False, SELF_REFERENCE, "Self reference")
    if inner is None:
        return None, Readiness(False, NOT_FOUND, "DataSource not found")
    if inner.spec.source.data_source is not None:
        return None, Readiness(False, MAX_DEPTH_REACHED, "Max reference depth reached")
    return inner.spec.source, None


def ready_condition(source: DataSourceSource, seen: Observed) -> Readiness:
    """CDI's Ready condition for a resolved (non-reference) source."""
    if source.pvc is not None:
        dv = seen.datavolume
        if dv is not None:
            phase = str((dv.get("status") or {}).get("phase") or "")
            if phase != Phase.SUCCEEDED:
                return Readiness(False, phase, f"Import DataVolume phase {phase}")
            return Readiness(True, READY, READY_MESSAGE)
        if seen.pvc is None:
            return Readiness(False, NOT_FOUND, "PVC not found")
        return Readiness(True, READY, READY_MESSAGE)
    if source.snapshot is not None:
        snap = seen.snapshot
        if snap is None:
            return Readiness(False, NOT_FOUND, "VolumeSnapshot not found")
        if not (snap.get("status") or {}).get("readyToUse"):
            return Readiness(False, SNAPSHOT_NOT_READY, "Snapshot phase is not ready")
        return Readiness(True, READY, READY_MESSAGE)
    return Readiness(False, NO_SOURCE, "No source PVC set")


def kubevirt_labels(*objs: Mapping[str, Any] | None) -> dict[str, str]:
    """The ``*.kubevirt.io/*`` labels of the source objects (later ones win)."""
    out: dict[str, str] = {}
    for obj in objs:
        for key, value in ((obj or {}).get("metadata", {}).get("labels") or {}).items():
            prefix, _, _rest = str(key).partition("/")
            if _rest and prefix.endswith(LABEL_SUFFIX):
                out[str(key)] = str(value)
    return out


def desired_status(
    previous: Mapping[str, Any], source: DataSourceSource | None, readiness: Readiness, now: str
) -> JSON:
    """The whole status; the transition time also moves when the resolved source changes
    (CDI: re-pointing a Ready DataSource is a new readiness, though still True)."""
    new_source = source.to_dict() if source is not None and not source.empty else None
    cond = {
        "type": READY,
        "status": str(ConditionStatus.TRUE if readiness.ready else ConditionStatus.FALSE),
        "reason": readiness.reason,
        "message": readiness.message,
    }
    old_conditions = list(previous.get("conditions") or [])
    if previous.get("source") != new_source:
        old_conditions = []
    status: JSON = {"conditions": merge_conditions(old_conditions, [cond], now)}
    if new_source is not None:
        status["source"] = new_source
    return status


def references(ds: Mapping[str, Any], kind: str, namespace: str, name: str) -> bool:
    """Whether DataSource ``ds`` (raw) names ``kind`` ("pvc", "snapshot", "dataSource")
    ``namespace/name`` in its spec or its resolved status."""
    meta = ds.get("metadata") or {}
    for part in ((ds.get("spec") or {}).get("source"), (ds.get("status") or {}).get("source")):
        ref = (part or {}).get(kind) or {}
        if ref.get("name") == name and (ref.get("namespace") or meta.get("namespace")) == namespace:
            return True
    return False


def keys_naming(
    datasources: Iterable[Mapping[str, Any]], kind: str, namespace: str, name: str
) -> list[str]:
    return [
        f"{ds['metadata']['namespace']}/{ds['metadata']['name']}"
        for ds in datasources
        if references(ds, kind, namespace, name)
    ]


class Store(Protocol):
    def items(self) -> list[JSON]: ...


def watches(datasources: Store) -> Watches:
    """``datasources``: the DataSource cache, searched for those naming an object."""

    def naming(kind: str) -> Callable[[JSON], list[str]]:
        def keys(obj: JSON) -> list[str]:
            meta = obj.get("metadata") or {}
            ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
            return keys_naming(datasources.items(), kind, ns, name)

        return keys

    return Watches(
        (
            For(DATA_SOURCES),
            Maps(DATA_SOURCES, naming("dataSource")),
            Maps(PVCS, naming("pvc")),
            Maps(DATAVOLUMES, naming("pvc")),
            Maps(VOLUME_SNAPSHOTS, naming("snapshot")),
        )
    )


def source_objects(source: DataSourceSource, default_ns: str) -> tuple[str, list[Resource], str]:
    """Where a resolved source is, the kinds of object read for it, and its name."""
    if source.pvc is not None:
        ns, name = _where(source.pvc, default_ns)
        return ns, [DATAVOLUMES, PVCS], name
    if source.snapshot is not None:
        ns, name = _where(source.snapshot, default_ns)
        return ns, [VOLUME_SNAPSHOTS], name
    return default_ns, [], ""


class DataSourceReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        now: Callable[[], str],
        requester_key: bytes | None = None,
        reads: SourceReads | None = None,
    ) -> None:
        """``requester_key``: the HMAC key of the webhook's signed record; None trusts no
        record, so no source in another namespace is read."""
        self.kube = kube
        self.now = now
        self.requester_key = requester_key
        self.reads = reads or SourceReads(kube)

    async def reconcile(self, key: str) -> Result:
        namespace, name = split_key(key)
        raw = await self.kube.get_or_none(DATA_SOURCES, name, namespace)
        if raw is None or (raw.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        try:
            ds = DataSource.from_dict(raw)
        except SchemaError as exc:
            log.warning("%s: unparsable DataSource: %s", key, exc)
            return Result()
        inner = await self._inner(ds)
        source, problem = resolve(ds, inner)
        seen = Observed()
        result = Result()
        if source is not None:
            own = ds.metadata.namespace
            where, kinds, _ = source_objects(source, own)
            if where != own:
                result = Result(requeue_after=REMEMBER)  # the creator's rights may change
                kinds, refusal = await self._readable(raw, source, own)
                problem = problem or refusal
            seen = await self._observe(source, own, kinds)
        readiness = problem or ready_condition(source or DataSourceSource(), seen)
        raw = await self._copy_labels(raw, seen)
        status = desired_status(raw.get("status") or {}, source, readiness, self.now())
        if status != (raw.get("status") or {}):
            await self.kube.replace(DATA_SOURCES, {**raw, "status": status}, sub="status")
        return result

    async def _readable(
        self, raw: JSON, source: DataSourceSource, namespace: str
    ) -> tuple[list[Resource], Readiness | None]:
        """The kinds of source object the DataSource's creator may read, or why none."""
        where, kinds, name = source_objects(source, namespace)
        requester = trusted_datasource_requester(raw, self.requester_key)
        if requester is None:
            return [], Readiness(False, NOT_AUTHORIZED, UNRECORDED_MESSAGE.format(ns=where))
        allowed = [k for k in kinds if await self.reads.may_get(requester, k, where, name)]
        if not allowed:
            return [], Readiness(False, NOT_AUTHORIZED, UNAUTHORIZED_MESSAGE.format(ns=where))
        return allowed, None

    async def _inner(self, ds: DataSource) -> DataSource | None:
        ref = ds.spec.source.data_source
        if ref is None:
            return None
        raw = await self.kube.get_or_none(DATA_SOURCES, ref.name, ds.metadata.namespace)
        try:
            return DataSource.from_dict(raw) if raw else None
        except SchemaError:
            return None

    async def _observe(
        self, source: DataSourceSource, default_ns: str, kinds: list[Resource]
    ) -> Observed:
        """The source's objects of ``kinds`` (the others are not read: absent)."""
        ns, _, name = source_objects(source, default_ns)
        if source.pvc is not None:
            dv = (
                await self.kube.get_or_none(DATAVOLUMES, name, ns) if DATAVOLUMES in kinds else None
            )
            pvc = await self.kube.get_or_none(PVCS, name, ns) if PVCS in kinds else None
            return Observed(datavolume=dv, pvc=pvc)
        if source.snapshot is not None and VOLUME_SNAPSHOTS in kinds:
            try:
                snap = await self.kube.get_or_none(VOLUME_SNAPSHOTS, name, ns)
            except KubeError:
                snap = None  # the snapshot API may not be served at all: "not found"
            return Observed(snapshot=snap)
        return Observed()

    async def _copy_labels(self, raw: JSON, seen: Observed) -> JSON:
        wanted = kubevirt_labels(seen.pvc, seen.datavolume, seen.snapshot)
        meta = raw.get("metadata") or {}
        current = meta.get("labels") or {}
        missing = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not missing:
            return raw
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "labels": missing}}
        try:
            return await self.kube.patch(DATA_SOURCES, meta["name"], patch, meta.get("namespace"))
        except NotFound:
            return raw


def _where(ref: ObjectRef, default_ns: str) -> tuple[str, str]:
    return ref.namespace or default_ns, ref.name
