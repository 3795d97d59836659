"""Scratch claims for block targets (issue 27), end to end: the real API server, the product
deployed from deploy/, importer pods on the local node, the real provisioner. A source that
needs staging (vhdx; a qcow2 too disordered to stream) into a Block volume gets CDI's
``<pvc>-scratch`` claim, imports byte for byte what ``qemu-img convert`` makes, and the claim is
gone afterwards; a streamable qcow2 into a Block volume gets none."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi.render.pvc import required_space
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    ImageServer,
    MiB,
    datavolume,
    dv_path,
    run,
    same_prefix_then_zeros,
    volume_dir,
)

pytestmark = pytest.mark.integration

SCRATCH_CLASS = "testkit-fs"


def claims_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/persistentvolumeclaims" + (f"/{name}" if name else "")


def import_watching_claims(
    kube: Kube, ns: str, manifest: dict[str, Any], timeout: float = 180
) -> tuple[dict[str, Any], dict[str, dict[str, Any]], list[str]]:
    """Create the DataVolume and poll until it ends; the claims seen meanwhile (by name, as
    first seen) and the Bound condition reasons seen."""
    kube.create(dv_path(ns), manifest)
    name = manifest["metadata"]["name"]
    claims: dict[str, dict[str, Any]] = {}
    bound_reasons: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pvc in kube.get(claims_path(ns))["items"]:
            claims.setdefault(pvc["metadata"]["name"], pvc)
        dv = kube.get(dv_path(ns, name))
        status = dv.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond["type"] == "Bound" and cond.get("reason") not in bound_reasons:
                bound_reasons.append(cond.get("reason"))
        if status.get("phase") in ("Succeeded", "Failed"):
            return dv, claims, bound_reasons
        time.sleep(0.1)
    raise AssertionError(f"DataVolume {ns}/{name} did not end: {status}")


@pytest.fixture
def scratch_class(kube: Kube, controller: Product) -> Iterator[str]:
    """CDIConfig ``scratchSpaceStorageClass`` set (and seen in its status) for one test."""
    path = f"{DV_API}/cdiconfigs/config"
    kube.patch(path, {"spec": {"scratchSpaceStorageClass": SCRATCH_CLASS}})
    wait_until(
        lambda: (
            (kube.get(path).get("status") or {}).get("scratchSpaceStorageClass") == SCRATCH_CLASS
        ),
        "CDIConfig status.scratchSpaceStorageClass",
        30,
    )
    try:
        yield SCRATCH_CLASS
    finally:
        kube.patch(path, {"spec": {"scratchSpaceStorageClass": None}})
        wait_until(
            lambda: not (kube.get(path).get("status") or {}).get("scratchSpaceStorageClass"),
            "CDIConfig status.scratchSpaceStorageClass cleared",
            30,
        )


def _image(images: Images, name: str, *convert: str) -> Path:
    """An image beside the session's, made by real qemu-img from the reference bytes."""
    path = images.path(name)
    if not path.exists():
        run("qemu-img", "convert", "-f", "raw", *convert, images.reference, path)
    return path


def _assert_scratch_gone(kube: Kube, ns: str, name: str) -> None:
    wait_until(lambda: kube.get_or_none(claims_path(ns, name)) is None, f"{name} deleted", 60)


def test_vhdx_into_block_volume_gets_a_scratch_claim_that_goes_afterwards(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
    scratch_class: str,
) -> None:
    _image(images, "scratch-test.vhdx", "-O", "vhdx")
    manifest = datavolume(
        "vhdx",
        {"http": {"url": image_server.url("ok", "scratch-test.vhdx")}},
        size="64Mi",
        storage_class="testkit-block",
        mode="Block",
    )
    dv, claims, _ = import_watching_claims(kube, namespace, manifest)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"].get("restartCount", 0) == 0  # the scratch dance is not a failed attempt
    assert set(claims) == {"vhdx", "vhdx-scratch"}, sorted(claims)
    scratch = claims["vhdx-scratch"]
    assert scratch["spec"]["storageClassName"] == scratch_class  # CDIConfig's class
    assert scratch["spec"]["volumeMode"] == "Filesystem"
    assert scratch["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert scratch["metadata"]["labels"]["velero.io/exclude-from-backup"] == "true"
    owner = scratch["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["uid"]) == ("DataVolume", dv["metadata"]["uid"])
    # the target's 64Mi (no overhead on Block) plus the scratch class's 6 %, whole MiB
    requested = scratch["spec"]["resources"]["requests"]["storage"]
    assert int(requested) == -(-required_space(0.06, 64 * MiB) // MiB) * MiB, requested
    target = kube.get(claims_path(namespace, "vhdx"))
    assert target["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.requiresScratch"]
    same_prefix_then_zeros(volume_dir(kube, namespace, "vhdx"), images.reference)
    _assert_scratch_gone(kube, namespace, "vhdx-scratch")


def test_disordered_qcow2_into_block_uses_the_targets_class_for_scratch(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
    tmp_path: Path,
) -> None:
    """No scratchSpaceStorageClass: CDI falls back to the target claim's class. The qcow2's
    L1 table sits after 70 MiB of data (a resize grew it: qemu moves it to the end), past the
    importer's 64 MiB in-memory spill."""
    image = images.path("scratch-moved.qcow2")
    if not image.exists():
        run("qemu-img", "create", "-f", "qcow2", "-o", "cluster_size=4096", image, "72M")
        run("qemu-io", "-c", "write -P 7 0 70M", image)
        run("qemu-img", "resize", image, "96M")  # the L1 table moves to the end
    reference = tmp_path / "moved.raw"
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", image, reference)
    manifest = datavolume(
        "moved",
        {"http": {"url": image_server.url("ok", image.name)}},
        size="96Mi",
        storage_class="testkit-block",
        mode="Block",
    )
    dv, claims, _ = import_watching_claims(kube, namespace, manifest)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert set(claims) == {"moved", "moved-scratch"}, sorted(claims)
    assert claims["moved-scratch"]["spec"]["storageClassName"] == "testkit-block"
    assert claims["moved-scratch"]["spec"]["volumeMode"] == "Filesystem"
    same_prefix_then_zeros(volume_dir(kube, namespace, "moved"), reference)
    _assert_scratch_gone(kube, namespace, "moved-scratch")


def test_streamable_qcow2_into_block_volume_creates_no_scratch_claim(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
) -> None:
    manifest = datavolume(
        "plain",
        {"http": {"url": image_server.url("ok", "disk.qcow2")}},
        size="32Mi",
        storage_class="testkit-block",
        mode="Block",
    )
    dv, claims, bound_reasons = import_watching_claims(kube, namespace, manifest)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert set(claims) == {"plain"}, sorted(claims)
    assert "CreatingScratchSpace" not in bound_reasons
    ann = kube.get(claims_path(namespace, "plain"))["metadata"].get("annotations") or {}
    assert "cdi.kubevirt.io/storage.import.requiresScratch" not in ann
    same_prefix_then_zeros(volume_dir(kube, namespace, "plain"), images.reference)
