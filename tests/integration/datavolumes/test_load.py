"""Twenty DataVolumes created at once (half blank, half http) on the deployed product: all of
them succeed, each with exactly one worker pod. The CI-sized slice of
``benchmarks/load_datavolumes.py``, which runs 200 and reports latencies and memory; nothing is
timed here beyond a generous deadline."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import ImageServer, datavolume, dv_path
from tests.integration.datavolumes.test_faults_control_plane import PodWatcher

pytestmark = pytest.mark.integration

COUNT = 20


def test_twenty_datavolumes_at_once_all_succeed_with_one_pod_each(
    kube: Kube, namespace: str, controller: Product, image_server: ImageServer
) -> None:
    url = image_server.url("ok", "disk.raw.gz")

    def create(i: int) -> None:
        source = {"http": {"url": url}} if i % 2 else {"blank": {}}
        kube.create(dv_path(namespace), datavolume(f"many-{i:02d}", source, size="32Mi"))

    def phases() -> dict[str, str] | None:
        items = kube.get(dv_path(namespace))["items"]
        found = {d["metadata"]["name"]: (d.get("status") or {}).get("phase", "") for d in items}
        done = len(found) == COUNT and all(p in ("Succeeded", "Failed") for p in found.values())
        return found if done else None

    with PodWatcher(kube, namespace) as watcher, ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(COUNT)))
        final = wait_until(phases, f"{COUNT} DataVolumes to finish", 300, interval=1.0)
    assert set(final.values()) == {"Succeeded"}, final
    # No DataVolume got a second worker pod (a pod may live shorter than the 0.2 s poll).
    assert 0 < len(watcher.uids) <= COUNT, len(watcher.uids)
