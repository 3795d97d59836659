"""``source.s3`` end to end, through a DataVolume and a VolumeImportSource: the real API
server, the product deployed from deploy/, the importer pod on the local node reading from a real
S3 server on loopback (versitygw, ``testkit/s3server.py``) with the key pair of the
``secretRef``; the volume holds the image's bytes, and the secret appears in no event,
condition or termination message."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.s3server import S3Server
from tests.integration.datavolumes.cdi_env import (
    Images,
    condition,
    datavolume,
    dv_path,
    events_for,
    pv_of,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)
from tests.integration.datavolumes.populator_env import (
    import_source,
    populated_claim,
    pvc_path,
    vis_path,
    wait_claim_bound,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    yield server
    server.stop()


def s3_secret(kube: Kube, ns: str, name: str, access: str, secret: str) -> None:
    data = {"accessKeyId": access, "secretKey": secret}
    kube.create(
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
    )


def everything_a_reader_sees(kube: Kube, ns: str, name: str) -> str:
    dv = kube.get(dv_path(ns, name))
    pods = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    return json.dumps([dv, events_for(kube, ns, name), pods])


def test_s3_qcow2_with_a_secret_ref_imports_identical_bytes(
    kube: Kube, namespace: str, controller: Product, s3: S3Server, images: Images
) -> None:
    url = s3.put("golden", "os/disk.qcow2", images.path("disk.qcow2"))
    s3_secret(kube, namespace, "s3-keys", s3.access_key, s3.secret_key)
    source = {"s3": {"url": url, "secretRef": "s3-keys"}}
    kube.create(dv_path(namespace), datavolume("froms3", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "froms3", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert condition(dv, "Ready")["status"] == "True"
    disk = Path(pv_of(kube, namespace, "froms3")["spec"]["local"]["path"])
    same_prefix_then_zeros(disk / "disk.img", images.reference)
    assert s3.secret_key not in everything_a_reader_sees(kube, namespace, "froms3")


def test_s3_with_wrong_keys_fails_permanently_without_echoing_them(
    kube: Kube, namespace: str, controller: Product, s3: S3Server, images: Images
) -> None:
    url = s3.put("golden", "os/disk.raw.gz", images.path("disk.raw.gz"))
    wrong = "not-the-secret-9f8e7d"
    s3_secret(kube, namespace, "s3-wrong", s3.access_key, wrong)
    source = {"s3": {"url": url, "secretRef": "s3-wrong"}}
    kube.create(dv_path(namespace), datavolume("wrongkeys", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "wrongkeys", ("Failed",), 120)
    running = condition(dv, "Running")
    assert running["reason"] == "SourceForbidden", running
    assert "SignatureDoesNotMatch" in running["message"], running
    assert dv["status"].get("restartCount", 0) == 0
    seen = everything_a_reader_sees(kube, namespace, "wrongkeys")
    assert wrong not in seen and s3.secret_key not in seen


def test_a_volume_import_source_with_s3_populates_the_claim(
    kube: Kube, namespace: str, controller: Product, s3: S3Server, images: Images
) -> None:
    url = s3.put("golden", "os/vis-disk.raw.gz", images.path("disk.raw.gz"))
    s3_secret(kube, namespace, "s3-keys", s3.access_key, s3.secret_key)
    kube.create(
        vis_path(namespace), import_source("src", {"s3": {"url": url, "secretRef": "s3-keys"}})
    )
    kube.create(pvc_path(namespace), populated_claim("disk", "src", "64Mi"))
    pvc = wait_claim_bound(kube, namespace, "disk")
    assert pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"] == "Succeeded"
    same_prefix_then_zeros(volume_dir(kube, namespace, "disk") / "disk.img", images.reference)
