"""Controller metrics from real informer caches of the real API server, and the RBAC the new
reconcilers need (SubjectAccessReview against deploy/'s roles)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdi.controller.metrics import ControllerMetrics, Sources
from cdi.kube.client import DATAVOLUMES, STORAGE_CLASSES, STORAGE_PROFILES, load_api_client
from cdi.kube.client import Kube as ProductKube
from cdi.kube.informer import Informer, wait_all_synced
from testkit.cluster import Cluster, free_port
from testkit.kubeclient import Kube
from testkit.kubeconfig import ADMIN
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import ControllerProcess, dv_path
from tests.integration.datavolumes.metrics_env import get, metrics_ca
from tests.integration.datavolumes.test_deploy import applied_rbac, can  # noqa: F401

pytestmark = pytest.mark.integration


def labels_of(metrics: ControllerMetrics, name: str) -> list[dict[str, str]]:
    text = metrics.exposition().decode()
    return [
        dict(s.labels)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


async def test_storage_profile_info_and_datavolume_phases_from_the_cluster(
    cluster: Cluster, kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    wait_until(
        lambda: (
            kube.get_or_none("/apis/cdi.kubevirt.io/v1beta1/storageprofiles/testkit-block") or {}
        ).get("status"),
        "profiles written by the controller",
        30,
    )
    blank = {"blank": {}}
    kube.create(
        dv_path(namespace),
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": "counted"},
            "spec": {"source": blank, "storage": {"resources": {"requests": {"storage": "8Mi"}}}},
        },
    )
    product = ProductKube(load_api_client(cluster.kubeconfig))
    informers = [Informer(product, r) for r in (DATAVOLUMES, STORAGE_CLASSES, STORAGE_PROFILES)]
    for informer in informers:
        informer.start()
    try:
        async with asyncio.timeout(30):
            await wait_all_synced(informers)
        metrics = ControllerMetrics(Sources(*informers))
        info = {
            i["storageclass"]: i for i in labels_of(metrics, "kubevirt_cdi_storageprofile_info")
        }
        assert info["testkit-fs"] == {
            "storageclass": "testkit-fs",
            "provisioner": "testkit.local/loop",
            "complete": "true",
            "default": "true",
            "virtdefault": "false",
            "rwx": "false",
            "smartclone": "true",  # the local provisioner clones (csi-clone)
            "degraded": "true",
        }
        assert info["testkit-block"]["default"] == "false"
        phases = {i["phase"] for i in labels_of(metrics, "cdi_datavolumes")}
        assert phases, "the DataVolume is counted by phase"
    finally:
        for informer in informers:
            informer.stop()


def test_a_standby_controller_process_serves_metrics_and_stops_cleanly(
    cluster: Cluster, controller: ControllerProcess, tmp_path: Path
) -> None:
    """``cdi controller --metrics-port``: the session controller leads, so this one waits for
    the Lease; it still answers /metrics (with empty cache-derived families), over TLS as
    deployed (``--metrics-tls``: the certificate it keeps in the Secret, written while it stands
    by), to a token the API server accepts and allows (the admin's) and not without one: its
    reviews and its certificate are not fenced by the Lease it does not hold."""
    port = free_port()
    standby = ControllerProcess(cluster, tmp_path, args=(f"--metrics-port={port}",)).start()
    try:
        url = f"https://127.0.0.1:{port}/metrics"
        ca = metrics_ca(cluster.kube())
        body = wait_until(
            lambda: _get(url, cluster.token(ADMIN), ca), "the standby's /metrics", 30, 0.5
        )
        assert get(url, None, ca)[0] == 401
        assert "# TYPE controller_runtime_reconcile_time_seconds histogram" in body
        assert "# TYPE kubevirt_cdi_storageprofile_info gauge" in body
        assert "kubevirt_cdi_storageprofile_info{" not in body  # standby: no cache yet
    finally:
        code = standby.stop()
    assert code == 0, standby.log()[-3000:]


def _get(url: str, token: str, ca: bytes) -> str | None:
    status, body = get(url, token, ca)
    return body if status == 200 else None


NEW_RULES_MAY = [
    ("create", "storageprofiles", "cdi.kubevirt.io", None, None, None),
    ("delete", "storageprofiles", "cdi.kubevirt.io", None, "gone", None),
    ("update", "storageprofiles", "cdi.kubevirt.io", None, "x", "status"),
    ("create", "cdiconfigs", "cdi.kubevirt.io", None, None, None),
    ("update", "cdiconfigs", "cdi.kubevirt.io", None, "config", "status"),
    # a CDI resource's spec.config becomes CDIConfig's spec (issue 26), as CDI's operator does
    ("update", "cdiconfigs", "cdi.kubevirt.io", None, "config", None),
    ("get", "services", "", "cdi", "cdi-uploadproxy", None),
    ("list", "ingresses", "networking.k8s.io", "cdi", None, None),
]
NEW_RULES_MUST_NOT = [
    ("update", "cdiconfigs", "cdi.kubevirt.io", None, "other", None),  # only the singleton
    ("update", "storageprofiles", "cdi.kubevirt.io", None, "x", None),  # spec: the admin's
    # the upload flavour reads Services anywhere (its servers'), but changes none it did not make
    ("update", "services", "", "cdi", "cdi-uploadproxy", None),
    ("patch", "services", "", "some-ns", "cdi-upload-x", None),
    ("get", "secrets", "", "some-ns", "x", None),  # never reads tenants' Secrets
]


@pytest.mark.usefixtures("applied_rbac")
@pytest.mark.parametrize("rule", NEW_RULES_MAY, ids=lambda r: f"{r[0]}-{r[1]}-{r[5] or ''}")
def test_controller_may_keep_profiles_and_config(
    kube: Kube,
    rule: tuple,
) -> None:
    verb, resource, group, ns, name, sub = rule
    assert can(kube, "cdi-controller", verb, resource, group, ns, name, sub)


@pytest.mark.usefixtures("applied_rbac")
@pytest.mark.parametrize("rule", NEW_RULES_MUST_NOT, ids=lambda r: f"{r[0]}-{r[1]}-{r[3]}")
def test_controller_may_not_touch_what_admins_own(
    kube: Kube,
    rule: tuple,
) -> None:
    verb, resource, group, ns, name, sub = rule
    assert not can(kube, "cdi-controller", verb, resource, group, ns, name, sub)
