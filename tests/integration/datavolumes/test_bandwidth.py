"""The import bandwidth cap on the real API server with the product installed (issue 28, "Fair
sharing"): CDIConfig's ``spec.importBandwidthLimit`` caps every import, a DataVolume's
``cdi.kubevirt.io/storage.import.bandwidthLimit`` annotation lowers it for that import and
never raises it, the importer pod gets the cap as ``IMPORTER_BANDWIDTH_LIMIT`` and the import
takes at least as long as the cap says; an annotation that is not a rate leaves the
DataVolume waiting with a condition that names it, never Failed."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import Images, ImageServer, datavolume, dv_path
from tests.integration.datavolumes.test_clone_csi import succeeded

pytestmark = pytest.mark.integration

CONFIG = "/apis/cdi.kubevirt.io/v1beta1/cdiconfigs/config"
LIMIT = "cdi.kubevirt.io/storage.import.bandwidthLimit"
RETAIN = "cdi.kubevirt.io/storage.pod.retainAfterCompletion"
MiB = 1024 * 1024


@pytest.fixture
def cluster_cap(kube: Kube, controller: Any) -> Iterator[None]:
    kube.patch(CONFIG, {"spec": {"importBandwidthLimit": "4Mi"}})
    time.sleep(2)  # the controller's CDIConfig informer takes the change
    yield
    kube.patch(CONFIG, {"spec": {"importBandwidthLimit": None}})


def capped(name: str, url: str, limit: str | None) -> dict[str, Any]:
    dv = datavolume(name, {"http": {"url": url}})
    annotations = dv["metadata"].setdefault("annotations", {})
    annotations[RETAIN] = "true"
    if limit is not None:
        annotations[LIMIT] = limit
    return dv


def importer(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    pods = kube.get(ns_path(ns, "pods"))["items"]
    mine = [p for p in pods if p["metadata"]["name"].startswith(f"importer-{name}")]
    assert len(mine) == 1, [p["metadata"]["name"] for p in pods]
    return mine[0]


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    container = pod["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def import_seconds(pod: dict[str, Any]) -> float:
    for status in pod["status"].get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated and terminated.get("message"):
            return float(json.loads(terminated["message"])["duration_seconds"])
    raise AssertionError(f"no termination message: {pod['status']}")


def test_the_cluster_cap_applies_and_a_datavolume_may_only_lower_it(
    kube: Kube, namespace: str, cluster_cap: None, image_server: ImageServer, images: Images
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    wire = images.path("disk.qcow2").stat().st_size
    kube.create(dv_path(namespace), capped("plain", url, None))
    kube.create(dv_path(namespace), capped("lower", url, "1Mi"))
    kube.create(dv_path(namespace), capped("higher", url, "1Gi"))
    for name in ("plain", "lower", "higher"):
        succeeded(kube, namespace, name, timeout=120)
    want = {"plain": 4 * MiB, "lower": MiB, "higher": 4 * MiB}
    for name, rate in want.items():
        pod = importer(kube, namespace, name)
        assert env_of(pod)["IMPORTER_BANDWIDTH_LIMIT"] == str(rate), name
    # the ok/ path serves at loopback speed: only the cap makes the import this slow
    slow = import_seconds(importer(kube, namespace, "lower"))
    assert slow >= 0.9 * wire / MiB, (slow, wire)


def test_an_annotation_that_is_not_a_rate_is_named_and_never_fails_the_datavolume(
    kube: Kube, namespace: str, controller: Any, image_server: ImageServer
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    kube.create(dv_path(namespace), capped("bad", url, "fast"))

    def named() -> dict[str, Any] | None:
        dv = kube.get(dv_path(namespace, "bad"))
        for c in (dv.get("status") or {}).get("conditions") or []:
            if LIMIT in (c.get("message") or ""):
                return dv
        return None

    dv = wait_until(named, "a condition naming the annotation", 60)
    assert dv["status"]["phase"] != "Failed", dv["status"]
    message = " ".join(c.get("message") or "" for c in dv["status"]["conditions"])
    assert "'fast' is not a quantity of bytes per second" in message, message
    assert not [p for p in kube.get(ns_path(namespace, "pods"))["items"]
                if p["metadata"]["name"].startswith("importer-bad")]  # fmt: skip


@pytest.fixture
def one_at_a_time(kube: Kube, controller: Any) -> Iterator[None]:
    kube.patch(CONFIG, {"spec": {"maxConcurrentImports": 1}})
    time.sleep(2)  # the controller's CDIConfig informer takes the change
    yield
    kube.patch(CONFIG, {"spec": {"maxConcurrentImports": None}})


def alive(pod: dict[str, Any]) -> bool:
    meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase", "Pending")
    return not meta.get("deletionTimestamp") and phase in ("Pending", "Running")


def test_at_most_the_limit_of_imports_run_and_the_rest_start_in_creation_order(
    kube: Kube, namespace: str, one_at_a_time: None, image_server: ImageServer, images: Images
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    names = ["a-first", "b-second", "c-third"]  # creationTimestamp has whole seconds: ties
    for name in names:  # fall back to the name, so this is the creation order either way
        kube.create(dv_path(namespace), capped(name, url, "1Mi"))  # ~2.5 s each
    queued: set[str] = set()
    most = 0

    def all_done() -> bool:
        nonlocal most
        pods = [p for p in kube.get(ns_path(namespace, "pods"))["items"]
                if p["metadata"]["name"].startswith("importer-")]  # fmt: skip
        most = max(most, sum(alive(p) for p in pods))
        phases = []
        for name in names:
            dv = kube.get(dv_path(namespace, name))
            status = dv.get("status") or {}
            phases.append(status.get("phase"))
            for c in status.get("conditions") or []:
                if c["type"] == "Running" and c.get("reason") == "ImportQueued":
                    queued.add(name)
                    assert "at most 1 imports run at once" in c["message"], c
        return all(p == "Succeeded" for p in phases)

    wait_until(all_done, "three DataVolumes Succeeded", 180, interval=0.2)
    assert most == 1, most
    assert {"b-second", "c-third"} <= queued, queued
    pods = {name: importer(kube, namespace, name) for name in names}
    for earlier, later in itertools.pairwise(names):
        finished = pods[earlier]["status"]["containerStatuses"][0]["state"]["terminated"]
        started = pods[later]["metadata"]["creationTimestamp"]
        assert started >= finished["finishedAt"], (earlier, later)
