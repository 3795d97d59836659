"""The control plane fails under a running import: etcd or the kube-apiserver is stopped, kept
down a few seconds and started again, or etcd is frozen past the controller's renew deadline,
while an importer pod is mid-transfer (the image server throttles it to 3 MiB/s, so a 24 MiB
image takes ~8 s). The DataVolume still completes, with exactly one importer pod ever created
(the controller re-lists and finds its recorded pod instead of making another), no import
restart and no controller container restart, and the volume holds the image byte for byte:
nothing half-written is marked ready.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    datavolume,
    dv_path,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)

pytestmark = pytest.mark.integration


class PodWatcher:
    """Every importer pod UID seen in a namespace, polled on a thread (errors while the API
    server is down are expected and skipped)."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube, self.namespace = kube, namespace
        self.uids: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pod-watcher")

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            try:
                pods = self.kube.get(f"/api/v1/namespaces/{self.namespace}/pods")["items"]
            except Exception:  # the API server is down on purpose
                continue
            self.uids |= {p["metadata"]["uid"] for p in pods}

    def __enter__(self) -> PodWatcher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


def restarts(controller: Product) -> dict[str, int]:
    """Each controller container's restart count, by pod."""
    return {
        p["metadata"]["name"]: sum(
            int(c.get("restartCount") or 0) for c in p["status"].get("containerStatuses") or []
        )
        for p in controller.pods("cdi-controller")
    }


# The controller's renew deadline (--renew-deadline's default, which deploy/ keeps); a frozen
# etcd for longer takes the Lease away.
RENEW_DEADLINE = 10.0


@pytest.mark.parametrize(
    "component, fault",
    [("kube-apiserver", "restart"), ("etcd", "restart"), ("etcd", "frozen")],
)
def test_an_import_survives_a_control_plane_restart_mid_transfer(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
    component: str,
    fault: str,
) -> None:
    """``restart``: stopped, down 3 s, started again. ``frozen``: SIGSTOPped for longer than
    the renew deadline, so every request hangs and the leader must give its Lease up on its own
    clock: its writes are fenced, it stands by again in the same process (no container
    restart), and whoever leads next finds the importer pod instead of making another."""
    url = image_server.url("slow", "disk.raw")
    kube.create(dv_path(namespace), datavolume("fault", {"http": {"url": url}}, size="64Mi"))
    before = restarts(controller)
    with PodWatcher(kube, namespace) as watcher:
        wait_phase(kube, namespace, "fault", ("ImportInProgress",), 90)
        wait_until(lambda: watcher.uids, "the importer pod to be seen", 30)
        time.sleep(1.0)  # the body is flowing
        holder = controller.lease()["spec"]["holderIdentity"]
        if fault == "frozen":
            with cluster.paused(component):
                time.sleep(RENEW_DEADLINE + 3.0)
            print(f"{component} frozen for {RENEW_DEADLINE + 3.0:.0f} s mid-transfer")
        else:
            down = cluster.restart(component, down_for=3.0)
            print(f"{component} unavailable for {down:.1f} s mid-transfer")
        dv = wait_phase(kube, namespace, "fault", ("Succeeded", "Failed"), 180)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"].get("restartCount", 0) == 0, dv["status"]
    assert len(watcher.uids) == 1, watcher.uids  # no second importer pod
    if fault == "frozen":  # the Lease changed hands: a new term, or the standby
        assert controller.lease()["spec"]["holderIdentity"] != holder
    assert restarts(controller) == before  # a lost Lease is not a crash
    local = Path(pv_of(kube, namespace, "fault")["spec"]["local"]["path"])
    same_prefix_then_zeros(local / "disk.img", images.reference)
