"""Registry DataVolumes end to end: the real API server, the product deployed from deploy/, the
importer pod on the local node pulling a containerDisk (built with umoci, pushed with skopeo)
from the real ``docker-registry`` on 127.0.0.1 (which the session's CDIConfig import policy
allows), over TLS with the CA from ``certConfigMap`` and htpasswd credentials from
``secretRef``; and CDI's ``ImagePullFailed`` for an unknown tag."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.containerdisk import Layout, add_disk, push
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.registry import Registry, Tls
from tests.integration.datavolumes.cdi_env import (
    Images,
    datavolume,
    dv_path,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
    wait_running_reason,
)

pytestmark = pytest.mark.integration
USER, PASSWORD = "puller", "pull-secret-1"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, images: Images) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("registry")
    reg = Registry(root / "reg", tls=Tls.make(root / "tls"), users={USER: PASSWORD}).start()
    layout = Layout.create(root / "layout")
    disk = images.root / "disk.qcow2"
    layout.build("v1", [add_disk(("disk.qcow2", disk))], env=["TEST_KUBEVIRT_IO_TEST=testvalue"])
    reg.pushed["disks/tiny"] = push(layout, "v1", reg, "disks/tiny", creds=(USER, PASSWORD))
    yield reg
    reg.stop()


def registry_access(
    kube: Kube, namespace: str, registry: Registry, user: str, password: str, secret: str
) -> None:
    """The registry's CA as ConfigMap ``reg-ca`` and CDI's credential Secret ``secret``."""
    assert registry.tls is not None
    kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "reg-ca"}, "data": {"ca.crt": registry.tls.ca_pem.read_text()}},
    )
    data = {"accessKeyId": user, "secretKey": password}
    kube.create(
        f"/api/v1/namespaces/{namespace}/secrets",
        {
            "metadata": {"name": secret},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
        },
    )


def _credentials(kube: Kube, namespace: str, registry: Registry) -> None:
    registry_access(kube, namespace, registry, USER, PASSWORD, "reg-creds")


def test_registry_datavolume_imports_the_containerdisk(
    kube: Kube, namespace: str, controller: Product, registry: Registry, images: Images
) -> None:
    _credentials(kube, namespace, registry)
    source = {
        "registry": {
            "url": registry.url("disks/tiny", "v1"),
            "secretRef": "reg-creds",
            "certConfigMap": "reg-ca",
        }
    }
    kube.create(dv_path(namespace), datavolume("golden", source, size="64Mi"))
    dv = wait_phase(kube, namespace, "golden", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["restartCount"] == 0
    disk = Path(pv_of(kube, namespace, "golden")["spec"]["local"]["path"]) / "disk.img"
    same_prefix_then_zeros(disk, images.reference)
    pvc = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/golden")
    assert pvc["metadata"]["labels"]["test.kubevirt.io/test"] == "testvalue"
    digest = pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceDigest"]
    assert digest == registry.pushed["disks/tiny"]


def test_unknown_tag_is_image_pull_failed(
    kube: Kube, namespace: str, controller: Product, registry: Registry
) -> None:
    _credentials(kube, namespace, registry)
    source = {
        "registry": {
            "url": registry.url("myorg/myimage", "wrongtag"),
            "secretRef": "reg-creds",
            "certConfigMap": "reg-ca",
        }
    }
    kube.create(dv_path(namespace), datavolume("missing", source, size="64Mi"))

    running = wait_running_reason(kube, namespace, "missing", "ImagePullFailed")
    assert running["status"] == "False"
    assert running["message"].startswith("failed to pull image")
