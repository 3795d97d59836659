"""The VolumeUploadSource populator on the real control plane, with the product deployed from
deploy/: a claim naming a VolumeUploadSource stays unbound while an upload server runs on its
prime; a tenant's token for the *target* claim (through the kube-apiserver) and the deployed
upload proxy bring the bytes to the prime's server; then the target binds with the data and the
prime is gone. DataVolumes with an upload source on CSI storage take the same road."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    datavolume,
    dv_path,
    event_reasons,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)
from tests.integration.datavolumes.populator_env import claims, pvc_path, volumes_for
from tests.integration.datavolumes.test_upload import User, gone
from tests.integration.helpers import pvc_manifest

pytestmark = pytest.mark.integration
ANN = "cdi.kubevirt.io/storage."


@pytest.fixture
def tenant(cluster: Cluster, kube: Kube, namespace: str, product: Product) -> User:
    """``alice`` (edit in the namespace): tokens and uploads as in test_upload.py."""
    return User(cluster, kube, namespace)


def vus_path(ns: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/volumeuploadsources" + (f"/{name}" if name else "")


def upload_source(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "VolumeUploadSource",
        "metadata": {"name": name},
        "spec": spec,
    }


def annotations(kube: Kube, ns: str, name: str) -> dict[str, str]:
    return dict(kube.get(pvc_path(ns, name))["metadata"].get("annotations") or {})


def test_plain_pvc_with_volume_upload_source_binds_with_the_uploaded_bytes(
    kube: Kube, namespace: str, tenant: User, images: Images
) -> None:
    kube.create(vus_path(namespace), upload_source("up", contentType="kubevirt"))
    pvc = pvc_manifest("disk", "32Mi", "testkit-fs")
    pvc["spec"]["dataSourceRef"] = {
        "apiGroup": "cdi.kubevirt.io",
        "kind": "VolumeUploadSource",
        "name": "up",
    }
    target = kube.create(pvc_path(namespace), pvc)
    prime = f"prime-{target['metadata']['uid']}"
    wait_until(
        lambda: annotations(kube, namespace, "disk").get(ANN + "pod.ready") == "true",
        "the prime's upload server ready, said on the target",
        120,
    )
    ann = annotations(kube, namespace, "disk")
    assert ann[ANN + "populator.pvcPrime"] == prime
    assert ann[ANN + "pod.phase"] == "Running"
    assert not kube.get(pvc_path(namespace, "disk"))["spec"].get("volumeName")
    prime_ann = annotations(kube, namespace, prime)
    assert ANN + "upload.target" in prime_ann and prime_ann[ANN + "pod.ready"] == "true"
    assert not gone(kube, namespace, "pods", f"cdi-upload-{prime}")

    token = tenant.token("disk")  # for the target: the proxy finds the prime
    status, text = tenant.upload(token, images.path("disk.qcow2").read_bytes())
    assert status == 200, text
    wait_until(
        lambda: kube.get(pvc_path(namespace, "disk"))["status"].get("phase") == "Bound",
        "the target claim Bound",
        120,
    )
    ann = annotations(kube, namespace, "disk")
    assert ann[ANN + "populator.progress"] == "100.0%"
    assert ann[ANN + "pod.phase"] == "Succeeded"
    disk = volume_dir(kube, namespace, "disk") / "disk.img"
    same_prefix_then_zeros(disk, images.reference)
    wait_until(lambda: prime not in claims(kube, namespace), "the prime claim deleted", 30)
    wait_until(
        lambda: all(
            gone(kube, namespace, kind, name)
            for kind, name in (
                ("pods", f"cdi-upload-{prime}"),
                ("services", f"cdi-upload-{prime}"),
                ("secrets", f"cdi-upload-{prime}-tls"),
            )
        ),
        "the prime's server, Service and Secret cleaned up",
        30,
    )
    event_reasons(
        kube, namespace, "disk", {"CreatedPVCPrimeSuccessfully", "UploadReady", "UploadSucceeded"}
    )
    again = tenant.upload(token, b"x" * 4096)
    assert again[0] == 503, again


@pytest.mark.parametrize(
    ("mode", "storage_class", "image"),
    [("Filesystem", "testkit-csi-fs", "disk.qcow2"), ("Block", "testkit-csi-block", "disk.raw.gz")],
)
def test_datavolume_upload_on_csi_storage_goes_through_the_populator(
    kube: Kube,
    namespace: str,
    tenant: User,
    images: Images,
    mode: str,
    storage_class: str,
    image: str,
) -> None:
    manifest = datavolume("up", {"upload": {}}, "32Mi", storage_class, mode=mode)
    kube.create(dv_path(namespace), manifest)
    dv = wait_phase(kube, namespace, "up", ("UploadReady",), 120)
    ref = kube.get(pvc_path(namespace, "up"))["spec"]["dataSourceRef"]
    assert ref == {
        "apiGroup": "cdi.kubevirt.io",
        "kind": "VolumeUploadSource",
        "name": f"volume-upload-source-{dv['metadata']['uid']}",
    }
    source = kube.get(vus_path(namespace, ref["name"]))
    assert source["metadata"]["ownerReferences"][0]["uid"] == dv["metadata"]["uid"]
    assert not kube.get(pvc_path(namespace, "up"))["spec"].get("volumeName")

    status, text = tenant.upload(tenant.token("up"), images.path(image).read_bytes())
    assert status == 200, text
    dv = wait_phase(kube, namespace, "up", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["progress"] == "100.0%"
    local = volume_dir(kube, namespace, "up")
    same_prefix_then_zeros(local if mode == "Block" else local / "disk.img", images.reference)
    prime = f"prime-{kube.get(pvc_path(namespace, 'up'))['metadata']['uid']}"
    wait_until(lambda: prime not in claims(kube, namespace), "the prime claim deleted", 30)


def test_the_webhook_refuses_a_bad_content_type_and_spec_changes(
    kube: Kube, namespace: str, product: Product
) -> None:
    with pytest.raises(ApiError) as refused:
        kube.create(vus_path(namespace), upload_source("bad", contentType="invalid"))
    assert "ContentType not one of: kubevirt, archive" in str(refused.value)
    for name, content in (("empty", ""), ("archive", "archive"), ("kubevirt", "kubevirt")):
        kube.create(vus_path(namespace), upload_source(name, contentType=content))
    with pytest.raises(ApiError) as changed:
        kube.patch(vus_path(namespace, "archive"), {"spec": {"contentType": "kubevirt"}})
    assert "Cannot update VolumeUploadSource Spec" in str(changed.value)


def test_deleting_the_source_changes_nothing_and_deleting_a_target_leaves_nothing_behind(
    kube: Kube, namespace: str, tenant: User, images: Images
) -> None:
    kube.create(vus_path(namespace), upload_source("up"))
    primes = {}
    for name in ("kept", "dropped"):
        pvc = pvc_manifest(name, "32Mi", "testkit-fs")
        pvc["spec"]["dataSourceRef"] = {
            "apiGroup": "cdi.kubevirt.io",
            "kind": "VolumeUploadSource",
            "name": "up",
        }
        primes[name] = f"prime-{kube.create(pvc_path(namespace), pvc)['metadata']['uid']}"
    for name in primes:
        wait_until(
            lambda n=name: annotations(kube, namespace, n).get(ANN + "pod.ready") == "true",
            f"{name} ready",
            120,
        )
    kube.delete(vus_path(namespace, "up"))
    kube.delete(pvc_path(namespace, "dropped"))  # its prime's server holds the prime: it goes
    status, text = tenant.upload(tenant.token("kept"), images.path("disk.qcow2").read_bytes())
    assert status == 200, text
    wait_until(
        lambda: kube.get(pvc_path(namespace, "kept"))["status"].get("phase") == "Bound",
        "kept Bound",
        120,
    )
    disk = volume_dir(kube, namespace, "kept") / "disk.img"
    same_prefix_then_zeros(disk, images.reference)

    def only_kept_left() -> bool:
        pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        volumes = volumes_for(kube, namespace)
        return set(claims(kube, namespace)) == {"kept"} and not pods and len(volumes) == 1

    wait_until(only_kept_left, "no prime, server pod or volume left but kept's", 90)
