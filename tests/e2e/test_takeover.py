"""The controller's leading pod crashes mid-import on a real node: containerd SIGKILLs its
container (no graceful shutdown, no Lease release), the standby replica takes the Lease once it
has expired, finds the running importer pod instead of making another, and the import finishes
with the same bytes as ``qemu-img convert``. The source is the image server's ``/crawl`` (64
KiB/s), so the import is still running when the leader dies."""

from __future__ import annotations

import time

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.e2e.conftest import Served
from tests.integration.datavolumes.cdi_env import (
    datavolume,
    dv_path,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)

pytestmark = pytest.mark.e2e


def test_leader_killed_mid_import_the_standby_takes_over_with_one_importer_pod(
    kube: Kube, product: Product, served: Served, namespace: str
) -> None:
    url = served.url("crawl", "disk.qcow2")
    kube.create(dv_path(namespace), datavolume("crash", {"http": {"url": url}}))
    wait_phase(kube, namespace, "crash", ("ImportInProgress",), 120)
    uids: set[str] = set()

    def note_pods() -> None:
        for p in kube.get(ns_path(namespace, "pods"))["items"]:
            uids.add(p["metadata"]["uid"])

    replicas = {p["metadata"]["name"] for p in product.pods("cdi-controller")}
    old = product.leader()
    assert old in replicas and len(replicas) == 2, (old, replicas)
    (standby,) = replicas - {old}
    lease_seconds = product.lease()["spec"]["leaseDurationSeconds"]
    note_pods()
    killed_at = time.monotonic()
    product.kill(old)

    def new_leader() -> str | None:
        note_pods()
        holder = product.leader()
        return holder if holder != old else None

    successor = wait_until(new_leader, "another replica to take the Lease", 3 * lease_seconds)
    took = time.monotonic() - killed_at
    print(f"takeover: {successor} leads {took:.1f} s after {old} was SIGKILLed")
    assert successor == standby
    dv = kube.get(dv_path(namespace, "crash"))
    assert dv["status"]["phase"] == "ImportInProgress", "the import ended before the takeover"

    def done() -> dict | None:
        note_pods()
        dv = kube.get(dv_path(namespace, "crash"))
        return dv if dv.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    dv = wait_until(done, "the import to finish after the takeover", 240, interval=0.2)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["restartCount"] == 0
    assert len(uids) == 1, uids  # the new leader found the importer pod, made no other
    same_prefix_then_zeros(
        volume_dir(kube, namespace, "crash") / "disk.img", served.images.reference
    )

    def both_ready() -> bool:
        pods = product.pods("cdi-controller")
        return len(pods) == 2 and all(
            c.get("ready") for p in pods for c in p["status"].get("containerStatuses") or [{}]
        )

    # The killed container was restarted by the kubelet (SIGKILL: exit 137) and stands by.
    wait_until(both_ready, "both controller replicas ready again", 120)
    (status,) = kube.get(ns_path("cdi", "pods", old))["status"]["containerStatuses"]
    assert status["restartCount"] == 1, status
    assert status["lastState"]["terminated"]["exitCode"] == 137, status
