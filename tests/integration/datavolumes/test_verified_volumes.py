"""Verified volumes on the real API server with the product installed (issue 28): a DataVolume
annotated ``cdi.kubevirt.io/storage.verify: "true"`` is imported, uploaded or cloned (host-
assisted), its worker reads the volume back from the device and compares, and the DataVolume
ends Succeeded with the ``Verified`` condition True and the claim's
``cdi.kubevirt.io/storage.verification`` saying so; CDIConfig ``spec.verifyVolumes`` turns it
on for a DataVolume that did not ask; one that did not ask, with the switch off, has no
Verified condition and its worker is not told to verify."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.product import Product
from tests.integration.datavolumes.cdi_env import (
    COPY_CLASS,
    Images,
    ImageServer,
    condition,
    datavolume,
    dv_path,
    same_prefix_then_zeros,
    wait_phase,
)
from tests.integration.datavolumes.test_clone_csi import data_of, import_source, succeeded
from tests.integration.datavolumes.test_upload import User, upload_dv

pytestmark = pytest.mark.integration

CONFIG = "/apis/cdi.kubevirt.io/v1beta1/cdiconfigs/config"
VERIFY = "cdi.kubevirt.io/storage.verify"
RESULT = "cdi.kubevirt.io/storage.verification"
RETAIN = "cdi.kubevirt.io/storage.pod.retainAfterCompletion"


def verified(kube: Kube, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The DataVolume Succeeded, with the Verified condition True and the claim's record."""
    dv = succeeded(kube, ns, name, timeout)
    check = condition(dv, "Verified")
    assert (check["status"], check["reason"]) == ("True", "Verified"), dv["status"]
    pvc = kube.get(ns_path(ns, "persistentvolumeclaims", name))
    assert pvc["metadata"]["annotations"][RESULT] == "Verified"
    running = condition(dv, "Running")["message"]
    assert "read back from the device match what was written" in running, running
    return dv


def worker_env(kube: Kube, ns: str, prefix: str) -> dict[str, str]:
    pods = [p for p in kube.get(ns_path(ns, "pods"))["items"]
            if p["metadata"]["name"].startswith(prefix)]  # fmt: skip
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    container = pods[0]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_an_import_that_asks_is_verified_and_one_that_does_not_is_not(
    kube: Kube,
    namespace: str,
    controller: Any,
    image_server: ImageServer,
    images: Images,
    mode: str,
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    sc = "testkit-block" if mode == "Block" else "testkit-fs"
    asks = datavolume("asks", {"http": {"url": url}}, storage_class=sc, mode=mode,
                      annotations={VERIFY: "true", RETAIN: "true"})  # fmt: skip
    plain = datavolume("plain", {"http": {"url": url}}, storage_class=sc, mode=mode,
                       annotations={RETAIN: "true"})  # fmt: skip
    kube.create(dv_path(namespace), asks)
    kube.create(dv_path(namespace), plain)
    verified(kube, namespace, "asks")
    same_prefix_then_zeros(data_of(kube, namespace, "asks"), images.reference)
    dv = succeeded(kube, namespace, "plain")
    assert not [c for c in dv["status"]["conditions"] if c["type"] == "Verified"], dv["status"]
    assert worker_env(kube, namespace, "importer-asks")["IMPORTER_VERIFY"] == "true"
    assert "IMPORTER_VERIFY" not in worker_env(kube, namespace, "importer-plain")


@pytest.fixture
def verify_all(kube: Kube, controller: Any) -> Iterator[None]:
    kube.patch(CONFIG, {"spec": {"verifyVolumes": True}})
    time.sleep(2)  # the controller's CDIConfig informer takes the change
    yield
    kube.patch(CONFIG, {"spec": {"verifyVolumes": None}})


def test_cdiconfig_verifies_every_volume(
    kube: Kube, namespace: str, verify_all: None, image_server: ImageServer, images: Images
) -> None:
    assert kube.get(CONFIG)["spec"]["verifyVolumes"] is True  # the CRD's schema keeps it
    url = image_server.url("ok", "disk.raw.gz")
    kube.create(dv_path(namespace), datavolume("all", {"http": {"url": url}}))
    verified(kube, namespace, "all")
    same_prefix_then_zeros(data_of(kube, namespace, "all"), images.reference)


@pytest.fixture
def tenant(cluster: Cluster, kube: Kube, namespace: str, product: Product) -> User:
    return User(cluster, kube, namespace)


def test_an_upload_that_asks_is_verified(
    kube: Kube,
    namespace: str,
    tenant: User,
    images: Images,
) -> None:
    kube.create(dv_path(namespace), upload_dv("up", **{VERIFY: "true"}))
    wait_phase(kube, namespace, "up", ("UploadReady",), 120)
    status, text = tenant.upload(tenant.token("up"), images.path("disk.qcow2").read_bytes())
    assert status == 200, text
    verified(kube, namespace, "up")
    same_prefix_then_zeros(data_of(kube, namespace, "up"), images.reference)


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_a_host_assisted_clone_that_asks_is_verified(
    kube: Kube, namespace: str, copy_classes: None, image_server: ImageServer, images: Images,
    mode: str,
) -> None:  # fmt: skip
    import_source(kube, image_server, namespace, "golden", mode)
    succeeded(kube, namespace, "golden")
    storage = {"storageClassName": COPY_CLASS[mode], "volumeMode": mode}
    clone = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
             "metadata": {"name": "copy", "annotations": {VERIFY: "true"}},
             "spec": {"source": {"pvc": {"namespace": namespace, "name": "golden"}},
                      "storage": storage}}  # fmt: skip
    kube.create(dv_path(namespace), clone)
    dv = wait_phase(kube, namespace, "copy", ("Succeeded", "Failed"), 180)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    check = condition(dv, "Verified")
    assert (check["status"], check["reason"]) == ("True", "Verified"), dv["status"]
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "copy"))
    assert pvc["metadata"]["annotations"][RESULT] == "Verified"
    assert pvc["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    same_prefix_then_zeros(data_of(kube, namespace, "copy"), images.reference)
