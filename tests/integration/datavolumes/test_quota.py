"""Namespaces with a ResourceQuota or LimitRange, on the real control plane with the product
installed (CDI scenarios 2.1/2.2 "quota", issue 26 "Quotas and limits").

The API server runs the ResourceQuota and LimitRanger admission plugins and the
kube-controller-manager its resourcequota controller, as in a real cluster:

- a claim the namespace's storage quota refuses leaves the DataVolume Pending with Bound
  ``ErrExceededQuota`` and an event; raising the quota lets it go on to Succeeded;
- a quota on ``limits.cpu``/``limits.memory`` admits only pods that state limits: the importer
  does (CDIConfig's, CDI's defaults 750m/600M), and while the quota is smaller than that the
  DataVolume waits in ImportScheduled with Running ``ErrExceededQuota`` ("Error starting pod"),
  never Failed, and finishes once the quota is raised;
- a host-assisted clone between two namespaces that each demand limits (a quota on limits and
  a LimitRange with a maximum and no defaults) succeeds: the importer, the upload server in the
  target namespace and the clone source pod in the source's all carry requests and limits.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    ImageServer,
    condition,
    datavolume,
    dv_path,
    events_for,
    wait_phase,
    wait_running_reason,
)
from tests.integration.datavolumes.test_clone_copy import copy_of
from tests.integration.datavolumes.test_clone_csi import succeeded

pytestmark = pytest.mark.integration

QUOTA = "small"


def quota_path(ns: str) -> str:
    return ns_path(ns, "resourcequotas", QUOTA)


def set_quota(kube: Kube, ns: str, hard: dict[str, str]) -> None:
    """Create or raise the namespace's quota and wait until the quota controller has taken it
    (admission decides on ``status.hard``; before that every create is refused)."""
    body = {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA}, "spec": {"hard": hard}}  # fmt: skip
    if kube.get_or_none(quota_path(ns)) is None:
        kube.create(ns_path(ns, "resourcequotas"), body)
    else:
        kube.patch(quota_path(ns), {"spec": {"hard": hard}})

    def taken() -> bool:
        status = kube.get(quota_path(ns)).get("status") or {}
        return set(hard) <= set(status.get("hard") or {}) and all(
            str(status["hard"][k]) == v for k, v in hard.items()
        )

    wait_until(taken, f"quota {ns}/{QUOTA} in force", 60)


def limit_range(kube: Kube, ns: str) -> None:
    """A maximum per container and no defaults: a container without limits is refused."""
    body = {"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "max"},
            "spec": {"limits": [{"type": "Container",
                                 "max": {"cpu": "2", "memory": "2Gi"}}]}}  # fmt: skip
    kube.create(ns_path(ns, "limitranges"), body)


@pytest.fixture
def namespaces(kube: Kube) -> Iterator[tuple[str, str]]:
    names = (f"quota-a-{secrets.token_hex(3)}", f"quota-b-{secrets.token_hex(3)}")
    for name in names:
        kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": name}})  # fmt: skip
        sa = ns_path(name, "serviceaccounts", "default")
        wait_until(lambda s=sa: kube.get_or_none(s), f"default service account in {name}", 30)
    yield names
    for name in names:
        kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def http_disk(server: ImageServer, name: str) -> dict[str, Any]:
    return datavolume(name, {"http": {"url": server.url("ok", "disk.qcow2")}}, size="64Mi")


def test_a_claim_over_the_storage_quota_waits_with_err_exceeded_quota_then_imports(
    kube: Kube, controller: Any, namespaces: tuple[str, str], image_server: ImageServer
) -> None:
    ns = namespaces[0]
    set_quota(kube, ns, {"requests.storage": "10Mi"})
    kube.create(dv_path(ns), http_disk(image_server, "disk"))

    def refused() -> dict[str, Any] | None:
        dv = kube.get(dv_path(ns, "disk"))
        bound = [c for c in (dv.get("status") or {}).get("conditions") or []
                 if c["type"] == "Bound"]  # fmt: skip
        return dv if bound and bound[0]["reason"] == "ErrExceededQuota" else None

    dv = wait_until(refused, "Bound ErrExceededQuota", 60)
    assert dv["status"]["phase"] == "Pending", dv["status"]
    assert "exceeded quota: small" in condition(dv, "Bound")["message"]
    assert kube.get_or_none(ns_path(ns, "persistentvolumeclaims", "disk")) is None
    warnings = [e for e in events_for(kube, ns, "disk") if e["reason"] == "ErrExceededQuota"]
    assert warnings and warnings[0]["type"] == "Warning", events_for(kube, ns, "disk")

    set_quota(kube, ns, {"requests.storage": "1Gi"})
    succeeded(kube, ns, "disk", timeout=120)


def test_an_importer_over_the_limits_quota_waits_scheduled_then_runs_with_cdis_limits(
    kube: Kube, controller: Any, namespaces: tuple[str, str], image_server: ImageServer
) -> None:
    ns = namespaces[0]
    # smaller than CDI's default limits (cpu 750m, memory 600M): the importer is refused
    set_quota(kube, ns, {"limits.cpu": "500m", "limits.memory": "2Gi"})
    kube.create(dv_path(ns), http_disk(image_server, "disk"))
    running = wait_running_reason(kube, ns, "disk", "ErrExceededQuota", timeout=60)
    assert running["status"] == "False"
    assert running["message"].startswith("Error starting pod 'importer-disk"), running
    assert "exceeded quota: small" in running["message"]
    seen: list[dict[str, Any]] = []
    wait_phase(kube, ns, "disk", ("ImportScheduled",), timeout=30, seen=seen)

    def bound() -> dict[str, Any] | None:
        dv = kube.get(dv_path(ns, "disk"))
        return dv if condition(dv, "Bound")["reason"] == "Bound" else None

    # the claim binds (Immediate class) while the pod is still refused
    dv = wait_until(bound, "the claim Bound while the importer waits for the quota", 30)
    assert dv["status"]["phase"] == "ImportScheduled", dv["status"]
    events = events_for(kube, ns, "disk")
    refusals = [e for e in events if e["reason"] == "ErrExceededQuota"]
    assert len(refusals) == 1 and refusals[0]["type"] == "Warning", events  # once, not per retry

    set_quota(kube, ns, {"limits.cpu": "2", "limits.memory": "2Gi"})
    dv = succeeded(kube, ns, "disk", timeout=120)
    assert dv["status"]["restartCount"] == 0, dv["status"]


def test_a_host_assisted_clone_between_namespaces_that_demand_limits(
    kube: Kube, controller: Any, namespaces: tuple[str, str], image_server: ImageServer,
    copy_classes: None,
) -> None:  # fmt: skip
    source_ns, target_ns = namespaces
    for ns in namespaces:
        set_quota(kube, ns, {"limits.cpu": "4", "limits.memory": "4Gi",
                             "requests.cpu": "2", "requests.memory": "2Gi"})  # fmt: skip
        limit_range(kube, ns)
    kube.create(dv_path(source_ns), http_disk(image_server, "golden"))
    succeeded(kube, source_ns, "golden", timeout=120)
    kube.create(dv_path(target_ns), copy_of("copy", source_ns, "golden", "Filesystem", "96Mi"))
    dv = succeeded(kube, target_ns, "copy", timeout=180)
    assert condition(dv, "Running")["message"] == "Clone Complete", dv["status"]
    for ns in namespaces:  # the quota counted the worker pods' limits: they stated them
        used = kube.get(quota_path(ns)).get("status", {}).get("used", {})
        assert set(used) >= {"limits.cpu", "limits.memory"}, used
