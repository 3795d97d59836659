"""DataImportCron's pvc source and snapshot source format, end to end on the real control plane
with the product installed (CDI #3617; ``dataImportCronSourceFormat``).

A cron whose template clones a claim (``source.pvc``) knows the source by the claim's UID: it
waits for a claim that is not there yet (``SourcePVCNotFound``), clones it as
``<managedDataSource>-<12 characters of the UID>``, and clones again only when the claim is
replaced by a new one; the claims it keeps are collected by ``lastUseTime`` beyond
``importsToKeep``; the status and the ``kubevirt_cdi_dataimportcron_outdated`` metric say
where it is. On a class whose StorageProfile says ``dataImportCronSourceFormat: snapshot`` (the
cluster's CSI provisioner and the real snapshot-controller) each import becomes a VolumeSnapshot
named as CDI names it, the import's DataVolume and claim go, the DataSource points at the
snapshot (a DataVolume restores from it through the DataSource), old snapshots are collected,
and ``retentionPolicy: None`` takes the snapshot and the DataSource along with the cron."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    datavolume,
    dv_path,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.cdi_env import (  # the fixtures this module uses
    cdi_crds as cdi_crds,
)
from tests.integration.datavolumes.cdi_env import (
    controller as controller,
)
from tests.integration.datavolumes.cdi_env import (
    image_server as image_server,
)
from tests.integration.datavolumes.cdi_env import (
    images as images,
)
from tests.integration.datavolumes.cdi_env import (
    product as product,
)
from tests.integration.datavolumes.metrics_env import metrics_ca, reader_token, scrape
from tests.integration.datavolumes.test_alerts import controller_pods
from tests.integration.datavolumes.test_clone_csi import data_of, succeeded
from tests.integration.datavolumes.test_clone_snapshot import SNAPSHOTS, VSC

pytestmark = pytest.mark.integration
CRONS = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/dataimportcrons"
SOURCES = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datasources"
PROFILES = "/apis/cdi.kubevirt.io/v1beta1/storageprofiles"
NEXT = "cdi.kubevirt.io/storage.import.nextCronTime"
FORCED = "2000-01-01T00:00:00Z"
FORCE = {"metadata": {"annotations": {NEXT: FORCED}}}  # a poll now
LAST_USE = "cdi.kubevirt.io/storage.import.lastUseTime"
CRON_LABEL = "cdi.kubevirt.io/dataImportCron"
SNAP_FORMAT_CLASS = "cron-snap-fs"  # the CSI provisioner's; its profile says snapshot


def pvc_cron(name: str, ns: str, cls: str, keep: int, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataImportCron",
        "metadata": {"name": name},
        "spec": {
            "schedule": "0 0 1 1 *",  # once a year: the polls here are the first and forced ones
            "managedDataSource": "golden",
            "importsToKeep": keep,
            "template": {
                "spec": {
                    "source": {"pvc": {"namespace": ns, "name": "published"}},
                    "storage": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": cls,
                        "resources": {"requests": {"storage": "64Mi"}},
                    },
                }
            },
            **spec,
        },
    }


def publish(kube: Kube, ns: str, server: ImageServer) -> str:
    """(Re)make the source claim ``published`` by an import; its new UID."""
    path = dv_path(ns, "published")
    if kube.get_or_none(path) is not None:
        kube.delete(path)
        claim = ns_path(ns, "persistentvolumeclaims", "published")
        wait_until(lambda: kube.get_or_none(claim) is None, "old source claim gone", 60)
    source = {"http": {"url": server.url("ok", "disk.qcow2")}}
    kube.create(dv_path(ns), datavolume("published", source, "64Mi", "testkit-fs"))
    succeeded(kube, ns, "published")
    return str(kube.get(ns_path(ns, "persistentvolumeclaims", "published"))["metadata"]["uid"])


def import_of(uid: str) -> str:
    return f"golden-{uid[:12]}"  # CDI's createDvName for "uid:<uid>"


def cron_of(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.get(f"{CRONS.format(ns=ns)}/{name}")


def conditions(cron: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (cron.get("status") or {}).get("conditions") or []}


def data_source_at(kube: Kube, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    ds = kube.get_or_none(f"{SOURCES.format(ns=ns)}/golden")
    if ds is None or (ds["spec"]["source"].get(kind) or {}).get("name") != name:
        return None
    ready = conditions(ds).get("Ready") or {}
    return ds if ready.get("status") == "True" else None


def wait_data_source(
    kube: Kube, ns: str, kind: str, name: str, product: Product, cron: str
) -> dict[str, Any]:
    return waiting(
        lambda: data_source_at(kube, ns, kind, name), f"DataSource at {name}", kube, ns, cron,
        product, 180,
    )  # fmt: skip


def waiting(
    fn: Any, what: str, kube: Kube, ns: str, cron: str, product: Product, timeout: float
) -> Any:
    """``wait_until``, with the cron, its DataSource, the DataVolumes and the controller's log
    in the failure."""
    try:
        return wait_until(fn, what, timeout)
    except TimeoutError as exc:
        dvs = kube.get(dv_path(ns))["items"]
        state = {
            "cron": kube.get_or_none(f"{CRONS.format(ns=ns)}/{cron}"),
            "datasource": kube.get_or_none(f"{SOURCES.format(ns=ns)}/golden"),
            "dvs": [(d["metadata"]["name"], d.get("status")) for d in dvs],
        }
        raise AssertionError(f"{exc}\n{state}\n{product.log()[-6000:]}") from exc


def outdated_samples(kube: Kube, ns: str, cron: str) -> list[float] | None:
    """``kubevirt_cdi_dataimportcron_outdated`` of ``cron`` from every controller replica."""
    token, ca = reader_token(kube), metrics_ca(kube)
    values = []
    for ip in controller_pods(kube):
        text = scrape(ip, token, ca)
        if text is None:
            return None
        values += [
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "kubevirt_cdi_dataimportcron_outdated"
            and s.labels.get("namespace") == ns
            and s.labels.get("cron_name") == cron
        ]
    return values or None


def gone(kube: Kube, *paths: str) -> bool:
    return all(kube.get_or_none(p) is None for p in paths)


def test_a_cron_clones_its_source_claim_again_only_when_the_claim_is_replaced(
    kube: Kube, namespace: str, image_server: ImageServer, images: Images,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    crons = CRONS.format(ns=ns)

    # (a claim in another namespace: test_dataimportcron_cross_namespace.py)
    # no source claim yet: said so, looked for again
    kube.create(crons, pvc_cron("golden-cron", ns, "testkit-fs", 2))
    wait_until(
        lambda: (
            (conditions(cron_of(kube, ns, "golden-cron")).get("UpToDate") or {}).get("reason")
            == "SourcePVCNotFound"
        ),
        "UpToDate=False SourcePVCNotFound",
        60,
    )
    first_uid = publish(kube, ns, image_server)
    first = import_of(first_uid)
    wait_data_source(kube, ns, "pvc", first, deployed, "golden-cron")
    dv = kube.get(dv_path(ns, first))
    assert dv["spec"]["source"] == {"pvc": {"namespace": ns, "name": "published"}}
    same_prefix_then_zeros(data_of(kube, ns, first), images.reference)
    status = cron_of(kube, ns, "golden-cron")["status"]
    assert status["currentImports"] == [{"dataVolumeName": first, "Digest": f"uid:{first_uid}"}]
    assert status["lastImportedPVC"] == {"name": first, "namespace": ns}
    assert status["sourceFormat"] == "pvc"
    assert status["lastImportTimestamp"] and status["lastExecutionTimestamp"]
    up = conditions(cron_of(kube, ns, "golden-cron"))
    assert (up["UpToDate"]["status"], up["UpToDate"]["reason"]) == ("True", "UpToDate")
    assert (up["Progressing"]["status"], up["Progressing"]["reason"]) == ("False", "NoImport")
    first_claim = ns_path(ns, "persistentvolumeclaims", first)
    assert kube.get(first_claim)["metadata"]["annotations"][LAST_USE]
    assert wait_until(
        lambda: (v := outdated_samples(kube, ns, "golden-cron")) and set(v) == {0.0} and v,
        "the outdated metric at 0 on every replica",
        60,
    )

    # the same claim, polled again (the forced time consumed): nothing new
    executed = status["lastExecutionTimestamp"]
    kube.patch(f"{crons}/golden-cron", FORCE)
    waiting(
        lambda: cron_of(kube, ns, "golden-cron")["metadata"]["annotations"][NEXT] != FORCED,
        "a second poll", kube, ns, "golden-cron", deployed, 60,
    )  # fmt: skip
    again = cron_of(kube, ns, "golden-cron")
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    assert again["metadata"]["annotations"][NEXT] > now  # the schedule's next time
    assert again["status"]["lastExecutionTimestamp"] >= executed
    assert [d["metadata"]["name"] for d in kube.get(dv_path(ns))["items"]] == sorted(
        ["published", first]
    )

    # replaced twice: a clone each time; with importsToKeep 2 the least recently used goes
    second = import_of(publish(kube, ns, image_server))
    kube.patch(f"{crons}/golden-cron", FORCE)
    wait_data_source(kube, ns, "pvc", second, deployed, "golden-cron")
    second_claim = ns_path(ns, "persistentvolumeclaims", second)
    used = {
        c: kube.get(c)["metadata"]["annotations"][LAST_USE] for c in (first_claim, second_claim)
    }
    assert used[second_claim] > used[first_claim]
    assert kube.get_or_none(dv_path(ns, first)) is not None, "kept: importsToKeep is 2"
    third = import_of(publish(kube, ns, image_server))
    kube.patch(f"{crons}/golden-cron", FORCE)
    wait_data_source(kube, ns, "pvc", third, deployed, "golden-cron")
    wait_until(lambda: gone(kube, dv_path(ns, first), first_claim), "the oldest collected", 60)
    assert kube.get_or_none(dv_path(ns, second)) is not None
    same_prefix_then_zeros(data_of(kube, ns, third), images.reference)


@pytest.fixture
def snapshot_format_class(kube: Kube, controller: Any) -> str:
    """A class of the CSI provisioner (snapshots by ``testkit-csi-snapclass``) whose profile
    says ``dataImportCronSourceFormat: snapshot``."""
    wait_until(lambda: kube.get_or_none(f"{SNAPSHOTS}/volumesnapshotclasses/{VSC}"), VSC, 60)
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
          "metadata": {"name": SNAP_FORMAT_CLASS}, "provisioner": "loop.testkit.local",
          "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}  # fmt: skip
    try:
        kube.create("/apis/storage.k8s.io/v1/storageclasses", sc)
    except ApiError as e:
        if not e.conflict:
            raise
    profile = f"{PROFILES}/{SNAP_FORMAT_CLASS}"
    wait_until(lambda: kube.get_or_none(profile), f"profile {SNAP_FORMAT_CLASS}", 60)
    kube.patch(profile, {"spec": {"dataImportCronSourceFormat": "snapshot"}})
    wait_until(
        lambda: (
            (kube.get(profile).get("status") or {}).get("dataImportCronSourceFormat") == "snapshot"
        ),
        "the profile says snapshot",
        60,
    )
    return SNAP_FORMAT_CLASS


def test_on_a_snapshot_format_class_each_import_becomes_a_snapshot_the_data_source_serves(
    kube: Kube, namespace: str, image_server: ImageServer, images: Images,
    snapshot_format_class: str, request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    crons = CRONS.format(ns=ns)
    snapshots = f"{SNAPSHOTS}/namespaces/{ns}/volumesnapshots"
    first = import_of(publish(kube, ns, image_server))
    cron = pvc_cron("snap-cron", ns, snapshot_format_class, 1, retentionPolicy="None")
    kube.create(crons, cron)
    wait_data_source(kube, ns, "snapshot", first, deployed, "snap-cron")

    snap = kube.get(f"{snapshots}/{first}")
    assert snap["status"]["readyToUse"]
    assert snap["spec"]["source"] == {"persistentVolumeClaimName": first}
    assert snap["spec"]["volumeSnapshotClassName"] == VSC
    labels, annotations = snap["metadata"]["labels"], snap["metadata"]["annotations"]
    assert labels[CRON_LABEL] == "snap-cron"
    assert labels["cdi.kubevirt.io/dataImportCron.cleanup"] == "true"
    assert annotations[LAST_USE]
    assert annotations["cdi.kubevirt.io/storage.import.advisedRestoreSize"] == "64Mi"
    assert annotations["cdi.kubevirt.io/storage.import.sourceVolumeMode"] == "Filesystem"
    # the import's DataVolume and claim go once the snapshot is ready (CDI's handleSnapshot)
    claim = ns_path(ns, "persistentvolumeclaims", first)
    wait_until(lambda: gone(kube, dv_path(ns, first), claim), "the import's DV and claim", 60)
    status = cron_of(kube, ns, "snap-cron")["status"]
    assert status["sourceFormat"] == "snapshot"
    assert status["lastImportedPVC"] == {"name": first, "namespace": ns}
    assert conditions(cron_of(kube, ns, "snap-cron"))["UpToDate"]["status"] == "True"

    # a VM disk restored from the golden snapshot through the DataSource
    consumer = datavolume("vm-disk", {}, "64Mi", snapshot_format_class)
    del consumer["spec"]["source"]
    consumer["spec"]["sourceRef"] = {"kind": "DataSource", "name": "golden"}
    kube.create(dv_path(ns), consumer)
    succeeded(kube, ns, "vm-disk", timeout=180)
    same_prefix_then_zeros(data_of(kube, ns, "vm-disk"), images.reference)

    # a new source: a new snapshot, the old one collected (importsToKeep 1)
    second = import_of(publish(kube, ns, image_server))
    kube.patch(f"{crons}/snap-cron", FORCE)
    wait_data_source(kube, ns, "snapshot", second, deployed, "snap-cron")
    wait_until(lambda: gone(kube, f"{snapshots}/{first}"), "the old snapshot collected", 60)

    # retentionPolicy None: the snapshot and the DataSource go with the cron
    kube.delete(f"{crons}/snap-cron")
    wait_until(
        lambda: gone(kube, f"{snapshots}/{second}", f"{SOURCES.format(ns=ns)}/golden"),
        "snapshot and DataSource deleted with the cron",
        90,
    )
    assert kube.get_or_none(dv_path(ns, "vm-disk")) is not None  # restored volumes stay


VIRT_DEFAULT = "storageclass.kubevirt.io/is-default-virt-class"
CLASSES = "/apis/storage.k8s.io/v1/storageclasses"


def local_class(kube: Kube, name: str) -> None:
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": name},
          "provisioner": "testkit.local/loop", "reclaimPolicy": "Delete",
          "volumeBindingMode": "Immediate"}  # fmt: skip
    try:
        kube.create(CLASSES, sc)
    except ApiError as e:
        if not e.conflict:
            raise
    wait_until(lambda: kube.get_or_none(f"{PROFILES}/{name}"), f"profile {name}", 60)


def virt_default(kube: Kube, name: str, on: bool) -> None:
    kube.patch(
        f"{CLASSES}/{name}", {"metadata": {"annotations": {VIRT_DEFAULT: "true" if on else None}}}
    )


def test_a_cron_without_a_class_follows_the_default_class_and_its_profiles_access_mode(
    kube: Kube, namespace: str, image_server: ImageServer, images: Images,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    old, new = "cron-default-old", "cron-default-new"
    for name in (old, new):
        local_class(kube, name)
    # the new default's profile asks for ReadWriteOnce golden images
    kube.patch(f"{PROFILES}/{new}", {"metadata": {"annotations": {
        "cdi.kubevirt.io/useReadWriteOnceForDataImportCron": "true"}}})  # fmt: skip
    virt_default(kube, old, True)
    try:
        name = import_of(publish(kube, ns, image_server))
        cron = pvc_cron("default-cron", ns, "", 2)
        storage = cron["spec"]["template"]["spec"]["storage"]
        del storage["storageClassName"], storage["accessModes"]
        kube.create(CRONS.format(ns=ns), cron)
        wait_data_source(kube, ns, "pvc", name, deployed, "default-cron")
        claim = ns_path(ns, "persistentvolumeclaims", name)
        first_uid = kube.get(claim)["metadata"]["uid"]
        assert kube.get(claim)["spec"]["storageClassName"] == old
        annotations = cron_of(kube, ns, "default-cron")["metadata"]["annotations"]
        assert annotations["cdi.kubevirt.io/storage.import.storageClass"] == old
        assert "accessModes" not in kube.get(dv_path(ns, name))["spec"]["storage"]

        # the default moves: the import on the old class goes, the digest lands on the new one
        virt_default(kube, old, False)
        virt_default(kube, new, True)

        def on_new_class() -> dict[str, Any] | None:
            found = kube.get_or_none(claim)
            if found is None or found["metadata"]["uid"] == first_uid:
                return None
            return data_source_at(kube, ns, "pvc", name) and found

        moved = waiting(on_new_class, "the import again on the new class", kube, ns,
                        "default-cron", deployed, 180)  # fmt: skip
        assert moved["spec"]["storageClassName"] == new
        assert moved["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert kube.get(dv_path(ns, name))["spec"]["storage"]["accessModes"] == ["ReadWriteOnce"]
        annotations = cron_of(kube, ns, "default-cron")["metadata"]["annotations"]
        assert annotations["cdi.kubevirt.io/storage.import.storageClass"] == new
        same_prefix_then_zeros(data_of(kube, ns, name), images.reference)
    finally:
        for name in (old, new):
            virt_default(kube, name, False)
