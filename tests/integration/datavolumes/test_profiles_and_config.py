"""StorageProfiles and the CDIConfig singleton on the real API server, kept by the controller
process, and what they change for DataVolumes in CDI's ``storage`` form (no access or volume
mode). The profiles and ``config`` are cluster-wide, so every test that edits them restores
them before it ends."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdi.api.quantity import Quantity
from cdi.render.pvc import required_space
from testkit.kubeclient import Kube
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    ControllerProcess,
    ImageServer,
    MiB,
    condition,
    dv_path,
    events_for,
    wait_phase,
)

pytestmark = pytest.mark.integration

API = "/apis/cdi.kubevirt.io/v1beta1"
LOCAL = {"testkit-fs": "Filesystem", "testkit-fs-wffc": "Filesystem", "testkit-block": "Block"}
IMMEDIATE = {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}


def profile_path(name: str) -> str:
    return f"{API}/storageprofiles/{name}"


def config_path() -> str:
    return f"{API}/cdiconfigs/config"


def storage_dv(
    name: str, source: dict[str, Any], size: str, storage_class: str | None = None
) -> dict[str, Any]:
    """CDI's recommended form: size (and maybe a class), nothing else."""
    storage: dict[str, Any] = {"resources": {"requests": {"storage": size}}}
    if storage_class:
        storage["storageClassName"] = storage_class
    annotations = IMMEDIATE if storage_class == "testkit-fs-wffc" else {}
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"source": source, "storage": storage},
    }


def pvc_of(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}")


def wait_profile(kube: Kube, name: str, check: Any, what: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        profile = kube.get_or_none(profile_path(name))
        return profile if profile and check(profile.get("status") or {}) else None

    return wait_until(ready, f"StorageProfile {name}: {what}", 30)


@pytest.fixture
def restore_profile(kube: Kube, controller: ControllerProcess) -> Iterator[str]:
    name = "testkit-fs"
    before = wait_profile(kube, name, lambda s: s.get("claimPropertySets"), "filled")
    yield name
    kube.patch(profile_path(name), {"spec": {"claimPropertySets": None}})
    first = before["status"]["claimPropertySets"][0]
    wait_profile(kube, name, lambda s: s["claimPropertySets"][0] == first, "restored")


@pytest.fixture
def restore_config(kube: Kube, controller: ControllerProcess) -> Iterator[dict[str, Any]]:
    config = wait_until(lambda: kube.get_or_none(config_path()), "CDIConfig config", 30)
    yield config
    kube.patch(
        config_path(), {"spec": {"filesystemOverhead": None, "uploadProxyURLOverride": None}}
    )
    wait_until(
        lambda: kube.get(config_path())["status"]["filesystemOverhead"]["global"] == "0.06",
        "CDIConfig overhead restored",
        30,
    )


def test_every_local_storage_class_gets_a_recognized_complete_profile(
    kube: Kube, controller: ControllerProcess
) -> None:
    for name, mode in LOCAL.items():
        profile = wait_profile(kube, name, lambda s: s.get("claimPropertySets"), "filled")
        status = profile["status"]
        assert status["storageClass"] == name and status["provisioner"] == "testkit.local/loop"
        assert status["claimPropertySets"][0] == {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": mode,
        }
        assert status["cloneStrategy"] == "csi-clone"  # the provisioner clones dataSource
        recognized = status["conditions"][0]
        assert (recognized["type"], recognized["status"]) == ("Recognized", "True")
        assert profile["spec"] == {}


def test_storage_class_lifecycle_creates_and_deletes_its_profile(
    kube: Kube, controller: ControllerProcess
) -> None:
    sc = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "unknown-sc-profiles"},
        "provisioner": "example.com/unknown",
    }
    kube.create("/apis/storage.k8s.io/v1/storageclasses", sc)
    try:
        profile = wait_profile(kube, sc["metadata"]["name"], lambda s: "conditions" in s, "status")
        assert profile["status"]["claimPropertySets"] == []
        assert profile["status"]["conditions"][0]["reason"] == "UnrecognizedProvisioner"
    finally:
        kube.delete_ignore_missing(
            f"/apis/storage.k8s.io/v1/storageclasses/{sc['metadata']['name']}"
        )
    wait_until(
        lambda: kube.get_or_none(profile_path(sc["metadata"]["name"])) is None,
        "profile deleted with its class",
        30,
    )


def test_storage_api_datavolumes_without_modes_succeed_on_every_local_class(
    kube: Kube, namespace: str, controller: ControllerProcess, image_server: ImageServer
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    for cls in LOCAL:
        kube.create(
            dv_path(namespace), storage_dv(f"http-{cls}", {"http": {"url": url}}, "64Mi", cls)
        )
        kube.create(dv_path(namespace), storage_dv(f"blank-{cls}", {"blank": {}}, "64Mi", cls))
    kube.create(dv_path(namespace), storage_dv("default-class", {"http": {"url": url}}, "64Mi"))
    names = [f"{kind}-{cls}" for cls in LOCAL for kind in ("http", "blank")] + ["default-class"]
    for name in names:
        dv = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), 240)
        assert dv["status"]["phase"] == "Succeeded", (name, dv["status"])
    for cls, mode in LOCAL.items():
        pvc = pvc_of(kube, namespace, f"http-{cls}")
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert (pvc["spec"]["volumeMode"], pvc["spec"]["storageClassName"]) == (mode, cls)
    assert pvc_of(kube, namespace, "default-class")["spec"]["storageClassName"] == "testkit-fs"


def test_profile_without_access_modes_blocks_storage_claims_until_restored(
    kube: Kube, namespace: str, restore_profile: str, image_server: ImageServer
) -> None:
    name = restore_profile
    kube.patch(profile_path(name), {"spec": {"claimPropertySets": [{"volumeMode": "Filesystem"}]}})
    wait_profile(
        kube, name, lambda s: s["claimPropertySets"] == [{"volumeMode": "Filesystem"}], "emptied"
    )
    url = image_server.url("ok", "disk.qcow2")
    kube.create(dv_path(namespace), storage_dv("waits", {"http": {"url": url}}, "64Mi", name))
    message = f"no accessMode specified in StorageProfile {name}"

    def refused() -> dict[str, Any] | None:
        dv = kube.get(dv_path(namespace, "waits"))
        bound = condition(dv, "Bound") if dv.get("status") else {}
        return dv if bound.get("reason") == "ErrClaimNotValid" else None

    dv = wait_until(refused, "ErrClaimNotValid on the DataVolume", 60)
    assert dv["status"]["phase"] == "Pending"
    assert condition(dv, "Bound")["message"] == message
    reasons = {(e["reason"], e["message"]) for e in events_for(kube, namespace, "waits")}
    assert ("ErrClaimNotValid", message) in reasons
    assert kube.get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/waits") is None
    kube.patch(profile_path(name), {"spec": {"claimPropertySets": None}})
    dv = wait_phase(kube, namespace, "waits", ("Succeeded", "Failed"), 180)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]


def test_config_status_is_filled_and_overhead_changes_the_next_claim(
    kube: Kube, namespace: str, restore_config: dict[str, Any]
) -> None:
    status = restore_config["status"]
    assert status["filesystemOverhead"]["global"] == "0.06"
    assert set(LOCAL) <= set(status["filesystemOverhead"]["storageClass"])
    assert status["defaultPodResourceRequirements"]["limits"] == {"cpu": "750m", "memory": "600M"}
    kube.create(dv_path(namespace), storage_dv("before", {"blank": {}}, "64Mi", "testkit-fs"))
    wait_until(
        lambda: kube.get_or_none(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/before"),
        "first claim",
        60,
    )
    kube.patch(
        config_path(),
        {
            "spec": {
                "filesystemOverhead": {"global": "0.5", "storageClass": {"testkit-block": "0.2"}},
                "uploadProxyURLOverride": "upload.example.test",
            }
        },
    )

    def updated() -> dict[str, Any] | None:
        st = kube.get(config_path()).get("status") or {}
        return st if st.get("filesystemOverhead", {}).get("global") == "0.5" else None

    status = wait_until(updated, "CDIConfig status follows the spec", 30)
    per_class = status["filesystemOverhead"]["storageClass"]
    assert (per_class["testkit-fs"], per_class["testkit-block"]) == ("0.5", "0.2")
    assert status["uploadProxyURL"] == "upload.example.test"
    kube.create(dv_path(namespace), storage_dv("after", {"blank": {}}, "64Mi", "testkit-fs"))
    sizes = {}
    for name in ("before", "after"):
        wait_phase(kube, namespace, name, ("Succeeded",), 120)
        request = pvc_of(kube, namespace, name)["spec"]["resources"]["requests"]["storage"]
        sizes[name] = Quantity.parse(request).value()
    assert sizes == {
        "before": required_space(0.06, 64 * MiB),
        "after": required_space(0.5, 64 * MiB),
    }


def test_without_a_default_class_a_classless_claim_waits_with_cdis_error(
    kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    sc_path = "/apis/storage.k8s.io/v1/storageclasses/testkit-fs"
    default = "storageclass.kubernetes.io/is-default-class"
    kube.patch(sc_path, {"metadata": {"annotations": {default: "false"}}})
    try:
        kube.create(dv_path(namespace), storage_dv("classless", {"blank": {}}, "16Mi"))

        def refused() -> dict[str, Any] | None:
            dv = kube.get(dv_path(namespace, "classless"))
            bound = condition(dv, "Bound") if dv.get("status") else {}
            return dv if bound.get("reason") == "ErrClaimNotValid" else None

        dv = wait_until(refused, "ErrClaimNotValid without a default class", 60)
        assert condition(dv, "Bound")["message"] == (
            "PVC spec is missing accessMode and no storageClass to choose profile"
        )
        assert dv["status"]["phase"] == "Pending"
    finally:
        kube.patch(sc_path, {"metadata": {"annotations": {default: "true"}}})
    dv = wait_phase(kube, namespace, "classless", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert pvc_of(kube, namespace, "classless")["spec"]["storageClassName"] == "testkit-fs"
