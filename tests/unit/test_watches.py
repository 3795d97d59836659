"""What wakes each reconciler: the declarations beside the reconcilers (an object in, keys out)
and the manager that composes them (a real Manager, wired but never started: its informers'
handlers are fed objects as a watch would deliver them, and its real queues are read)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client import ApiClient

from cdi.api.constants import (
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_POPULATOR_KIND,
    CDICONFIG_NAME,
    GROUP,
    KIND_VOLUME_UPLOAD_SOURCE,
    LABEL_COMPONENT,
)
from cdi.controller import cdiconfig, dataimportcron, datasource, storageprofile, uploadpvc
from cdi.controller.dataimportcron_desired import DATAIMPORTCRONS, LABEL_CRON
from cdi.controller.datavolume import is_new, owner_key, waiting
from cdi.controller.manager import Manager, ManagerConfig
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
    Kube,
    Resource,
)
from cdi.kube.informer import Informer
from cdi.kube.watches import For, Maps, Owns, Request, Watches, one, watched
from cdi.render.clone import ANN_MOVE_TARGET
from cdi.render.upload_pod import UPLOAD_COMPONENT

JSON = dict[str, Any]


def obj(name: str, ns: str | None = "ns", **meta: Any) -> JSON:
    metadata: JSON = {"name": name, **meta}
    if ns is not None:
        metadata["namespace"] = ns
    return {"metadata": metadata}


def owned_by(kind: str, name: str, controller: bool = True) -> list[JSON]:
    return [{"kind": kind, "name": name, "controller": controller}]


class Listed:
    """A cache: the objects it holds."""

    def __init__(self, *objs: JSON) -> None:
        self.objs = list(objs)

    def items(self) -> list[JSON]:
        return list(self.objs)

    def get(self, key: str) -> JSON | None:
        return next((o for o in self.objs if _key(o) == key), None)


def _key(o: JSON) -> str:
    meta = o["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


# -- the vocabulary ---------------------------------------------------------------------------
def test_for_maps_an_object_to_itself_and_says_when_it_goes_first() -> None:
    watch = For(DATAVOLUMES, first=lambda o: o["metadata"]["name"] == "new")
    assert watch.requests(obj("new")) == [Request("ns/new", first=True)]
    assert watch.requests(obj("old")) == [Request("ns/old")]
    assert For(STORAGE_PROFILES).requests(obj("fast", ns=None)) == [Request("fast")]


def test_owns_maps_a_child_to_its_controller_owner_of_the_named_kinds_only() -> None:
    watch = Owns(PODS, ("DataVolume",))
    assert watch.requests(obj("p", ownerReferences=owned_by("DataVolume", "disk"))) == [
        Request("ns/disk")
    ]
    assert watch.requests(obj("p", ownerReferences=owned_by("DataVolume", "d", False))) == []
    assert watch.requests(obj("p", ownerReferences=owned_by("ReplicaSet", "rs"))) == []
    assert watch.requests(obj("p")) == []


def test_maps_names_any_keys_and_drops_none() -> None:
    assert Maps(PVCS, lambda _o: ["a/1", "", "b/2"]).requests(obj("x")) == [
        Request("a/1"),
        Request("b/2"),
    ]
    assert Maps(PVCS, one(lambda _o: None)).requests(obj("x")) == []


def test_a_predicate_filters_events_before_any_mapping() -> None:
    def quiet(o: JSON) -> bool:
        return o["metadata"]["name"] != "echo"

    for watch in (
        For(PVCS, where=quiet),
        Owns(PVCS, ("DataVolume",), where=quiet),
        Maps(PVCS, lambda o: ["ns/x"], where=quiet),
    ):
        echo = obj("echo", ownerReferences=owned_by("DataVolume", "x"))
        heard = obj("heard", ownerReferences=owned_by("DataVolume", "x"))
        assert watch.requests(echo) == []
        assert watch.requests(heard) != []


def test_a_declaration_answers_only_for_the_kind_of_the_event() -> None:
    declared = Watches((For(DATA_SOURCES), Maps(PVCS, lambda _o: ["ns/from-claim"])))
    assert declared.requests(DATA_SOURCES, obj("s")) == [Request("ns/s")]
    assert declared.requests(PVCS, obj("c")) == [Request("ns/from-claim")]
    assert declared.requests(PODS, obj("p")) == []
    assert watched([declared, Watches((For(PVCS), For(PODS)))]) == [DATA_SOURCES, PVCS, PODS]


# -- each reconciler's mappings ---------------------------------------------------------------
def test_datavolume_mappings() -> None:
    assert is_new({"status": {}}) and not is_new({"status": {"phase": "Pending"}})
    assert owner_key(obj("disk", annotations={ANN_CREATED_FOR_DATAVOLUME: "uid"})) == "ns/disk"
    assert owner_key(obj("pod", ownerReferences=owned_by("PersistentVolumeClaim", "c"))) == "ns/c"
    assert owner_key(obj("stranger")) is None
    dvs = [
        {**obj("fresh")},
        {**obj("pending"), "status": {"phase": "Pending"}},
        {**obj("running"), "status": {"phase": "ImportInProgress"}},
    ]
    assert waiting(dvs) == ["ns/fresh", "ns/pending"]


def test_an_upload_target_claim_and_its_server_wake_the_upload_loop() -> None:
    server = obj(
        "cdi-upload-plain",
        labels={LABEL_COMPONENT: UPLOAD_COMPONENT},
        ownerReferences=owned_by("PersistentVolumeClaim", "plain"),
    )
    declared = uploadpvc.watches(Listed(server))
    target = obj("plain", annotations={"cdi.kubevirt.io/storage.upload.target": ""})
    assert declared.requests(PVCS, target) == [Request("ns/plain")]
    untargeted = obj("plain")  # the annotation removed: the server must go
    assert declared.requests(PVCS, untargeted) == [Request("ns/plain")]
    assert declared.requests(PVCS, obj("other")) == []  # no target, no server
    dv_claim = obj(
        "d",
        annotations={"cdi.kubevirt.io/storage.upload.target": ""},
        ownerReferences=owned_by("DataVolume", "d"),
    )
    assert declared.requests(PVCS, dv_claim) == []  # the DataVolume reconciler's
    assert declared.requests(PODS, server) == [Request("ns/plain")]
    importer = obj("importer-x", labels={LABEL_COMPONENT: "importer"})
    importer["metadata"]["ownerReferences"] = owned_by("PersistentVolumeClaim", "x")
    assert declared.requests(PODS, importer) == []


def test_a_cron_is_woken_by_itself_and_what_carries_its_label() -> None:
    labelled = obj("import-1", labels={LABEL_CRON: "nightly"})
    for kind in (DATAVOLUMES, PODS, DATA_SOURCES, PVCS, VOLUME_SNAPSHOTS):
        assert dataimportcron.WATCHES.requests(kind, labelled) == [Request("ns/nightly")]
        assert dataimportcron.WATCHES.requests(kind, obj("unlabelled")) == []
    assert dataimportcron.WATCHES.requests(DATAIMPORTCRONS, obj("nightly")) == [
        Request("ns/nightly")
    ]


def test_a_profile_or_class_wakes_the_crons_importing_into_it_or_the_default() -> None:
    def cron(name: str, cls: str | None) -> JSON:
        return {**obj(name), "spec": {"storageClassName": cls}}  # as metrics.cron_view keeps it

    declared = dataimportcron.watches(Listed(cron("fast-cron", "fast"), cron("any", None),
                                             cron("slow-cron", "slow")))  # fmt: skip
    assert declared.requests(STORAGE_PROFILES, obj("fast", ns=None)) == [
        Request("ns/fast-cron"),
        Request("ns/any"),
    ]
    assert declared.requests(STORAGE_CLASSES, obj("any-class", ns=None)) == [Request("ns/any")]
    labelled = obj("import-1", labels={LABEL_CRON: "nightly"})
    assert declared.requests(VOLUME_SNAPSHOTS, labelled) == [Request("ns/nightly")]


def test_a_profile_is_woken_by_its_class_and_every_profile_by_a_snapshot_class() -> None:
    declared = storageprofile.watches(Listed(obj("fast", ns=None), obj("slow", ns=None)))
    assert declared.requests(STORAGE_CLASSES, obj("fast", ns=None)) == [Request("fast")]
    assert declared.requests(STORAGE_PROFILES, obj("fast", ns=None)) == [Request("fast")]
    assert declared.requests(VOLUME_SNAPSHOT_CLASSES, obj("csi", ns=None)) == [
        Request("fast"),
        Request("slow"),
    ]


def test_the_config_singleton_is_woken_by_classes_and_configs_and_queued_at_start() -> None:
    for kind in (STORAGE_CLASSES, CDI_CONFIGS):
        assert cdiconfig.WATCHES.requests(kind, obj("any", ns=None)) == [Request(CDICONFIG_NAME)]
    assert cdiconfig.WATCHES.initial == (CDICONFIG_NAME,)


def test_a_datasource_is_woken_by_itself_and_by_what_it_names() -> None:
    def pointer(name: str, kind: str, target: str) -> JSON:
        return {**obj(name), "spec": {"source": {kind: {"name": target}}}}

    sources = Listed(
        pointer("by-pvc", "pvc", "golden"),
        pointer("by-snap", "snapshot", "snap"),
        pointer("by-ds", "dataSource", "by-pvc"),
    )
    declared = datasource.watches(sources)
    assert declared.requests(DATA_SOURCES, sources.objs[0]) == [
        Request("ns/by-pvc"),
        Request("ns/by-ds"),
    ]
    for kind in (PVCS, DATAVOLUMES):
        assert declared.requests(kind, obj("golden")) == [Request("ns/by-pvc")]
        assert declared.requests(kind, obj("golden", ns="elsewhere")) == []
    assert declared.requests(VOLUME_SNAPSHOTS, obj("snap")) == [Request("ns/by-snap")]


# -- the manager composes them ----------------------------------------------------------------
@pytest.fixture
def manager() -> Iterator[Manager]:
    made = Manager(Kube(ApiClient()), ManagerConfig(workers=4, metrics_port=None))
    made.wire()
    yield made
    made.kube.close()


def event(manager: Manager, kind: Resource, o: JSON) -> None:
    """What the informer of ``kind`` does with a watch event: store it, call its handlers."""
    informer: Informer = manager.informers[kind]
    informer._apply("ADDED", o)


async def queued(manager: Manager) -> dict[str, list[str]]:
    """Each loop's waiting keys, in the order its workers would take them (drained)."""
    out: dict[str, list[str]] = {}
    for name, loop in manager.loops.items():
        keys = []
        while len(loop.queue):
            key = await loop.queue.get()
            assert key is not None
            keys.append(key)
            loop.queue.done(key)
        if keys:
            out[name] = keys
    return out


def test_one_informer_per_kind_shared_by_every_reconciler_that_watches_it(
    manager: Manager,
) -> None:
    kinds = manager.informers.kinds()
    assert len(kinds) == len(set(kinds))
    declared = watched(loop.controller.watches for loop in manager.loops.values())
    assert set(declared) <= set(kinds)
    claim_handlers = manager.informers[PVCS].handlers
    # the DataVolume, upload, three populator, DataSource and DataImportCron loops hear claims
    assert len(claim_handlers) == 7
    started = set(i.resource for i in manager.informers.started_here())
    assert started == set(kinds) - {VOLUME_SNAPSHOTS, VOLUME_SNAPSHOT_CLASSES}


async def test_the_config_singleton_is_queued_before_any_event(manager: Manager) -> None:
    assert await queued(manager) == {"cdiconfig": [CDICONFIG_NAME]}


async def test_a_new_datavolume_goes_ahead_of_the_queue_and_an_old_one_does_not(
    manager: Manager,
) -> None:
    event(manager, DATAVOLUMES, {**obj("old"), "status": {"phase": "ImportInProgress"}})
    event(manager, DATAVOLUMES, {**obj("new", labels={LABEL_CRON: "nightly"})})
    assert manager.loops["datavolume"].queue.urgent == 1
    got = await queued(manager)
    assert got["datavolume"] == ["ns/new", "ns/old"]
    assert got["dataimportcron"] == ["ns/nightly"]


async def test_the_echo_of_the_reconcilers_own_status_write_wakes_nothing(
    manager: Manager,
) -> None:
    written = {**obj("disk", uid="u1", resourceVersion="7"), "status": {"phase": "Succeeded"}}
    manager.datavolumes.own_dvs.wrote(written)
    event(manager, DATAVOLUMES, written)
    assert "datavolume" not in await queued(manager)
    event(
        manager,
        DATAVOLUMES,
        {**written, "metadata": {**written["metadata"], "resourceVersion": "8"}},
    )
    assert (await queued(manager))["datavolume"] == ["ns/disk"]


async def test_a_storage_class_wakes_its_profile_the_config_and_the_waiting_datavolumes(
    manager: Manager,
) -> None:
    event(manager, DATAVOLUMES, {**obj("waiting"), "status": {"phase": "Pending"}})
    event(manager, DATAVOLUMES, {**obj("running"), "status": {"phase": "ImportInProgress"}})
    await queued(manager)
    event(manager, STORAGE_CLASSES, obj("fast", ns=None))
    assert await queued(manager) == {
        "datavolume": ["ns/waiting"],
        "storageprofile": ["fast"],
        "cdiconfig": [CDICONFIG_NAME],
    }


async def test_a_populator_target_wakes_its_own_populator_and_its_prime_every_one(
    manager: Manager,
) -> None:
    ref = {"apiGroup": GROUP, "kind": KIND_VOLUME_UPLOAD_SOURCE, "name": "src"}
    target = {**obj("vm-disk"), "spec": {"dataSourceRef": ref}}
    prime = obj(
        "prime-uid",
        annotations={ANN_POPULATOR_KIND: KIND_VOLUME_UPLOAD_SOURCE},
        ownerReferences=owned_by("PersistentVolumeClaim", "vm-disk"),
    )
    server = obj(
        "cdi-upload-prime-uid",
        labels={LABEL_COMPONENT: UPLOAD_COMPONENT},
        ownerReferences=owned_by("PersistentVolumeClaim", "prime-uid"),
    )
    await queued(manager)  # the config singleton, queued at start
    event(manager, PVCS, target)
    assert await queued(manager) == {"populator-upload": ["ns/vm-disk"]}
    # a prime (and through it its upload server) wakes every populator: each reconcile reads
    # the target and leaves one naming another kind alone
    for kind, o in ((PVCS, prime), (PODS, server)):
        event(manager, kind, o)
        got = await queued(manager)
        assert got["populator-upload"] == got["populator-clone"] == ["ns/vm-disk"], o


async def test_a_snapshot_wakes_the_datavolume_it_was_made_for_and_the_datasources_naming_it(
    manager: Manager,
) -> None:
    pointer = {**obj("golden"), "spec": {"source": {"snapshot": {"name": "snap"}}}}
    event(manager, DATA_SOURCES, pointer)
    await queued(manager)
    event(manager, VOLUME_SNAPSHOTS, obj("snap", annotations={ANN_MOVE_TARGET: "ns/clone"}))
    assert await queued(manager) == {"datavolume": ["ns/clone"], "datasource": ["ns/golden"]}


async def test_a_claim_echo_wakes_nothing_and_its_deletion_drops_the_write_it_echoed(
    manager: Manager,
) -> None:
    claim = obj(
        "disk", uid="c1", resourceVersion="5", ownerReferences=owned_by("DataVolume", "disk")
    )
    own_claims = manager.datavolumes.own_claims
    own_claims.wrote(claim)
    await queued(manager)
    event(manager, PVCS, claim)
    assert "datavolume" not in await queued(manager)
    manager.informers[PVCS]._apply("DELETED", claim)
    assert (await queued(manager))["datavolume"] == ["ns/disk"]
    assert len(own_claims) == 0  # a write of a deleted claim no longer stands in for it


async def test_worker_pods_wake_the_datavolume_that_controls_them_and_upload_servers_the_claim(
    manager: Manager,
) -> None:
    await queued(manager)
    importer = obj("importer-disk", ownerReferences=owned_by("DataVolume", "disk"))
    importer["metadata"]["labels"] = {LABEL_COMPONENT: "importer"}
    event(manager, PODS, importer)
    assert await queued(manager) == {"datavolume": ["ns/disk"]}
    server = obj(
        "cdi-upload-plain",
        labels={LABEL_COMPONENT: UPLOAD_COMPONENT},
        ownerReferences=owned_by("PersistentVolumeClaim", "plain"),
    )
    event(manager, PODS, server)
    got = await queued(manager)
    assert got["datavolume"] == got["uploadpvc"] == ["ns/plain"]
