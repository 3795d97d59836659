"""The VM handoff, end to end: a VM pod created at the same moment as its disk is kept in
Pending by Kubernetes until the populated claim binds, then a real kernel (qemu, TCG) boots
with the volume as its virtio disk, mounts the imported ext4 read-only and prints the marker
file. Boots are slow under TCG (~10 s of guest time), so these tests are few."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.vm import Boot
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    ImageServer,
    condition,
    datavolume,
    dv_path,
    events_for,
    wait_phase,
)
from tests.integration.datavolumes.populator_env import (
    MarkerDisk,
    claims,
    pvc_path,
    vm_pod,
)

pytestmark = pytest.mark.integration


def pods_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/pods" + (f"/{name}" if name else "")


def stamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ")


def run_vm(kube: Kube, ns: str, claim: str, block: bool) -> tuple[dict[str, Any], Seen]:
    """Create the VM pod, follow it, its claim and any prime claim to the end."""
    kube.create(pods_path(ns), vm_pod("vm", claim, block))
    seen = Seen()

    def finished() -> dict[str, Any] | None:
        pod = kube.get(pods_path(ns, "vm"))
        phase = pod.get("status", {}).get("phase", "")
        for name, pvc in claims(kube, ns).items():
            if name == claim:
                seen.phases.append((phase, pvc.get("status", {}).get("phase", "")))
            elif name.startswith("prime-"):
                seen.primes[name] = pvc
        return pod if phase in ("Succeeded", "Failed") else None

    return wait_until(finished, "the VM pod finished", 300, interval=0.5), seen


@dataclass
class Seen:
    phases: list[tuple[str, str]] = field(default_factory=list)  # (pod, claim) phases
    primes: dict[str, dict[str, Any]] = field(default_factory=dict)


def assert_booted_after_binding(
    cluster: Cluster, kube: Kube, ns: str, pod: dict[str, Any], seen: Seen, marker: str
) -> None:
    assert ("Pending", "Pending") in seen.phases, seen.phases[:5]  # the VM waited for its disk
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    log = cluster.container_log(ns, "vm", "compute")
    assert pod["status"]["phase"] == "Succeeded", log[-2000:]
    assert state["message"].strip() == marker
    assert marker in log
    rebinds = [e for e in events_for(kube, ns, "disk") if e["reason"] == "RebindInProgress"]
    assert rebinds, [e["reason"] for e in events_for(kube, ns, "disk")]
    # The VM started only after the data was in and the volume handed over.
    assert stamp(state["startedAt"]) >= stamp(rebinds[0]["lastTimestamp"])


def assert_datavolume_succeeded(kube: Kube, ns: str) -> None:
    dv = kube.get(dv_path(ns, "disk"))
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["progress"] == "100.0%"
    ref = kube.get(pvc_path(ns, "disk"))["spec"]["dataSourceRef"]
    assert ref["kind"] == "VolumeImportSource", ref


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_vm_pod_waits_for_the_datavolume_import_then_boots_the_marker(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
    vm_boot: Boot,
    mode: str,
) -> None:
    """CSI storage: the DataVolume goes through the populator by default."""
    block = mode == "Block"
    sc = "testkit-csi-block" if block else "testkit-csi-fs"
    url = image_server.url("slow", marker_disk.name)
    manifest = datavolume("disk", {"http": {"url": url}}, "32Mi", storage_class=sc, mode=mode)
    kube.create(dv_path(namespace), manifest)
    pod, seen = run_vm(kube, namespace, "disk", block)  # at the same moment
    assert_booted_after_binding(cluster, kube, namespace, pod, seen, marker_disk.marker)
    assert_datavolume_succeeded(kube, namespace)


def test_wait_for_first_consumer_pends_population_until_the_vm_is_scheduled(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
    vm_boot: Boot,
) -> None:
    url = image_server.url("ok", marker_disk.name)
    manifest = datavolume("disk", {"http": {"url": url}}, "32Mi", "testkit-csi-fs-wffc")
    kube.create(dv_path(namespace), manifest)
    wait_phase(kube, namespace, "disk", ("PendingPopulation",), 30)
    time.sleep(2)  # nothing is populated without a consumer
    assert list(claims(kube, namespace)) == ["disk"]
    pod, seen = run_vm(kube, namespace, "disk", block=False)
    assert_booted_after_binding(cluster, kube, namespace, pod, seen, marker_disk.marker)
    assert_datavolume_succeeded(kube, namespace)
    node = pod["spec"]["nodeName"]
    assert seen.primes, "the prime claim was seen"
    for prime in seen.primes.values():  # created on the node the scheduler picked
        assert prime["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node


def test_checksum_mismatch_never_binds_the_claim_and_the_vm_never_starts(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
) -> None:
    http = {"url": image_server.url("ok", marker_disk.name), "checksum": "sha256:" + "0" * 64}
    kube.create(dv_path(namespace), datavolume("disk", {"http": http}, "32Mi", "testkit-csi-fs"))
    kube.create(pods_path(namespace), vm_pod("vm", "disk"))
    dv = wait_phase(kube, namespace, "disk", ("Succeeded", "Failed"), 90)
    assert dv["status"]["phase"] == "Failed", dv["status"]
    ready = condition(dv, "Ready")
    assert ready["reason"] == "ChecksumMismatch" and ready["message"], ready
    time.sleep(3)  # and it stays so
    pvc = kube.get(pvc_path(namespace, "disk"))
    assert pvc["status"]["phase"] == "Pending" and not pvc["spec"].get("volumeName")
    pod = kube.get(pods_path(namespace, "vm"))
    assert pod["status"]["phase"] == "Pending" and not pod["status"].get("containerStatuses")
    assert any(
        e["reason"] == "ImportFailed" and "ChecksumMismatch" in e["message"]
        for e in events_for(kube, namespace, "disk")
    )
