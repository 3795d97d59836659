"""The clone's pure decisions: strategy and CDI's fallback reasons, size, the claims it makes,
the source-in-use and populated rules."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.types import DataVolume
from cdi.controller.flavours import select_flavour
from cdi.controller.flavours.clone.common import Throttle, content_problem
from cdi.controller.flavours.clone.source import populated, writers_of
from cdi.render import clone as plan
from cdi.render.clone_pod import CloneSourcePod, client_name, render_clone_source_pod
from cdi.render.worker_pod import WorkerPod

LOOP = {"provisioner": "testkit.local/loop", "allowVolumeExpansion": True}
CLASSES: dict[str, dict[str, Any]] = {
    "fs": LOOP,
    "fixed": {"provisioner": "testkit.local/loop"},
    "other": {"provisioner": "ebs.csi.aws.com", "allowVolumeExpansion": True},
}


def claim(size: str | None = "1Gi", cls: str = "fs", mode: str = "Filesystem") -> dict[str, Any]:
    spec: dict[str, Any] = {"storageClassName": cls, "volumeMode": mode,
                            "accessModes": ["ReadWriteOnce"]}  # fmt: skip
    if size:
        spec["resources"] = {"requests": {"storage": size}}
    return {"metadata": {"name": "t", "annotations": {}}, "spec": spec}


def test_csi_clone_when_the_storage_can() -> None:
    assert plan.plan_strategy("csi-clone", claim(), claim(), CLASSES) == plan.StrategyPlan(
        "csi-clone"
    )


@pytest.mark.parametrize(
    ("target", "reason", "message"),
    [
        (claim(cls="other"), "IncompatibleProvisioners", "Provisioners are incompatible"),
        (
            claim(mode="Block"),
            "IncompatibleVolumeModes",
            "modes of source and target are incompatible",
        ),
        (claim("2Gi", cls="fixed"), "NoVolumeExpansion", "No volume expansion is possible"),
    ],
)
def test_fallback_to_copy_with_cdis_reason(target: Any, reason: str, message: str) -> None:
    source = claim(cls="fixed") if reason == "NoVolumeExpansion" else claim()
    chosen = plan.plan_strategy("csi-clone", source, target, CLASSES)
    assert chosen.strategy == "copy"
    assert chosen.fallback is not None and chosen.fallback.reason == reason
    assert message in chosen.fallback.message


def test_snapshot_without_a_snapshot_class_falls_back_and_copy_stays_copy() -> None:
    chosen = plan.plan_strategy("snapshot", claim(), claim(), CLASSES)
    assert chosen.strategy == "copy" and chosen.fallback == plan.NO_SNAPSHOT_CLASS
    assert chosen.fallback.message == "No compatible volumesnapshotclass found"  # CDI's words
    assert plan.plan_strategy("copy", claim(), claim(), CLASSES) == plan.StrategyPlan("copy")
    # CDI's default, when the profile says nothing, is snapshot: without a class, copy
    default = plan.plan_strategy(None, claim(), claim(), CLASSES)
    assert default == plan.StrategyPlan("copy", plan.NO_SNAPSHOT_CLASS)


def test_a_target_without_size_takes_the_sources_and_a_smaller_one_is_refused() -> None:
    assert plan.fill_size(claim(None), claim("3Gi"))["spec"]["resources"]["requests"] == {
        "storage": "3Gi"
    }
    assert plan.size_problem(claim("2Gi"), claim("2Gi")) is None
    assert plan.size_problem(claim("2Gi"), claim("100Mi")) == (
        "target resources requests storage size is smaller than the source 104857600 < 2147483648"
    )


def test_the_temporary_claim_clones_the_source_with_the_targets_shape() -> None:
    tmp = plan.temporary_claim(claim("2Gi"), "uid-1", "golden", "fedora")
    assert tmp["metadata"]["name"] == "tmp-pvc-uid-1" and tmp["metadata"]["namespace"] == "golden"
    assert tmp["metadata"]["labels"][plan.LABEL_CLONE_FOR] == "uid-1"
    assert tmp["spec"]["dataSource"] == {"kind": "PersistentVolumeClaim", "name": "fedora"}
    assert tmp["spec"]["resources"] == {"requests": {"storage": "2Gi"}}
    moved = plan.moved_target(plan.csi_target(claim(), "fedora"), "pv-1")
    assert moved["spec"]["volumeName"] == "pv-1" and "dataSource" not in moved["spec"]


def test_the_target_records_strategy_source_and_fallback() -> None:
    chosen = plan.StrategyPlan("copy", plan.NO_EXPANSION)
    ann = plan.annotate(claim(), chosen, "golden", "fedora")["metadata"]["annotations"]
    assert ann == {
        "cdi.kubevirt.io/cloneType": "copy",
        "k8s.io/CloneRequest": "golden/fedora",
        "cdi.kubevirt.io/cloneFallbackReason": "No volume expansion is possible",
    }


def pod(name: str, phase: str, read_only: bool = False) -> dict[str, Any]:
    vol = {"persistentVolumeClaim": {"claimName": "fedora", "readOnly": read_only}}
    return {"metadata": {"name": name}, "status": {"phase": phase},
            "spec": {"volumes": [{"name": "v", **vol}]}}  # fmt: skip


def test_only_unfinished_pods_mounting_the_source_writable_hold_a_clone() -> None:
    pods = [pod("w", "Running"), pod("r", "Running", True), pod("d", "Succeeded")]
    assert writers_of(pods, "fedora") == ["w"]
    assert writers_of(pods, "other") == []


def test_a_datavolumes_claim_is_a_source_only_once_its_import_succeeded() -> None:
    bound = {"status": {"phase": "Bound"}, "metadata": {"annotations": {}}}
    assert populated(bound)
    ann = {"cdi.kubevirt.io/createdForDataVolume": "u"}
    importing = {"status": {"phase": "Bound"}, "metadata": {"annotations": ann}}
    assert not populated(importing)
    done = {**ann, "cdi.kubevirt.io/storage.pod.phase": "Succeeded"}
    assert populated({"status": {"phase": "Bound"}, "metadata": {"annotations": done}})
    assert not populated({"status": {"phase": "Pending"}, "metadata": {"annotations": {}}})


def test_content_types_must_match() -> None:
    dv = DataVolume.from_dict({"metadata": {"name": "x"}, "spec": {"contentType": "archive"}})
    assert content_problem(dv, {"metadata": {}}) == (
        "Source contentType (kubevirt) and target contentType (archive) do not match"
    )


def test_a_sourceref_to_a_datasource_is_a_clone() -> None:
    dv = DataVolume.from_dict(
        {"metadata": {"name": "x"}, "spec": {"sourceRef": {"kind": "DataSource", "name": "f"}}}
    )
    marker = object()
    assert select_flavour(dv, {"pvc": marker}) is marker  # type: ignore[dict-item]


def test_a_waiting_clone_repeats_its_event_at_most_once_a_minute() -> None:
    now = [1000.0]
    throttle = Throttle(lambda: now[0])
    assert throttle.due("uid", "CloneSourceInUse", "pod w")
    now[0] += 2
    assert not throttle.due("uid", "CloneSourceInUse", "pod w")
    assert throttle.due("uid", "CloneSourceInUse", "pod x")  # something new is said at once
    assert throttle.due("other", "CloneSourceInUse", "pod w")
    now[0] += 60
    assert throttle.due("uid", "CloneSourceInUse", "pod w")


def test_the_source_pod_streams_the_source_to_the_targets_upload_server() -> None:
    dv = DataVolume.from_dict({"metadata": {"name": "mine", "namespace": "tenant", "uid": "d1"}})
    source = {"metadata": {"name": "fedora", "namespace": "golden"},
              "spec": {"volumeMode": "Filesystem"}}  # fmt: skip
    target = {"metadata": {"name": "mine", "namespace": "tenant", "uid": "t1"},
              "spec": {"volumeMode": "Block"}}  # fmt: skip
    config = CloneSourcePod(WorkerPod(image="quay.io/cdi-py/cdi-cloner:latest"), "t1-client")
    pod = render_clone_source_pod(dv, source, target, config)
    assert pod["metadata"]["name"] == "t1-source-pod"
    assert pod["metadata"]["namespace"] == "golden"
    assert "ownerReferences" not in pod["metadata"]  # no owner across namespaces
    assert pod["metadata"]["labels"]["cdi.kubevirt.io/cloneTargetUID"] == "t1"
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["UPLOAD_URL"] == "https://cdi-upload-mine.tenant.svc:8443/v1beta1/upload"
    assert env["VOLUME_MODE"] == "filesystem" and env["CLONE_STREAM"] == "raw"
    assert env["MOUNT_POINT"] == "/var/run/cdi/clone/source"
    assert all(not v.startswith("-----BEGIN") for v in env.values())  # keys are files
    claim = pod["spec"]["volumes"][0]["persistentVolumeClaim"]
    assert claim == {"claimName": "fedora", "readOnly": True}
    assert client_name(source, target) == "golden/fedora-tenant/mine"
    sec = pod["spec"]["containers"][0]["securityContext"]
    assert sec["readOnlyRootFilesystem"] and not sec["allowPrivilegeEscalation"]


def test_a_block_source_is_mounted_as_a_device() -> None:
    dv = DataVolume.from_dict({"metadata": {"name": "mine", "namespace": "golden", "uid": "d1"}})
    source = {"metadata": {"name": "fedora", "namespace": "golden"},
              "spec": {"volumeMode": "Block"}}  # fmt: skip
    target = {"metadata": {"name": "mine", "namespace": "golden", "uid": "t1"}, "spec": {}}
    config = CloneSourcePod(WorkerPod(image="cloner"), "secret")
    pod = render_clone_source_pod(dv, source, target, config)
    container = pod["spec"]["containers"][0]
    assert container["volumeDevices"] == [{"name": "source", "devicePath": "/dev/cdi-block-volume"}]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert (env["VOLUME_MODE"], env["CLONE_STREAM"]) == ("block", "raw")
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "d1"  # same namespace: owned


def test_the_source_pod_dials_the_cluster_ip_and_verifies_the_service_name() -> None:
    dv = DataVolume.from_dict({"metadata": {"name": "mine", "namespace": "tenant", "uid": "d1"}})
    source = {"metadata": {"name": "fedora", "namespace": "golden"}, "spec": {}}
    target = {"metadata": {"name": "mine", "namespace": "tenant", "uid": "t1"}, "spec": {}}
    config = CloneSourcePod(WorkerPod(image="cloner"), "s", upload_host="10.0.0.7")
    pod = render_clone_source_pod(dv, source, target, config)
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    assert env["UPLOAD_URL"] == "https://10.0.0.7:8443/v1beta1/upload"
    assert env["UPLOAD_SERVER_NAME"] == "cdi-upload-mine.tenant.svc"
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_a_client_name_longer_than_a_common_name_is_hashed_and_stays_unique() -> None:
    def meta(ns: str, name: str) -> dict[str, Any]:
        return {"metadata": {"namespace": ns, "name": name}}

    long_ns = "n" * 40
    a = client_name(meta(long_ns, "golden"), meta(long_ns, "a"))
    b = client_name(meta(long_ns, "golden"), meta(long_ns, "b"))
    assert a != b and a.startswith("clone-") and len(a) <= 64
    assert client_name(meta("g", "s"), meta("t", "x")) == "g/s-t/x"


def test_a_block_source_into_a_filesystem_claim_without_size_gets_the_overhead() -> None:
    source = claim("64Mi", mode="Block")
    filled = plan.fill_size(claim(None), source, 0.055)
    assert plan.requested(filled) == -(-64 * 1024 * 1024 * 1000 // 945)
    assert plan.requested(plan.fill_size(claim(None, mode="Block"), source, 0.055)) == 64 * 2**20
    assert plan.requested(plan.fill_size(claim("1Gi"), source, 0.055)) == 2**30
