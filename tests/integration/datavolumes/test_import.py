"""DataVolume import and blank, end to end: the real API server, our CRDs, the product deployed
from deploy/ (2 controller replicas, the webhook), importer pods on the local node writing real
volumes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cdi.api.quantity import Quantity
from cdi.render.pvc import required_space
from datapath.target import usable_space
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    MiB,
    both_replicas_ready,
    condition,
    datavolume,
    dv_path,
    events_for,
    kill_the_leader_mid_import,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)

pytestmark = pytest.mark.integration


def test_blank_datavolume_is_a_sparse_disk_of_the_requested_size(
    kube: Kube, namespace: str, controller: Product
) -> None:
    kube.create(dv_path(namespace), datavolume("blank", {"blank": {}}, size="64Mi"))
    dv = wait_phase(kube, namespace, "blank", ("Succeeded", "Failed"), 90)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["progress"] == "100.0%"
    assert condition(dv, "Ready")["status"] == "True"
    assert condition(dv, "Bound")["status"] == "True"
    running = condition(dv, "Running")
    assert running["status"] == "False" and running["reason"] == "Completed"
    pvc = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/blank")
    request = Quantity.parse(pvc["spec"]["resources"]["requests"]["storage"]).value()
    assert request == required_space(0.06, 64 * MiB)  # CDI's filesystem overhead
    disk = Path(pv_of(kube, namespace, "blank")["spec"]["local"]["path"])
    st = os.stat(disk / "disk.img")
    vfs = os.statvfs(disk)
    # The user's 64Mi, unless the filesystem really has less free (tiny ext4: journal).
    free = (vfs.f_bavail * vfs.f_frsize + st.st_blocks * 512) // MiB * MiB
    assert st.st_size == min(usable_space(request, 0.06), free)
    assert st.st_size >= min(64 * MiB, free) - MiB and st.st_size % MiB == 0
    assert st.st_blocks * 512 < MiB  # sparse
    # the importer pod is gone after success
    wait_until(
        lambda: not kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"],
        "importer pod deleted",
        30,
    )


def test_http_qcow2_xz_into_filesystem_volume_matches_qemu_img(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
) -> None:
    url = image_server.url("crawl", "disk.qcow2.xz")  # slow enough to see progress move
    kube.create(dv_path(namespace), datavolume("fromqcow", {"http": {"url": url}}, size="64Mi"))
    seen: list[dict] = []
    dv = wait_phase(kube, namespace, "fromqcow", ("Succeeded", "Failed"), 120, seen)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    phases = [s.get("phase") for s in seen]
    progress = [s.get("progress") for s in seen]
    assert "ImportInProgress" in phases and phases[-1] == "Succeeded", phases
    assert progress[0] in (None, "N/A") and progress[-1] == "100.0%", progress
    assert any(p and p.endswith("%") and p != "100.0%" for p in progress), progress
    disk = Path(pv_of(kube, namespace, "fromqcow")["spec"]["local"]["path"])
    same_prefix_then_zeros(disk / "disk.img", images.reference)
    wait_until(
        lambda: "ImportSucceeded" in [e["reason"] for e in events_for(kube, namespace, "fromqcow")],
        "an ImportSucceeded event",
        10,
    )


@pytest.mark.parametrize(
    ("image", "mode"),
    [("disk.raw.gz", "Filesystem"), ("disk.qcow2.xz", "Block"), ("disk.raw.gz", "Block")],
)
def test_http_import_into_volume_matches_qemu_img(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
    image: str,
    mode: str,
) -> None:
    sc = "testkit-block" if mode == "Block" else "testkit-fs"
    manifest = datavolume(
        "img",
        {"http": {"url": image_server.url("ok", image)}},
        size="32Mi",
        storage_class=sc,
        mode=mode,
    )
    kube.create(dv_path(namespace), manifest)
    dv = wait_phase(kube, namespace, "img", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["restartCount"] == 0
    local = Path(pv_of(kube, namespace, "img")["spec"]["local"]["path"])
    same_prefix_then_zeros(local if mode == "Block" else local / "disk.img", images.reference)


def test_wait_for_first_consumer_is_reported_and_immediate_binding_imports(
    kube: Kube, namespace: str, controller: Product
) -> None:
    kube.create(
        dv_path(namespace),
        datavolume("later", {"blank": {}}, size="8Mi", storage_class="testkit-fs-wffc"),
    )
    dv = wait_phase(kube, namespace, "later", ("WaitForFirstConsumer",), 30)
    assert condition(dv, "Bound")["reason"] == "Pending"
    time.sleep(2)  # nothing forces the binding: no importer pod appears
    assert not kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    assert kube.get(dv_path(namespace, "later"))["status"]["phase"] == "WaitForFirstConsumer"

    immediate = {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}
    kube.create(
        dv_path(namespace),
        datavolume(
            "now", {"blank": {}}, size="8Mi", storage_class="testkit-fs-wffc", annotations=immediate
        ),
    )
    dv = wait_phase(kube, namespace, "now", ("Succeeded", "Failed"), 60)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]


def test_importer_pod_is_created_before_the_claim_binds_on_an_immediate_class(
    kube: Kube, namespace: str, controller: Product
) -> None:
    # An Immediate class nobody provisions: the claim stays Pending, yet the importer pod is
    # created at once (the scheduler, not the controller, waits for the binding).
    sc = f"unprovisioned-{namespace}"
    kube.create(
        "/apis/storage.k8s.io/v1/storageclasses",
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": sc},
            "provisioner": "example.com/nobody",
            "volumeBindingMode": "Immediate",
        },
    )
    try:
        kube.create(
            dv_path(namespace), datavolume("early", {"blank": {}}, size="8Mi", storage_class=sc)
        )
        dv = wait_phase(kube, namespace, "early", ("ImportScheduled",), 60)
        assert condition(dv, "Bound")["status"] == "False"
        pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        assert [p["metadata"]["name"] for p in pods] == ["importer-early"]
        assert pods[0]["status"].get("phase") == "Pending"
        pvc = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/early")
        assert pvc["status"]["phase"] == "Pending"
    finally:
        kube.delete_ignore_missing(f"/apis/storage.k8s.io/v1/storageclasses/{sc}")


FAILURES = {
    # case: (source, size, reason)
    "checksum": (
        {"http": {"url": "ok/disk.raw.gz", "checksum": "sha256:" + "0" * 64}},
        "64Mi",
        "ChecksumMismatch",
    ),
    "404": ({"http": {"url": "ok/no-such-disk.img"}}, "64Mi", "SourceNotFound"),
    "unsafe": ({"http": {"url": "ok/unsafe.qcow2"}}, "64Mi", "UnsafeImage"),
    "undersized": ({"http": {"url": "ok/disk.raw.gz"}}, "8Mi", "InsufficientSpace"),
}


@pytest.mark.parametrize("case", sorted(FAILURES))
def test_permanent_failure_fails_at_once_keeps_the_pod_and_marks_nothing_ready(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    case: str,
) -> None:
    source, size, reason = FAILURES[case]
    http = dict(source["http"])
    mode, _, name = http["url"].partition("/")
    http["url"] = image_server.url(mode, name)
    kube.create(dv_path(namespace), datavolume("bad", {"http": http}, size=size))
    dv = wait_phase(kube, namespace, "bad", ("Succeeded", "Failed"), 90)
    status = dv["status"]
    assert status["phase"] == "Failed", status
    assert status["restartCount"] == 0  # one attempt: retrying cannot help
    for type_ in ("Ready", "Running"):
        cond = condition(dv, type_)
        assert cond["status"] == "False" and cond["reason"] == reason, cond
        assert cond["message"]
    # The event follows the status write, so it may land a moment after the phase.
    wait_until(
        lambda: any(
            e["type"] == "Warning" and e["reason"] == "ImportFailed" and reason in e["message"]
            for e in events_for(kube, namespace, "bad")
        ),
        f"an ImportFailed event naming {reason}",
        10,
    )
    volume = Path(pv_of(kube, namespace, "bad")["spec"]["local"]["path"])
    assert not (volume / "disk.img").exists()  # nothing half-written is left behind
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    assert [p["status"]["phase"] for p in pods] == ["Failed"]  # kept for its logs

    # Deleting the DataVolume removes its pod and its claim (owner references).
    kube.delete(dv_path(namespace, "bad"))
    wait_until(
        lambda: (
            not kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            and not kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims")["items"]
        ),
        "pod and PVC collected",
        60,
    )


def test_transient_failure_retries_with_backoff_then_fails(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
) -> None:
    url = image_server.url("down", "disk.raw.gz")
    kube.create(dv_path(namespace), datavolume("flaky", {"http": {"url": url}}, size="64Mi"))
    seen: list[dict] = []
    dv = wait_phase(kube, namespace, "flaky", ("Succeeded", "Failed"), 180, seen)
    assert dv["status"]["phase"] == "Failed", dv["status"]
    assert dv["status"]["restartCount"] == 2  # three attempts in all (--max-attempts=3)
    assert condition(dv, "Ready")["reason"] == "SourceUnavailable"
    assert {s.get("restartCount") for s in seen} >= {0, 1, 2}
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    names = sorted(p["metadata"]["name"] for p in pods)
    assert names == ["importer-flaky", "importer-flaky-retry-1", "importer-flaky-retry-2"]
    assert all(p["status"]["phase"] == "Failed" for p in pods)
    wait_until(
        lambda: (
            len(
                [
                    e
                    for e in events_for(kube, namespace, "flaky")
                    if e["reason"] == "ErrImportFailed"
                ]
            )
            == 2
        ),
        "two ErrImportFailed events, one per retried attempt",
        10,
    )


def test_leader_killed_mid_import_the_standby_takes_over_within_the_lease_without_duplicates(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
) -> None:
    url = image_server.url("crawl", "disk.qcow2.xz")
    lease_seconds = controller.lease()["spec"]["leaseDurationSeconds"]
    t = kill_the_leader_mid_import(kube, controller, namespace, "crash", url, timeout=120)
    # The Lease expires at most 15 s after the kill (the last renewal came before it); the
    # standby looks every 2 s (--retry-period); 3 s more for a loaded 2-core machine.
    assert t.took <= lease_seconds + 5, f"{t.successor} took over after {t.took:.1f} s"
    assert t.dv["status"]["phase"] == "Succeeded", t.dv["status"]
    assert t.dv["status"]["restartCount"] == 0
    assert len(t.pods) == 1, t.pods  # the new leader found the pod instead of making another
    local = Path(pv_of(kube, namespace, "crash")["spec"]["local"]["path"])
    same_prefix_then_zeros(local / "disk.img", images.reference)
    # The killed replica is restarted by the node and stands by again.
    wait_until(
        lambda: both_replicas_ready(controller), "both controller replicas running again", 60
    )
