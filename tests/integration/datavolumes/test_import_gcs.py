"""``source.gcs`` end to end: the real API server, the product deployed from deploy/, the
importer pod on the local node reading from a real GCS emulator on loopback (fake-gcs-server,
``testkit/gcsserver.py``) with a token the service account of the ``secretRef`` (its
``credentials.json``, mounted at ``/google`` as CDI does) got from a real OAuth token endpoint
(``testkit.gcsserver.TokenServer``: fake-gcs-server has none; the key's ``token_uri`` names it).
The URL is the https form with the emulator as its host, or ``gs://bucket/object`` read from the
endpoint the operator names in CDIConfig ``spec.gcsEndpoint`` (the emulator), which the import
network policy still judges. The volume holds the image's bytes; the key appears in no event,
condition or pod. A VolumeImportSource reads a public object without a secret."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.gcsserver import GcsServer, ServiceAccountKey
from testkit.kubeclient import Kube
from testkit.product import Product
from tests.integration.datavolumes.cdi_env import (
    DV_API,
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


CONFIG = f"{DV_API}/cdiconfigs/config"


@pytest.fixture
def gcs_endpoint(kube: Kube) -> Iterator[Callable[[str], None]]:
    """Sets CDIConfig ``spec.gcsEndpoint``; unset again after the test."""

    def configure(endpoint: str) -> None:
        kube.patch(CONFIG, {"spec": {"gcsEndpoint": endpoint}})
        time.sleep(2)  # the controller reads CDIConfig from its informer cache

    yield configure
    kube.patch(CONFIG, {"spec": {"gcsEndpoint": None}})


def test_gs_urls_are_read_from_the_operators_gcs_endpoint_with_and_without_a_secret(
    kube: Kube,
    namespace: str,
    controller: Product,
    gcs: GcsServer,
    images: Images,
    gcs_endpoint: Callable[[str], None],
) -> None:
    """``gs://bucket/object`` through the deployed controller: a private object with the
    service account's token and a public one anonymously, both from the emulator the operator
    named; the importer pods carry the endpoint, from CDIConfig only."""
    gcs_endpoint(gcs.endpoint)
    private = gcs.put("golden", "os/gs-disk.qcow2", images.path("disk.qcow2"))
    public = gcs.put("public", "os/gs-disk.raw.gz", images.path("disk.raw.gz"))
    assert private == "gs://golden/os/gs-disk.qcow2" and gcs.tokens is not None
    granted = len(gcs.tokens.granted)
    gcs_secret(kube, namespace, "gs-key", gcs.credentials_json())
    sources = {
        "gs-private": {"gcs": {"url": private, "secretRef": "gs-key"}},
        "gs-public": {"gcs": {"url": public}},
    }
    for name, source in sources.items():
        kube.create(dv_path(namespace), datavolume(name, source, size="64Mi"))
    for name in sources:
        dv = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), 120)
        assert dv["status"]["phase"] == "Succeeded", (name, dv["status"])
        disk = Path(pv_of(kube, namespace, name)["spec"]["local"]["path"]) / "disk.img"
        same_prefix_then_zeros(disk, images.reference)
    assert len(gcs.tokens.granted) == granted + 1  # the private import's token only
    key_line = gcs.account.private_pem.splitlines()[1]
    assert key_line not in everything_a_reader_sees(kube, namespace, "gs-private")


def test_the_import_policy_applies_to_the_operators_gcs_endpoint(
    kube: Kube,
    namespace: str,
    controller: Product,
    gcs: GcsServer,
    gcs_endpoint: Callable[[str], None],
) -> None:
    """The session's policy allows 127.0.0.1/32 only: an endpoint on 127.0.0.2 is refused at
    the dial, permanently, and named; an operator's endpoint is no way around the policy."""
    gcs_endpoint(f"http://127.0.0.2:{gcs.port}")
    source = {"gcs": {"url": "gs://golden/os/anything.img"}}
    kube.create(dv_path(namespace), datavolume("gs-refused", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "gs-refused", ("Failed",), 120)
    running = condition(dv, "Running")
    assert running["reason"] == "SourceForbidden", running
    assert "127.0.0.2" in running["message"] and "import policy" in running["message"], running
    assert dv["status"].get("restartCount", 0) == 0
