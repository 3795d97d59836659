"""Volume populators on the real control plane: a plain PVC whose ``dataSourceRef`` names a
``VolumeImportSource`` binds only once its data is complete; the prime claim is gone after.
The product is the deployed one (``deploy/``); the local provisioner leaves the target alone,
as the CSI external-provisioner does."""

from __future__ import annotations

import os
import stat
import time

import pytest

from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    ImageServer,
    datavolume,
    dv_path,
    event_reasons,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)
from tests.integration.datavolumes.populator_env import (
    MarkerDisk,
    claims,
    import_source,
    pvc_path,
    start_population,
    vis_path,
    volumes_for,
    wait_claim_bound,
)

pytestmark = pytest.mark.integration


def test_plain_pvc_with_volume_import_source_binds_populated_and_prime_is_deleted(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
) -> None:
    prime = start_population(kube, namespace, image_server.url("slow", marker_disk.name))
    target = kube.get(pvc_path(namespace, "disk"))
    # While the data is coming in the target has no volume; the prime does the work.
    seen = wait_until(lambda: claims(kube, namespace).get(prime), "the prime claim", 30)
    assert seen["metadata"]["ownerReferences"][0]["uid"] == target["metadata"]["uid"]
    assert not claims(kube, namespace)["disk"]["spec"].get("volumeName")
    pvc = wait_claim_bound(kube, namespace, "disk")
    ann = pvc["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/storage.populator.progress"] == "100.0%"
    assert ann["cdi.kubevirt.io/storage.populator.pvcPrime"] == prime
    assert ann["cdi.kubevirt.io/storage.pod.phase"] == "Succeeded"
    disk = volume_dir(kube, namespace, "disk") / "disk.img"
    same_prefix_then_zeros(disk, marker_disk.reference)
    st = os.stat(disk)
    assert stat.S_IMODE(st.st_mode) == 0o660
    assert (st.st_uid, st.st_gid) == (107, 107)  # the qemu user a VM runtime runs as
    wait_until(lambda: prime not in claims(kube, namespace), "the prime claim deleted", 30)
    wait_until(
        lambda: not kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"],
        "the importer pod deleted",
        30,
    )
    event_reasons(kube, namespace, "disk", {"CreatedPVCPrimeSuccessfully", "ImportSucceeded"})


def test_deleting_the_source_mid_population_does_not_break_it(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
) -> None:
    prime = start_population(kube, namespace, image_server.url("slow", marker_disk.name))
    wait_until(lambda: claims(kube, namespace).get(prime), "the prime claim", 30)
    kube.delete(vis_path(namespace, "src"))
    wait_until(
        lambda: kube.get(pvc_path(namespace, "disk"))["status"].get("phase") == "Bound",
        "the target claim Bound",
        120,
    )
    disk = volume_dir(kube, namespace, "disk") / "disk.img"
    same_prefix_then_zeros(disk, marker_disk.reference)


def test_deleting_the_target_mid_population_leaves_no_prime_or_volume_behind(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
) -> None:
    # crawl: still running when the claim is deleted
    prime = start_population(kube, namespace, image_server.url("crawl", marker_disk.name))

    def importing() -> bool:
        pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        return any(p.get("status", {}).get("phase") == "Running" for p in pods)

    wait_until(importing, "the importer pod running", 60)
    assert prime in claims(kube, namespace)
    kube.delete(pvc_path(namespace, "disk"))
    wait_until(
        lambda: (
            not claims(kube, namespace)
            and not kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
            and not volumes_for(kube, namespace)
        ),
        "no claim, pod or volume left",
        90,
    )
    time.sleep(2)  # and nothing comes back
    assert not claims(kube, namespace) and not volumes_for(kube, namespace)


def test_datavolumes_on_csi_storage_use_the_populator_unless_opted_out(
    kube: Kube, namespace: str, controller: Product
) -> None:
    opt_out = {"cdi.kubevirt.io/storage.usePopulator": "false"}
    immediate = {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"}
    cases = {
        "via": ("testkit-csi-fs", {}),
        "direct": ("testkit-csi-fs", opt_out),
        "now": ("testkit-csi-fs-wffc", immediate),  # the importer pod is the first consumer
    }
    for name, (sc, ann) in cases.items():
        kube.create(
            dv_path(namespace), datavolume(name, {"blank": {}}, "16Mi", sc, annotations=ann)
        )
    sizes = {}
    for name in cases:
        dv = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), 90)
        assert dv["status"]["phase"] == "Succeeded", dv["status"]
        assert dv["status"]["progress"] == "100.0%"
        disk = volume_dir(kube, namespace, name) / "disk.img"
        sizes[name] = disk.stat().st_size
    via = kube.get(dv_path(namespace, "via"))
    ref = kube.get(pvc_path(namespace, "via"))["spec"]["dataSourceRef"]
    assert ref == {
        "apiGroup": "cdi.kubevirt.io",
        "kind": "VolumeImportSource",
        "name": f"volume-import-source-{via['metadata']['uid']}",
    }
    source = kube.get(vis_path(namespace, ref["name"]))
    assert source["metadata"]["ownerReferences"][0]["uid"] == via["metadata"]["uid"]
    assert "dataSourceRef" not in kube.get(pvc_path(namespace, "direct"))["spec"]
    assert "dataSourceRef" in kube.get(pvc_path(namespace, "now"))["spec"]
    assert sizes["via"] == sizes["direct"] == sizes["now"]  # the same disk either way


def test_the_webhook_refuses_bad_import_sources_and_spec_changes(
    kube: Kube, namespace: str, controller: Product
) -> None:
    two = import_source("two", {"blank": {}, "http": {"url": "http://127.0.0.1/x"}})
    with pytest.raises(ApiError) as refused:
        kube.create(vis_path(namespace), two)
    assert "Multiple import sources" in str(refused.value)
    kube.create(vis_path(namespace), import_source("src", {"blank": {}}))
    with pytest.raises(ApiError) as changed:
        kube.patch(
            vis_path(namespace, "src"),
            {"spec": {"source": {"blank": None, "http": {"url": "http://127.0.0.1/x"}}}},
        )
    assert "Cannot update VolumeImportSource Spec" in str(changed.value)
    kube.patch(vis_path(namespace, "src"), {"metadata": {"labels": {"tier": "gold"}}})  # allowed


def test_a_controller_crash_mid_population_neither_duplicates_nor_loses_work(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    marker_disk: MarkerDisk,
) -> None:
    prime = start_population(kube, namespace, image_server.url("slow", marker_disk.name))
    pods: set[str] = set()

    def note() -> bool:
        items = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        pods.update(p["metadata"]["uid"] for p in items)
        return any(p.get("status", {}).get("phase") == "Running" for p in items)

    wait_until(note, "the importer pod running", 60)
    old = controller.leader()
    controller.kill(old)  # SIGKILL: the standby takes over once the Lease expires

    def bound() -> bool:
        note()
        return kube.get(pvc_path(namespace, "disk"))["status"].get("phase") == "Bound"

    wait_until(bound, "the target claim Bound after the takeover", 150)
    assert len(pods) == 1, pods  # the new leader followed the recorded pod
    disk = volume_dir(kube, namespace, "disk") / "disk.img"
    same_prefix_then_zeros(disk, marker_disk.reference)
    wait_until(lambda: prime not in claims(kube, namespace), "the prime claim deleted", 30)
