"""The VolumeCloneSource populator on the real control plane, with the product deployed from
deploy/: a claim naming a VolumeCloneSource stays unbound (with ``CloneWithoutSource``) while
its source claim does not exist, then the provisioner clones the source into the prime, the
prime's volume goes to the target and the prime is deleted; the content is the source's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cdi.api.quantity import Quantity
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    ImageServer,
    datavolume,
    dv_path,
    events_for,
    pv_of,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)
from tests.integration.datavolumes.populator_env import claims, pvc_path
from tests.integration.helpers import pvc_manifest

pytestmark = pytest.mark.integration


def vcs_path(ns: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/volumeclonesources" + (f"/{name}" if name else "")


def clone_source(name: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "VolumeCloneSource",
        "metadata": {"name": name},
        "spec": {"source": {"kind": "PersistentVolumeClaim", "name": claim}},
    }


def test_a_clone_populated_claim_waits_for_its_source_then_binds_with_its_content(
    kube: Kube, namespace: str, product: Product, image_server: ImageServer, images: Images
) -> None:
    kube.create(vcs_path(namespace), clone_source("vcs", "golden"))
    pvc = pvc_manifest("copy", "96Mi", "testkit-csi-fs")  # bigger than the source
    pvc["spec"]["dataSourceRef"] = {
        "apiGroup": "cdi.kubevirt.io",
        "kind": "VolumeCloneSource",
        "name": "vcs",
    }
    target = kube.create(pvc_path(namespace), pvc)
    prime = f"prime-{target['metadata']['uid']}"

    def reasons() -> set[str]:
        return {e["reason"] for e in events_for(kube, namespace, "copy")}

    wait_until(lambda: "CloneWithoutSource" in reasons(), "CloneWithoutSource", 30)
    assert prime not in claims(kube, namespace)
    source = {"http": {"url": image_server.url("ok", "disk.qcow2")}}
    kube.create(dv_path(namespace), datavolume("golden", source, "64Mi", "testkit-csi-fs"))
    golden = wait_phase(kube, namespace, "golden", ("Succeeded", "Failed"), 120)
    assert golden["status"]["phase"] == "Succeeded", golden["status"]

    def bound() -> dict[str, Any] | None:
        claim = kube.get(pvc_path(namespace, "copy"))
        return claim if claim["status"].get("phase") == "Bound" else None

    claim = wait_until(bound, "the clone target Bound", 120)
    ann = claim["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/clonePhase"] == "Succeeded"
    assert ann["cdi.kubevirt.io/storage.populator.progress"] == "100.0%"
    assert ann["cdi.kubevirt.io/storage.populator.pvcPrime"] == prime
    capacity = pv_of(kube, namespace, "copy")["spec"]["capacity"]["storage"]
    assert Quantity.parse(capacity).value() >= 96 * 1024 * 1024, capacity
    local = volume_dir(kube, namespace, "copy")
    same_prefix_then_zeros(Path(local) / "disk.img", images.reference)
    assert (
        pv_of(kube, namespace, "copy")["metadata"]["name"]
        != pv_of(kube, namespace, "golden")["metadata"]["name"]
    )
    wait_until(lambda: prime not in claims(kube, namespace), "the prime claim deleted", 30)
    assert {"CreatedPVCPrimeSuccessfully", "CloneSucceeded"} <= reasons(), reasons()


def test_the_webhook_refuses_a_snapshot_source_and_spec_changes(
    kube: Kube, namespace: str, product: Product
) -> None:
    snapshot = clone_source("snap", "s")
    snapshot["spec"]["source"] = {
        "apiGroup": "snapshot.storage.k8s.io",
        "kind": "VolumeSnapshot",
        "name": "s",
    }
    with pytest.raises(ApiError) as refused:
        kube.create(vcs_path(namespace), snapshot)
    assert "Unsupported clone source kind" in str(refused.value)
    kube.create(vcs_path(namespace), clone_source("vcs", "a"))
    with pytest.raises(ApiError) as changed:
        kube.patch(vcs_path(namespace, "vcs"), {"spec": {"source": {"name": "b"}}})
    assert "Cannot update VolumeCloneSource Spec" in str(changed.value)
