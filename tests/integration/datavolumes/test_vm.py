"""The VM handoff, end to end: a VM pod created at the same moment as its disk is kept in
Pending by Kubernetes until the populated claim binds, then a real kernel (qemu, TCG) boots
with the volume as its virtio disk, mounts the imported ext4 read-only and prints the marker
file. Boots are slow under TCG (~10 s of guest time), so these tests are few."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.vm import Boot
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import ImageServer, events_for
from tests.integration.datavolumes.populator_env import (
    MarkerDisk,
    pvc_path,
    start_population,
    vm_pod,
)

pytestmark = pytest.mark.integration


def pods_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods" + (f"/{name}" if name else "")


def stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def run_vm(kube: Kube, ns: str, claim: str, block: bool) -> tuple[dict[str, Any], list]:
    """Create the VM pod, follow it (and its claim) to the end; the pod and what was seen."""
    kube.create(pods_path(ns), vm_pod("vm", claim, block))
    seen: list[tuple[str, str]] = []

    def finished() -> dict[str, Any] | None:
        pod = kube.get(pods_path(ns, "vm"))
        pvc = kube.get(pvc_path(ns, claim))
        phase = pod.get("status", {}).get("phase", "")
        seen.append((phase, pvc.get("status", {}).get("phase", "")))
        return pod if phase in ("Succeeded", "Failed") else None

    return wait_until(finished, "the VM pod finished", 300, interval=0.5), seen


def assert_booted_after_binding(
    cluster: Cluster, kube: Kube, ns: str, pod: dict[str, Any], seen: list, marker: str
) -> None:
    assert ("Pending", "Pending") in seen, seen[:5]  # the VM waited for its disk
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    log = cluster.container_log(ns, "vm", "compute")
    assert pod["status"]["phase"] == "Succeeded", log[-2000:]
    assert state["message"].strip() == marker
    assert marker in log
    rebinds = [e for e in events_for(kube, ns, "disk") if e["reason"] == "RebindInProgress"]
    assert rebinds, [e["reason"] for e in events_for(kube, ns, "disk")]
    # The VM started only after the data was in and the volume handed over.
    assert stamp(state["startedAt"]) >= stamp(rebinds[0]["lastTimestamp"])


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_vm_pod_waits_for_the_populated_claim_then_boots_the_marker(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
    vm_boot: Boot,
    mode: str,
) -> None:
    block = mode == "Block"
    sc = "testkit-block" if block else "testkit-fs"
    url = image_server.url("slow", marker_disk.name)
    start_population(kube, namespace, url, storage_class=sc, mode=mode)
    pod, seen = run_vm(kube, namespace, "disk", block)
    assert_booted_after_binding(cluster, kube, namespace, pod, seen, marker_disk.marker)
