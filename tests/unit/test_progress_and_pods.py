"""Progress parsing from the importer's metrics, deterministic attempt pods, owner mapping."""

from __future__ import annotations

from cdi.api.types import DataVolume
from cdi.controller.datavolume import owner_key
from cdi.controller.pods import owned_pods
from cdi.controller.progress import parse_metrics
from cdi.kube.client import PODS
from cdi.kube.watches import Owns, Request
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.naming import importer_pod_name
from cdi.render.worker_pod import Metrics

METRICS = """# HELP kubevirt_cdi_import_progress_total The import progress in percentage
# TYPE kubevirt_cdi_import_progress_total counter
kubevirt_cdi_import_progress_total{ownerUID="other"} 99.0
kubevirt_cdi_import_progress_total{ownerUID="uid-1"} 37.5
cdi_import_bytes_done{ownerUID="uid-1"} 1048576.0
cdi_import_bytes_total{ownerUID="uid-1"} 2097152.0
cdi_import_rate_bytes_per_second{ownerUID="uid-1"} 524288.0
cdi_import_phase{ownerUID="uid-1",phase="Transferring"} 1.0
"""


def test_progress_is_read_for_our_owner_only() -> None:
    p = parse_metrics(METRICS, "uid-1")
    assert p is not None
    assert (p.percent, p.bytes_done, p.bytes_total, p.rate) == (37.5, 1048576, 2097152, 524288.0)
    assert p.text == "37.50%"
    assert parse_metrics(METRICS, "nobody") is None
    assert parse_metrics("garbage\n{}", "uid-1") is None


def test_attempt_pods_have_deterministic_names() -> None:
    assert importer_pod_name("disk", 0) == "importer-disk"
    assert importer_pod_name("disk", 2) == "importer-disk-retry-2"
    long = "x" * 250
    assert len(importer_pod_name(long, 1)) <= 253
    assert importer_pod_name(long, 1) == importer_pod_name(long, 1)


def _dv() -> DataVolume:
    return DataVolume.from_dict(
        {
            "metadata": {"name": "disk", "namespace": "ns", "uid": "uid-1"},
            "spec": {
                "source": {"blank": {}},
                "pvc": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        }
    )


def test_attempt_pod_binds_metrics_to_the_pod_ip_and_uses_the_image_entrypoint() -> None:
    pvc = {
        "metadata": {"name": "disk", "namespace": "ns"},
        "spec": {"resources": {"requests": {"storage": "1Gi"}}},
    }
    config = ImporterPodConfig(
        image="importer", command=(), attempt=1, metrics=Metrics(on_pod_ip=True)
    )
    pod = render_importer_pod(_dv(), pvc, config)
    assert pod["metadata"]["name"] == "importer-disk-retry-1"
    assert pod["metadata"]["labels"]["cdi.kubevirt.io/importAttempt"] == "1"
    assert pod["spec"]["restartPolicy"] == "Never"
    container = pod["spec"]["containers"][0]
    assert "command" not in container
    env = {e["name"]: e for e in container["env"]}
    assert env["IMPORTER_METRICS_ADDR"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    owner = pod["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"], owner["controller"]) == ("DataVolume", "uid-1", True)


def test_children_map_to_their_datavolume_key() -> None:
    ref = {"kind": "DataVolume", "name": "disk", "uid": "u", "controller": True}
    pod = {"metadata": {"name": "importer-disk", "namespace": "ns", "ownerReferences": [ref]}}
    adopted = {
        "metadata": {
            "name": "disk",
            "namespace": "ns",
            "annotations": {"cdi.kubevirt.io/createdForDataVolume": "u"},
        }
    }
    stranger = {"metadata": {"name": "x", "namespace": "ns"}}
    assert Owns(PODS, ("DataVolume",)).requests(pod) == [Request("ns/disk")]
    assert owner_key(adopted) == "ns/disk"
    assert owner_key(stranger) is None
    assert list(owned_pods([pod, stranger], "u")) == ["importer-disk"]
