"""Where worker pods may run (``cdi.render.placement``): the CDI resource's workload placement on
every worker pod, a DataVolume's node selector only narrowing it, a placed claim's node, and a
clone source pinned beside the pod already reading its ReadWriteOnce volume."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.config import CDIConfig, CDIConfigStatus, NodePlacement
from cdi.api.types import DataVolume
from cdi.render.clone_pod import CloneSourcePod, reader_node, render_clone_source_pod
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.placement import (
    ANN_POD_NODE_SELECTOR,
    PlacementError,
    node_selector_annotation,
    pod_placement,
)
from cdi.render.prime import render_prime
from cdi.render.pvc import USER_SETTABLE
from cdi.render.upload_pod import UploadPodConfig, render_upload_pod
from cdi.render.worker_pod import WorkerPod
from cdi.webhooks.validation import StaticLookup, validate_datavolume

TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule"}
ZONE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            ]
        }
    }
}
WORKLOAD = NodePlacement(
    node_selector={"kubernetes.io/os": "linux"},
    affinity=ZONE_AFFINITY,
    tolerations=(TOLERATION,),
)
CONFIG = CDIConfig(status=CDIConfigStatus(workload=WORKLOAD))


def terms(spec: dict[str, Any]) -> list[dict[str, Any]]:
    required = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return list(required["nodeSelectorTerms"])


def dv(annotations: dict[str, str] | None = None) -> DataVolume:
    return DataVolume.from_dict({
        "metadata": {"name": "disk", "namespace": "vms", "uid": "dv-uid",
                     "annotations": annotations or {}},
        "spec": {"source": {"http": {"url": "https://h/disk.img"}},
                 "pvc": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}},
    })  # fmt: skip


def claim(**annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "disk", "namespace": "vms", "uid": "pvc-uid",
                     "annotations": annotations},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }  # fmt: skip


def test_without_a_workload_placement_a_pod_goes_anywhere() -> None:
    assert pod_placement(NodePlacement()) == {}
    pod = render_importer_pod(dv(), claim(), ImporterPodConfig(image="importer"))
    assert not {"nodeSelector", "tolerations", "affinity"} & set(pod["spec"])


def test_the_workload_placement_is_every_worker_pods() -> None:
    importer = render_importer_pod(dv(), claim(), ImporterPodConfig(image="i", cdi_config=CONFIG))
    upload = render_upload_pod(claim(), UploadPodConfig(image="u", deadline="x", cdi_config=CONFIG))
    source = {"metadata": {"name": "golden", "namespace": "vms"}, "spec": {}}
    clone = render_clone_source_pod(
        dv(), source, claim(), CloneSourcePod(WorkerPod(image="c"), "s", cdi_config=CONFIG)
    )
    for pod in (importer, upload, clone):
        spec = pod["spec"]
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
        assert spec["tolerations"] == [TOLERATION]
        assert terms(spec) == terms({"affinity": ZONE_AFFINITY})


def test_a_datavolumes_node_selector_narrows_each_of_the_admins_alternatives() -> None:
    selector = '{"disk": "ssd"}'
    pod = render_importer_pod(
        dv({ANN_POD_NODE_SELECTOR: selector}),
        claim(),
        ImporterPodConfig(image="i", cdi_config=CONFIG),
    )
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}  # the admin's, untouched
    ssd = {"key": "disk", "operator": "In", "values": ["ssd"]}
    assert [t["matchExpressions"][-1] for t in terms(spec)] == [ssd, ssd]
    assert [t["matchExpressions"][0]["values"] for t in terms(spec)] == [["a"], ["b"]]
    assert spec["tolerations"] == [TOLERATION]  # no toleration comes from a DataVolume


def test_a_claim_placed_on_a_node_pins_its_worker_pod_there() -> None:
    placed = claim(**{"volume.kubernetes.io/selected-node": "node-2"})
    pod = render_upload_pod(placed, UploadPodConfig(image="u", deadline="x"))
    assert terms(pod["spec"]) == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
    ]


def test_the_node_selector_reaches_the_claim_and_the_prime() -> None:
    assert ANN_POD_NODE_SELECTOR in USER_SETTABLE
    target = claim(**{ANN_POD_NODE_SELECTOR: '{"disk": "ssd"}'})
    prime = render_prime(target, {"kind": "VolumeUploadSource", "spec": {}})
    assert prime["metadata"]["annotations"][ANN_POD_NODE_SELECTOR] == '{"disk": "ssd"}'
    pod = render_upload_pod(prime | {"metadata": {**prime["metadata"], "uid": "p"}},
                            UploadPodConfig(image="u", deadline="x"))  # fmt: skip
    assert terms(pod["spec"])[0]["matchExpressions"] == [
        {"key": "disk", "operator": "In", "values": ["ssd"]}
    ]


@pytest.mark.parametrize("bad", ["{", '["disk"]', '{"disk": 1}'])
def test_a_malformed_node_selector_is_refused_at_admission(bad: str) -> None:
    with pytest.raises(PlacementError):
        node_selector_annotation({ANN_POD_NODE_SELECTOR: bad})
    obj = dv({ANN_POD_NODE_SELECTOR: bad}).to_dict()
    verdict = validate_datavolume(obj, None, StaticLookup(), namespace="vms")
    assert not verdict.allowed
    assert ANN_POD_NODE_SELECTOR in verdict.messages[0]


def running(node: str, claim_name: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "spec": {"nodeName": node,
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim_name,
                                                                     "readOnly": True}}]},
        "status": {"phase": phase},
    }  # fmt: skip


def test_a_read_write_once_source_read_on_a_node_pins_the_clone_source_pod_there() -> None:
    rwo = {"metadata": {"name": "golden", "namespace": "vms"},
           "spec": {"accessModes": ["ReadWriteOnce"]}}  # fmt: skip
    rwx = {**rwo, "spec": {"accessModes": ["ReadWriteMany"]}}
    pods = [running("node-1", "other"), running("node-3", "golden", "Succeeded"),
            running("node-2", "golden")]  # fmt: skip
    assert reader_node(pods, rwo) == "node-2"
    assert reader_node(pods, rwx) is None  # any node can attach it
    assert reader_node(pods[:2], rwo) is None  # nobody reads it: its volume's own affinity
    config = CloneSourcePod(WorkerPod(image="c"), "s", source_node="node-2")
    pod = render_clone_source_pod(dv(), rwo, claim(), config)
    assert terms(pod["spec"]) == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-2"]}]}
    ]
    preferred = pod["spec"]["affinity"]["podAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    beside = preferred[0]["podAffinityTerm"]
    assert beside["labelSelector"] == {"matchLabels": {"cdi.kubevirt.io/uploadTarget": "pvc-uid"}}
    assert beside["namespaces"] == ["vms"]
