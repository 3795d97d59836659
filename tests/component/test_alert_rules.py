"""CDI's alerts (``deploy/optional/monitoring.yaml``) evaluated by Prometheus' own ``promtool
test rules`` against what the controller's collector exposes (``cdi.controller.metrics``).

Each case builds the collector over in-memory stores holding the objects of one situation (an
incomplete StorageProfile, an outdated DataImportCron, DataVolumes whose workers restarted
more than 3 times, ...), takes its exposition exactly as ``/metrics`` serves it, holds those
samples for 30 minutes of promtool's synthetic time (plus the ``up`` series a scrape of the
controller leaves), and asks which alerts fire at 20 minutes: every alert in a healthy cluster
stays silent; in the troubled one each fires with its labels and rendered annotations.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from cdi.controller.metrics import ControllerMetrics, Sources, cron_view

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = ROOT / "hack" / "promtool" / "bin" / "promtool"  # hack/promtool/build.sh
MONITORING = ROOT / "deploy" / "optional" / "monitoring.yaml"
SCRAPE = {"namespace": "cdi", "job": "cdi-controller-metrics"}


class Store:
    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    def get(self, key: str) -> dict[str, Any] | None:
        return next((o for o in self.objects if o["metadata"]["name"] == key), None)

    def items(self) -> list[dict[str, Any]]:
        return list(self.objects)


def rules() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(MONITORING.read_text()) if d]
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def alert_rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules()["groups"] for r in g["rules"] if "alert" in r}


def storage_class(name: str, default: bool = False) -> dict[str, Any]:
    ann = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": {"name": name, "annotations": ann}, "provisioner": f"{name}.csi"}


def profile(name: str, complete: bool) -> dict[str, Any]:
    status: dict[str, Any] = {"storageClass": name, "provisioner": f"{name}.csi"}
    if complete:
        status["claimPropertySets"] = [
            {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}
        ]
        status["cloneStrategy"] = "copy"
    return {"metadata": {"name": name}, "spec": {}, "status": status}


def datavolume(
    name: str, source: dict[str, Any], restarts: int = 0, phase: str = "Succeeded",
    storage_class: str | None = "fast",
) -> dict[str, Any]:  # fmt: skip
    storage = {"storageClassName": storage_class} if storage_class else {}
    return {"metadata": {"name": name, "namespace": "vms", "uid": f"uid-{name}"},
            "spec": {"source": source, "storage": storage},
            "status": {"phase": phase, "restartCount": restarts}}  # fmt: skip


def cron(name: str, up_to_date: bool, storage_class: str | None = "fast") -> dict[str, Any]:
    claim = {"storageClassName": storage_class} if storage_class else {}
    return cron_view({
        "metadata": {"name": name, "namespace": "golden", "uid": f"uid-{name}"},
        "spec": {"template": {"spec": {"storage": claim}}},
        "status": {"conditions": [{"type": "UpToDate", "status": str(up_to_date),
                                   "reason": "UpToDate" if up_to_date else "ImportProgressing",
                                   "message": "not kept"}]},
    })  # fmt: skip


HTTP = {"http": {"url": "http://images.example/disk.qcow2"}}
HEALTHY = {
    "classes": [storage_class("fast", default=True)],
    "profiles": [profile("fast", complete=True)],
    "dvs": [datavolume("a", HTTP), datavolume("b", {"upload": {}}, restarts=2)],
    "crons": [cron("fedora", up_to_date=True)],
    "ready": True,
}
TROUBLED = {
    "classes": [storage_class("fast"), storage_class("odd")],
    "profiles": [profile("fast", complete=True), profile("odd", complete=False)],
    "dvs": [
        datavolume("a", HTTP, restarts=5, phase="ImportInProgress"),
        datavolume(
            "c",
            {"pvc": {"namespace": "vms", "name": "golden"}},
            restarts=4,
            phase="CloneInProgress",
        ),
        datavolume("p", HTTP, phase="Pending", storage_class=None),
    ],
    "crons": [cron("fedora", up_to_date=False), cron("nowhere", False, storage_class=None)],
    "ready": False,  # every replica a standby
}


def exposition(situation: dict[str, Any]) -> str:
    sources = Sources(
        Store(situation["dvs"]),
        Store(situation["classes"]),
        Store(situation["profiles"]),
        Store(situation["crons"]),
        ready=lambda: bool(situation["ready"]),
    )
    return ControllerMetrics(sources).exposition().decode()


def series_of(text: str, up: int = 1) -> list[dict[str, str]]:
    """promtool input series: every sample of the exposition, and the scrape's ``up``."""
    out = [{"series": _selector("up", SCRAPE), "values": f"{up}x30"}]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = sample.value
            out.append({"series": _selector(sample.name, sample.labels),
                        "values": f"{value:g}x30"})  # fmt: skip
    return out


def _selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def rendered(alert: str, labels: dict[str, str], value: float) -> dict[str, str]:
    """The alert's annotations as Prometheus renders them for ``labels`` and ``value``."""

    def fill(text: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), text)
        return text.replace("{{ $value }}", f"{value:g}")

    return {k: fill(v) for k, v in alert_rules()[alert]["annotations"].items()}


def expected(alert: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    rule_labels = alert_rules()[alert]["labels"]
    return {"exp_labels": {**rule_labels, **labels},
            "exp_annotations": rendered(alert, labels, value)}  # fmt: skip


def run_promtool(tmp_path: Path, series: list[dict[str, str]], alerts: dict[str, list]) -> str:
    assert PROMTOOL.exists(), (
        f"{PROMTOOL} missing: run hack/promtool/build.sh (scripts/test.sh does)"
    )
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules()))
    test = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "alert_rule_test": [
                {"eval_time": "20m", "alertname": name, "exp_alerts": exp}
                for name, exp in alerts.items()
            ],
        }],
    }  # fmt: skip
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test))
    done = subprocess.run(
        [str(PROMTOOL), "test", "rules", "test.yaml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_rules_are_valid_for_prometheus(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules()))
    done = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "rules.yaml")],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(alert_rules()) == {
        "CDIOperatorDown", "CDINotReady", "CDIDataVolumeUnusualRestartCount",
        "CDIStorageProfilesIncomplete", "CDIDataImportCronOutdated", "CDINoDefaultStorageClass",
    }  # fmt: skip


def test_a_healthy_cluster_raises_no_alert(tmp_path: Path) -> None:
    run_promtool(tmp_path, series_of(exposition(HEALTHY)), {a: [] for a in alert_rules()})


def test_each_trouble_raises_its_alert(tmp_path: Path) -> None:
    text = exposition(TROUBLED)
    assert (
        'kubevirt_cdi_dataimportcron_outdated{cron_name="nowhere",namespace="golden",'
        'pending="true"} 1.0' in text
    )
    alerts = {
        "CDINotReady": [expected("CDINotReady", {}, 0)],
        "CDIStorageProfilesIncomplete": [
            expected("CDIStorageProfilesIncomplete",
                     {"storageclass": "odd", "provisioner": "odd.csi"}, 1)
        ],
        # "nowhere" waits for a default class: pending, not outdated
        "CDIDataImportCronOutdated": [
            expected("CDIDataImportCronOutdated", {"namespace": "golden", "cron_name": "fedora"}, 1)
        ],
        # an import and a clone: one alert, counting both
        "CDIDataVolumeUnusualRestartCount": [expected("CDIDataVolumeUnusualRestartCount", {}, 2)],
        "CDINoDefaultStorageClass": [expected("CDINoDefaultStorageClass", {}, 1)],
        "CDIOperatorDown": [],
    }  # fmt: skip
    run_promtool(tmp_path, series_of(text), alerts)


def test_a_controller_no_scrape_reaches_is_down(tmp_path: Path) -> None:
    alerts = {"CDIOperatorDown": [expected("CDIOperatorDown", {}, 0)], "CDINotReady": []}
    run_promtool(tmp_path, series_of("", up=0), alerts)


@pytest.mark.parametrize("restarts, fires", [(3, False), (4, True)])
def test_more_than_three_restarts_is_unusual(tmp_path: Path, restarts: int, fires: bool) -> None:
    situation = {**HEALTHY, "dvs": [datavolume("u", {"upload": {}}, restarts=restarts)]}
    exp = [expected("CDIDataVolumeUnusualRestartCount", {}, 1)] if fires else []
    run_promtool(tmp_path, series_of(exposition(situation)),
                 {"CDIDataVolumeUnusualRestartCount": exp})  # fmt: skip
