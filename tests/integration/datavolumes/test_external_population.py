"""External population (CDI's external-population controller): a DataVolume with no source
whose ``storage.dataSourceRef`` names another populator's kind gets its claim created with that
reference, waits ``Pending`` while it is unbound, and is ``Succeeded`` with the event
``ExternalPopulationSucceeded`` once the other populator has bound it (issue 27). Here the test
is that populator: it hands the claim a volume holding the image, as a populator's PV hand-over
does. A class with an in-tree provisioner is refused as CDI refuses it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    condition,
    dv_path,
    event_reasons,
    wait_phase,
)

pytestmark = pytest.mark.integration
REF = {"apiGroup": "populators.example.io", "kind": "Payload", "name": "golden"}


def external_dv(name: str, storage_class: str = "testkit-fs") -> dict[str, Any]:
    storage = {"storageClassName": storage_class, "accessModes": ["ReadWriteOnce"],
               "volumeMode": "Filesystem", "dataSourceRef": dict(REF),
               "resources": {"requests": {"storage": "64Mi"}}}  # fmt: skip
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name}, "spec": {"storage": storage}}  # fmt: skip


def hand_over(kube: Kube, claim: dict[str, Any], folder: Path) -> str:
    """What a populator does at the end: a volume with the data, bound to the claim."""
    node = kube.get("/api/v1/nodes")["items"][0]["metadata"]["name"]
    meta = claim["metadata"]
    name = f"external-{meta['uid']}"
    hostname = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
    kube.create("/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name},
        "spec": {"capacity": {"storage": claim["spec"]["resources"]["requests"]["storage"]},
                 "accessModes": ["ReadWriteOnce"],
                 "volumeMode": "Filesystem", "storageClassName": claim["spec"]["storageClassName"],
                 "persistentVolumeReclaimPolicy": "Retain", "local": {"path": str(folder)},
                 "claimRef": {"namespace": meta["namespace"], "name": meta["name"],
                              "uid": meta["uid"]},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [
                     {"matchExpressions": [hostname]}]}}},
    })  # fmt: skip
    return name


def test_an_externally_populated_datavolume_waits_for_its_populator(
    kube: Kube, namespace: str, controller: Any, images: Images, tmp_path: Path
) -> None:
    kube.create(dv_path(namespace), external_dv("ext"))
    claim_path = ns_path(namespace, "persistentvolumeclaims", "ext")
    claim = wait_until(lambda: kube.get_or_none(claim_path), "the claim, created", 60)
    assert claim["spec"]["dataSourceRef"] == REF
    dv = wait_phase(kube, namespace, "ext", ("Pending",), 30)
    assert kube.get(claim_path)["status"]["phase"] == "Pending"  # nobody else fills it
    assert dv["status"]["phase"] == "Pending"

    folder = tmp_path / "volume"
    folder.mkdir()
    shutil.copyfile(images.reference, folder / "disk.img")
    pv = hand_over(kube, claim, folder)
    try:
        dv = wait_phase(kube, namespace, "ext", ("Succeeded",), 60)
        assert condition(dv, "Ready")["status"] == "True", dv["status"]
        event_reasons(kube, namespace, "ext", {"ExternalPopulationSucceeded"})
        assert kube.get(claim_path)["spec"]["volumeName"] == pv
    finally:
        kube.delete_ignore_missing(dv_path(namespace, "ext"))
        kube.delete_ignore_missing(f"/api/v1/persistentvolumes/{pv}")


def test_an_in_tree_provisioner_is_refused_for_external_population(
    kube: Kube, namespace: str, controller: Any
) -> None:
    sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
          "metadata": {"name": "external-in-tree"}, "provisioner": "kubernetes.io/no-provisioner",
          "volumeBindingMode": "WaitForFirstConsumer"}  # fmt: skip
    kube.create("/apis/storage.k8s.io/v1/storageclasses", sc)
    try:
        kube.create(dv_path(namespace), external_dv("intree", "external-in-tree"))

        def refused() -> dict[str, Any] | None:
            dv = kube.get(dv_path(namespace, "intree"))
            reasons = {c.get("reason") for c in (dv.get("status") or {}).get("conditions") or []}
            return dv if "NoCSIDriverForExternalPopulation" in reasons else None

        dv = wait_until(refused, "refused: no CSI driver", 60)
        assert dv["status"]["phase"] == "Pending"
        assert condition(dv, "Bound")["reason"] == "NoCSIDriverForExternalPopulation"
        path = ns_path(namespace, "persistentvolumeclaims", "intree")
        assert kube.get_or_none(path) is None
    finally:
        kube.delete_ignore_missing("/apis/storage.k8s.io/v1/storageclasses/external-in-tree")
