"""What a slimmed informer cache keeps of an object (``cdi.kube.informer_slim``)."""

from __future__ import annotations

from typing import Any

from cdi.kube.informer_slim import (
    LAST_APPLIED,
    MAX_KEPT_BYTES,
    Slim,
    is_partial,
    keys_only,
    kubevirt_and,
    kubevirt_key,
)


def claim(annotations: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "c",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": "7",
            "annotations": annotations,
            "labels": labels or {},
            "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:metadata": {}}}],
            "ownerReferences": [{"kind": "DataVolume", "name": "c", "uid": "d1"}],
        },
        "spec": {"storageClassName": "fast"},
        "status": {"phase": "Bound"},
    }


def test_managed_fields_and_last_applied_are_dropped_and_the_rest_kept_whole() -> None:
    obj = claim({LAST_APPLIED: "{...}", "cdi.kubevirt.io/storage.pod.phase": "Running"})
    slim = Slim()(obj)
    assert "managedFields" not in slim["metadata"]
    assert slim["metadata"]["annotations"] == {"cdi.kubevirt.io/storage.pod.phase": "Running"}
    assert slim["spec"] == {"storageClassName": "fast"} and slim["status"] == {"phase": "Bound"}
    assert slim["metadata"]["ownerReferences"][0]["uid"] == "d1"
    assert not is_partial(slim)  # nothing a reader reads was dropped


def test_keys_no_reader_reads_are_dropped_without_marking_the_object_partial() -> None:
    reads = kubevirt_and({"volume.kubernetes.io/selected-node"})
    obj = claim(
        {
            "tenant.example/junk": "x" * 100_000,
            "volume.kubernetes.io/selected-node": "n1",
            "cdi.kubevirt.io/storage.import.endpoint": "https://e",
        },
        labels={"app": "web", "instancetype.kubevirt.io/default-preference": "p"},
    )
    slim = Slim(reads)(obj)
    assert slim["metadata"]["annotations"] == {
        "volume.kubernetes.io/selected-node": "n1",
        "cdi.kubevirt.io/storage.import.endpoint": "https://e",
    }
    assert slim["metadata"]["labels"] == {"instancetype.kubevirt.io/default-preference": "p"}
    assert not is_partial(slim)


def test_over_budget_the_largest_entries_go_and_the_object_says_it_is_partial() -> None:
    big = {f"cdi.kubevirt.io/junk-{i}": "x" * 6000 for i in range(4)}
    obj = claim({**big, "cdi.kubevirt.io/storage.populator.kind": "VolumeImportSource"})
    slim = Slim(kubevirt_and(()))(obj)
    kept = slim["metadata"]["annotations"]
    assert kept["cdi.kubevirt.io/storage.populator.kind"] == "VolumeImportSource"
    assert sum(len(k) + len(v) for k, v in kept.items()) <= MAX_KEPT_BYTES
    assert len(kept) < len(big) + 1
    assert all(v == big[k] for k, v in kept.items() if k in big)  # never truncated
    assert is_partial(slim)


def test_keys_only_keeps_the_identity_alone() -> None:
    got = keys_only(claim({"a": "b"}))
    assert got == {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c", "namespace": "ns", "uid": "u1", "resourceVersion": "7"},
    }


def test_kubevirt_domains_are_recognized_by_prefix() -> None:
    assert kubevirt_key("cdi.kubevirt.io/storage.pod.phase")
    assert kubevirt_key("cdi.kubevirt.io")  # CDI's component label: a bare domain key
    assert kubevirt_key("kubevirt.io/created-by")
    assert kubevirt_key("instancetype.kubevirt.io/default-instancetype")
    assert not kubevirt_key("evilkubevirt.io/x")
    assert not kubevirt_key("tenant.example/kubevirt.io")
    assert not is_partial(None)
