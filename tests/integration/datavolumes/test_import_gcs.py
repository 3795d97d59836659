"""``source.gcs`` end to end: the real API server, the product deployed from deploy/, the
importer pod on the local node reading from a real GCS emulator on loopback (fake-gcs-server,
``testkit/gcsserver.py``) with a token the service account of the ``secretRef`` (its
``credentials.json``, mounted at ``/google`` as CDI does) got from a real OAuth token endpoint
(``testkit.gcsserver.TokenServer``: fake-gcs-server has none). The URL is mostly the https form
with the emulator as its host; a ``gs://`` URL needs the controller's ``--gcs-endpoint`` (its
test rolls the deployed controller out with it, and back). The volume holds the image's
bytes; the key appears in no event, condition or pod. A VolumeImportSource reads a public
object without a secret."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.gcsserver import GcsServer, ServiceAccountKey
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
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
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    server = GcsServer(tmp_path_factory.mktemp("gcs")).start()
    yield server
    server.stop()


def gcs_secret(kube: Kube, ns: str, name: str, credentials: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{ns}/secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "data": {"credentials.json": base64.b64encode(credentials.encode()).decode()},
        },
    )


def everything_a_reader_sees(kube: Kube, ns: str, name: str) -> str:
    dv = kube.get(dv_path(ns, name))
    pods = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    return json.dumps([dv, events_for(kube, ns, name), pods])


def test_gcs_qcow2_with_a_service_account_imports_identical_bytes(
    kube: Kube, namespace: str, controller: Product, gcs: GcsServer, images: Images
) -> None:
    gcs.put("golden", "os/disk.qcow2", images.path("disk.qcow2"))
    assert gcs.tokens is not None
    granted = len(gcs.tokens.granted)
    gcs_secret(kube, namespace, "gcs-key", gcs.credentials_json())
    source = {"gcs": {"url": gcs.https_url("golden", "os/disk.qcow2"), "secretRef": "gcs-key"}}
    kube.create(dv_path(namespace), datavolume("fromgcs", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "fromgcs", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert condition(dv, "Ready")["status"] == "True"
    assert len(gcs.tokens.granted) > granted  # the importer asked for a token
    disk = Path(pv_of(kube, namespace, "fromgcs")["spec"]["local"]["path"])
    same_prefix_then_zeros(disk / "disk.img", images.reference)
    key_line = gcs.account.private_pem.splitlines()[1]
    assert key_line not in everything_a_reader_sees(kube, namespace, "fromgcs")


def test_gcs_with_a_key_the_token_endpoint_refuses_fails_permanently_unechoed(
    kube: Kube, namespace: str, controller: Product, gcs: GcsServer, images: Images
) -> None:
    gcs.put("golden", "os/disk.raw.gz", images.path("disk.raw.gz"))
    stranger = ServiceAccountKey.generate(gcs.account.email)
    gcs_secret(kube, namespace, "gcs-wrong", gcs.credentials_json(stranger))
    source = {"gcs": {"url": gcs.https_url("golden", "os/disk.raw.gz"), "secretRef": "gcs-wrong"}}
    kube.create(dv_path(namespace), datavolume("wrongkey", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "wrongkey", ("Failed",), 120)
    running = condition(dv, "Running")
    assert running["reason"] == "SourceForbidden", running
    assert "invalid_grant" in running["message"], running
    assert dv["status"].get("restartCount", 0) == 0
    seen = everything_a_reader_sees(kube, namespace, "wrongkey")
    assert stranger.private_pem.splitlines()[1] not in seen


def test_a_volume_import_source_with_a_public_gcs_object_populates_the_claim(
    kube: Kube, namespace: str, controller: Product, gcs: GcsServer, images: Images
) -> None:
    """No secretRef: the importer asks for no token and reads the object anonymously."""
    gcs.put("public", "os/vis-disk.raw.gz", images.path("disk.raw.gz"))
    assert gcs.tokens is not None
    granted = len(gcs.tokens.granted)
    url = gcs.https_url("public", "os/vis-disk.raw.gz")
    kube.create(vis_path(namespace), import_source("src", {"gcs": {"url": url}}))
    kube.create(pvc_path(namespace), populated_claim("disk", "src", "64Mi"))
    pvc = wait_claim_bound(kube, namespace, "disk")
    assert pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.pod.phase"] == "Succeeded"
    same_prefix_then_zeros(volume_dir(kube, namespace, "disk") / "disk.img", images.reference)
    assert len(gcs.tokens.granted) == granted


def _controller_args(product: Product) -> list[str]:
    deployment = product.kube.get("/apis/apps/v1/namespaces/cdi/deployments/cdi-controller")
    return list(deployment["spec"]["template"]["spec"]["containers"][0]["args"])


def _roll_controller(product: Product, args: list[str]) -> None:
    """The deployed controller with ``args``, rolled out, a new pod leading."""
    patch = [{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}]
    product.kubectl(
        "-n", "cdi", "patch", "deployment", "cdi-controller", "--type=json",
        f"-p={json.dumps(patch)}",
    )  # fmt: skip
    product.kubectl(
        "-n", "cdi", "rollout", "status", "deployment/cdi-controller", "--timeout=180s",
        timeout=200,
    )  # fmt: skip

    def new_leader() -> bool:
        pods = {p["metadata"]["name"] for p in product.pods("cdi-controller")
                if p["spec"]["containers"][0]["args"] == args
                and not p["metadata"].get("deletionTimestamp")}  # fmt: skip
        return product.leader() in pods

    wait_until(new_leader, "a controller with the new flags leading", 120)


@pytest.fixture
def gcs_endpoint_controller(product: Product, gcs: GcsServer) -> Iterator[Product]:
    """The deployed controller rolled out with ``--gcs-endpoint`` (the emulator), and back."""
    before = _controller_args(product)
    _roll_controller(product, [*before, f"--gcs-endpoint={gcs.endpoint}"])
    try:
        yield product
    finally:
        _roll_controller(product, before)


def test_a_gs_url_is_read_from_the_deployed_controllers_gcs_endpoint(
    kube: Kube, namespace: str, gcs_endpoint_controller: Product, gcs: GcsServer, images: Images
) -> None:
    """``gs://bucket/object`` through the deployed controller: its ``--gcs-endpoint`` reaches
    the importer pod (``IMPORTER_GCS_ENDPOINT``), which reads the object from there."""
    url = gcs.put("golden", "gs-form/disk.qcow2", images.path("disk.qcow2"))
    assert url.startswith("gs://golden/")
    gcs_secret(kube, namespace, "gcs-key", gcs.credentials_json())
    source = {"gcs": {"url": url, "secretRef": "gcs-key"}}
    kube.create(dv_path(namespace), datavolume("fromgs", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "fromgs", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    same_prefix_then_zeros(volume_dir(kube, namespace, "fromgs") / "disk.img", images.reference)
