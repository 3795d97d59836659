"""CDI's alerts on the installed product: both controller replicas' ``/metrics`` (scraped at
their pods with the metrics reader's token, as the ServiceMonitor in
``deploy/optional/monitoring.yaml`` does) go through
``promtool test rules`` with the PrometheusRule's own rules. With the product healthy no
``CDINotReady`` fires (one replica leads: the max is 1, though the standby says 0), and a
StorageClass whose provisioner no table knows makes ``CDIStorageProfilesIncomplete`` fire for
it, by the labels the controller put on its profile."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.component.test_alert_rules import SCRAPE, _selector, expected, run_promtool
from tests.integration.datavolumes.metrics_env import metrics_ca, reader_token, scrape

pytestmark = pytest.mark.integration
ODD = "alerts-odd-class"


def controller_pods(kube: Kube) -> list[str]:
    pods = kube.get("/api/v1/namespaces/cdi/pods?labelSelector=app%3Dcdi-controller")["items"]
    return [p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP")]


def series(texts: dict[str, str]) -> list[dict[str, str]]:
    """Every replica's samples as Prometheus keeps them (an ``instance`` label each), held for
    30 minutes, with the scrapes' ``up``."""
    out = []
    for ip, text in texts.items():
        scrape_labels = {**SCRAPE, "instance": ip}
        out.append({"series": _selector("up", scrape_labels), "values": "1x30"})
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = {**s.labels, **scrape_labels}
                out.append({"series": _selector(s.name, labels), "values": f"{s.value:g}x30"})
    return out


def test_alerts_on_the_installed_products_metrics(
    kube: Kube, product: Product, tmp_path: Path
) -> None:
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": ODD},
          "provisioner": "example.invalid/nothing-known"}  # fmt: skip
    kube.create("/apis/storage.k8s.io/v1/storageclasses", sc)
    token, ca = reader_token(kube), metrics_ca(kube)  # what the ServiceMonitor uses
    try:

        def scraped() -> dict[str, str] | None:
            ips = controller_pods(kube)
            texts = {ip: scrape(ip, token, ca) for ip in ips}
            if len(ips) != 2 or any(t is None for t in texts.values()):
                return None
            if not any(f'storageclass="{ODD}"' in (t or "") for t in texts.values()):
                return None  # the leader has not profiled the class yet
            return {ip: t for ip, t in texts.items() if t is not None}

        texts = wait_until(scraped, "both controller replicas' metrics, with the odd class", 60)
        ready = sorted(
            s.value
            for t in texts.values()
            for f in text_string_to_metric_families(t)
            for s in f.samples
            if s.name == "kubevirt_cdi_cr_ready"
        )
        assert ready == [0.0, 1.0], ready  # a standby and the leader
        incomplete = sorted(
            (s.labels["storageclass"], s.labels["provisioner"])
            for t in texts.values()
            for f in text_string_to_metric_families(t)
            for s in f.samples
            if s.name == "kubevirt_cdi_storageprofile_info" and s.labels["complete"] == "false"
        )
        assert (ODD, "example.invalid/nothing-known") in incomplete
        alerts = {
            "CDINotReady": [],
            "CDIOperatorDown": [],
            "CDIStorageProfilesIncomplete": [
                expected("CDIStorageProfilesIncomplete", {"storageclass": c, "provisioner": p}, 1)
                for c, p in incomplete
            ],
        }
        run_promtool(tmp_path, series(texts), alerts)
    finally:
        kube.delete_ignore_missing(f"/apis/storage.k8s.io/v1/storageclasses/{ODD}")
