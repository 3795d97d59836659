"""The controller's leading pod crashes mid-import on a real node: containerd SIGKILLs its
container (no graceful shutdown, no Lease release), a replica takes the Lease once it has
expired (the standby, or the killed one restarted by the kubelet if it sees that first), finds
the running importer pod instead of making another, and the import finishes
with the same bytes as ``qemu-img convert``. The source is the image server's ``/crawl`` (64
KiB/s), so the import is still running when the standby takes over. The steps are the
process-node test's (``kill_the_leader_mid_import``); here the kill goes through containerd and
the restart through the kubelet."""

from __future__ import annotations

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.e2e.conftest import Served
from tests.integration.datavolumes.cdi_env import (
    both_replicas_ready,
    kill_the_leader_mid_import,
    same_prefix_then_zeros,
    volume_dir,
)

pytestmark = pytest.mark.e2e


def test_leader_killed_mid_import_the_standby_takes_over_with_one_importer_pod(
    kube: Kube, product: Product, served: Served, namespace: str
) -> None:
    url = served.url("crawl", "disk.qcow2")
    t = kill_the_leader_mid_import(kube, product, namespace, "crash", url)
    # Whoever sees the Lease run out first leads: the standby, or the killed replica once the
    # kubelet restarted it (both are correct; the standby, retrying all along, usually wins).
    assert t.successor in (t.standby, t.old), t
    assert t.phase_then == "ImportInProgress", "the import ended before the takeover"
    assert t.dv["status"]["phase"] == "Succeeded", t.dv["status"]
    assert t.dv["status"]["restartCount"] == 0
    assert len(t.pods) == 1, t.pods  # the new leader found the importer pod, made no other
    disk = volume_dir(kube, namespace, "crash") / "disk.img"
    same_prefix_then_zeros(disk, served.images.reference)
    # The killed container was restarted by the kubelet (SIGKILL: exit 137) and stands by.
    wait_until(lambda: both_replicas_ready(product), "both controller replicas ready again", 120)
    (status,) = kube.get(ns_path("cdi", "pods", t.old))["status"]["containerStatuses"]
    assert status["restartCount"] == 1, status
    assert status["lastState"]["terminated"]["exitCode"] == 137, status
