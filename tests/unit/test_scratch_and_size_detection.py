"""Pure renderers of issue 27's scratch claim (CDI ``createScratchPersistentVolumeClaim``,
``GetScratchPvcStorageClass``) and size-detection pod (``makeSizeDetectionPodSpec``)."""

from __future__ import annotations

from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.render.pvc import required_space
from cdi.render.scratch import render_scratch_pvc, scratch_size, scratch_storage_class
from cdi.render.size_detection import (
    measured_annotations,
    render_size_detection_pod,
    size_detection_pod_name,
)

MiB = 1024 * 1024
OWNER = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "d", "uid": "u"}


def config(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None) -> CDIConfig:
    obj: dict[str, Any] = {"metadata": {"name": "config"}, "spec": spec or {}}
    if status is not None:
        obj["status"] = status
    return CDIConfig.from_dict(obj)


def target(mode: str = "Block", cls: str | None = "fast", **ann: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"volumeMode": mode, "resources": {"requests": {"storage": "1Gi"}}}
    if cls is not None:
        spec["storageClassName"] = cls
    return {"metadata": {"name": "disk", "namespace": "ns", "annotations": ann}, "spec": spec}


def test_scratch_class_is_cdiconfigs_status_else_the_targets_else_none() -> None:
    assert scratch_storage_class(config(status={"scratchSpaceStorageClass": "s"}), target()) == "s"
    # the reconciler left it empty (the spec names no existing class): the target's
    empty = config({"scratchSpaceStorageClass": "gone"}, {"scratchSpaceStorageClass": ""})
    assert scratch_storage_class(empty, target()) == "fast"
    # no status written yet: the spec's
    assert scratch_storage_class(config({"scratchSpaceStorageClass": "s"}), target()) == "s"
    assert scratch_storage_class(config(status={}), target(cls=None)) is None


def test_scratch_claim_is_cdis_shape_and_size() -> None:
    pvc = render_scratch_pvc(target(), OWNER, config(), "fast")
    assert pvc["metadata"]["name"] == "disk-scratch"
    assert pvc["metadata"]["namespace"] == "ns"
    assert pvc["metadata"]["ownerReferences"] == [OWNER]
    assert pvc["metadata"]["labels"] == {
        "app": "containerized-data-importer",
        "velero.io/exclude-from-backup": "true",
    }
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["volumeMode"] == "Filesystem"
    assert pvc["spec"]["storageClassName"] == "fast"
    size = int(pvc["spec"]["resources"]["requests"]["storage"])
    assert size == -(-required_space(0.06, 1024 * MiB) // MiB) * MiB  # Block: no own overhead


def test_scratch_size_takes_a_filesystem_targets_overhead_off_first() -> None:
    fs = scratch_size(config(), target("Filesystem"), "fast")
    block = scratch_size(config(), target("Block"), "fast")
    assert fs < block and fs % MiB == 0


def test_scratch_claim_keeps_a_primes_selected_node_only() -> None:
    node = {"volume.kubernetes.io/selected-node": "n1"}
    plain = render_scratch_pvc(target(**node), OWNER, config(), "fast")
    assert plain["metadata"]["annotations"] == {}
    prime = target(**node, **{"cdi.kubevirt.io/storage.populator.kind": "VolumeImportSource"})
    assert render_scratch_pvc(prime, OWNER, config(), "fast")["metadata"]["annotations"] == node


def dv(namespace: str) -> DataVolume:
    return DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": "clone", "namespace": namespace, "uid": "dv-uid"},
            "spec": {"source": {"pvc": {"namespace": "src", "name": "golden"}}, "storage": {}},
        }
    )


SOURCE = {"metadata": {"name": "golden", "namespace": "src", "uid": "src-uid"},
          "status": {"capacity": {"storage": "128Mi"}}}  # fmt: skip


def test_size_detection_pod_mounts_the_source_read_only_and_runs_the_importer() -> None:
    pod = render_size_detection_pod(SOURCE, dv("src"), config(), "importer:dev")
    assert pod["metadata"]["name"] == size_detection_pod_name(SOURCE) == "size-detection-src-uid"
    assert pod["metadata"]["namespace"] == "src"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "dv-uid"
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "golden", "readOnly": True}
    (container,) = spec["containers"]
    assert container["name"] == "size-detection-volume"
    assert "command" not in container and "args" not in container  # the image's entry point
    assert container["env"] == [{"name": "IMPORTER_SIZE_DETECTION_PATH", "value": "/data/disk.img"}]
    assert {"name": "cdi-data-vol", "mountPath": "/data", "readOnly": True} in container[
        "volumeMounts"
    ]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_size_detection_pod_in_another_namespace_has_no_owner() -> None:
    pod = render_size_detection_pod(SOURCE, dv("elsewhere"), config(), "importer:dev")
    assert "ownerReferences" not in pod["metadata"]


def test_measurement_is_cached_with_the_capacity_it_was_made_at() -> None:
    assert measured_annotations(SOURCE, 25 * MiB) == {
        "cdi.Kubervirt.io/virtualSize": str(25 * MiB),
        "cdi.Kubervirt.io/sourceCapacity": "128Mi",
    }
    assert measured_annotations(SOURCE, 0) is None
    assert measured_annotations({"metadata": {}}, 25 * MiB) is None
