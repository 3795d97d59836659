"""DataImportCron end to end on the real control plane: the deployed controller polls the tag's
digest with a poller pod, imports it as ``<managedDataSource>-<12 hex>`` pinned to the digest,
points the DataSource at it; a new image pushed to the tag and a forced poll (the
``nextCronTime`` annotation) import the new digest, move the DataSource and collect the old
import; tampering with the DataSource is repaired; deleting the cron keeps what the default
retention policy keeps. The registry is the real ``docker-registry`` over TLS with htpasswd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.containerdisk import Layout, add_disk, push
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.registry import Registry, Tls
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    pv_of,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.cdi_env import (  # the fixtures this module uses
    cdi_crds as cdi_crds,
)
from tests.integration.datavolumes.cdi_env import (
    controller as controller,
)
from tests.integration.datavolumes.cdi_env import (
    images as images,
)
from tests.integration.datavolumes.cdi_env import (
    product as product,
)
from tests.integration.datavolumes.test_registry_datavolume import registry_access

pytestmark = pytest.mark.integration
USER, PASSWORD = "cron", "cron-secret-2"
CRONS = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/dataimportcrons"
SOURCES = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datasources"
DVS = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datavolumes"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    root = tmp_path_factory.mktemp("cron-registry")
    reg = Registry(root / "reg", tls=Tls.make(root / "tls"), users={USER: PASSWORD}).start()
    yield reg
    reg.stop()


def publish(registry: Registry, disk: Path, work: Path) -> str:
    layout = Layout.create(work)
    layout.build("latest", [add_disk((disk.name, disk))], env=["TEST_KUBEVIRT_IO_TEST=testvalue"])
    return push(layout, "latest", registry, "golden/fedora", creds=(USER, PASSWORD))


def cron(registry: Registry) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataImportCron",
        "metadata": {"name": "fedora-cron"},
        "spec": {
            "schedule": "0 0 1 1 *",  # once a year: polls here are the creation one and forced
            "managedDataSource": "fedora",
            "importsToKeep": 1,
            "template": {
                "spec": {
                    "source": {
                        "registry": {
                            "url": registry.url("golden/fedora", "latest"),
                            "secretRef": "reg",
                            "certConfigMap": "reg-ca",
                        }
                    },
                    "storage": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "testkit-fs",
                        "resources": {"requests": {"storage": "64Mi"}},
                    },
                }
            },
        },
    }


def wait_pointed(
    kube: Kube,
    ns: str,
    want: str,
    product: Product,
    cron: str = "fedora-cron",
    source: str = "fedora",
) -> dict[str, Any]:
    """The cron's DataSource ``source`` once it points at claim ``want`` and is Ready; on a
    timeout, the cron's, DataVolumes' and pods' state and the product's log."""
    try:
        return wait_until(lambda: pointed_at(kube, ns, want, source), f"{source} at {want}", 150)
    except TimeoutError as exc:
        state = {
            "cron": kube.get_or_none(f"{CRONS.format(ns=ns)}/{cron}"),
            "datasource": kube.get_or_none(f"{SOURCES.format(ns=ns)}/{source}"),
            "dvs": [d.get("status") for d in kube.get(DVS.format(ns=ns))["items"]],
            "pods": [p.get("status") for p in kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]],
        }
        raise AssertionError(f"{exc}\n{state}\n{product.log()[-3000:]}") from exc


def pointed_at(kube: Kube, ns: str, want: str, source: str = "fedora") -> dict[str, Any] | None:
    """DataSource ``source`` when it points at claim ``want`` and is Ready, else None."""
    ds = kube.get_or_none(f"{SOURCES.format(ns=ns)}/{source}")
    pvc = (((ds or {}).get("spec") or {}).get("source") or {}).get("pvc") or {}
    if ds is None or pvc.get("name") != want:
        return None
    ready = [c for c in (ds.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"]
    return ds if ready and ready[0]["status"] == "True" else None


def test_cron_imports_each_digest_and_keeps_its_data_source(
    kube: Kube, namespace: str, registry: Registry, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    disks: Images = request.getfixturevalue("images")
    first = publish(registry, disks.root / "disk.qcow2", tmp_path / "one")
    registry_access(kube, ns, registry, USER, PASSWORD, "reg")
    kube.create(CRONS.format(ns=ns), cron(registry))
    one = f"fedora-{first.removeprefix('sha256:')[:12]}"
    ds = wait_pointed(kube, ns, one, deployed)
    assert ds["metadata"]["labels"]["cdi.kubevirt.io/dataImportCron"] == "fedora-cron"
    dv = kube.get(f"{DVS.format(ns=ns)}/{one}")
    assert dv["spec"]["source"]["registry"]["url"].endswith(f"/golden/fedora@{first}")
    status = kube.get(f"{CRONS.format(ns=ns)}/fedora-cron")["status"]
    assert status["lastImportedPVC"] == {"name": one, "namespace": ns}
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["UpToDate"]["status"] == "True" and conds["Progressing"]["status"] == "False"
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, one)["spec"]["local"]["path"]) / "disk.img", disks.reference
    )

    # tampering: repointed, then deleted -> restored
    kube.patch(f"{SOURCES.format(ns=ns)}/fedora", {"spec": {"source": {"pvc": {"name": "dummy"}}}})
    wait_until(lambda: pointed_at(kube, ns, one), "DataSource repointed back", 60)
    kube.delete(f"{SOURCES.format(ns=ns)}/fedora")
    wait_until(lambda: pointed_at(kube, ns, one), "DataSource re-created", 60)

    # a new image on the tag, a forced poll: new pinned import, DataSource moves, old one goes
    second = publish(registry, disks.root / "disk.raw.gz", tmp_path / "two")
    assert second != first
    patch = {
        "metadata": {
            "annotations": {"cdi.kubevirt.io/storage.import.nextCronTime": "2000-01-01T00:00:00Z"}
        }
    }
    kube.patch(f"{CRONS.format(ns=ns)}/fedora-cron", patch)
    two = f"fedora-{second.removeprefix('sha256:')[:12]}"
    wait_pointed(kube, ns, two, deployed)
    wait_until(
        lambda: kube.get_or_none(f"{DVS.format(ns=ns)}/{one}") is None, "old import collected", 60
    )
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, two)["spec"]["local"]["path"]) / "disk.img", disks.reference
    )

    # default retention: deleting the cron keeps the DataSource and the last import
    kube.delete(f"{CRONS.format(ns=ns)}/fedora-cron")
    wait_until(
        lambda: kube.get_or_none(f"{CRONS.format(ns=ns)}/fedora-cron") is None, "cron gone", 30
    )
    assert kube.get_or_none(f"{SOURCES.format(ns=ns)}/fedora") is not None
    assert kube.get_or_none(f"{DVS.format(ns=ns)}/{two}") is not None


def test_cron_with_retention_none_takes_its_imports_and_data_source_along(
    kube: Kube, namespace: str, registry: Registry, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    disks: Images = request.getfixturevalue("images")
    digest = publish(registry, disks.root / "disk.qcow2", tmp_path / "one")
    registry_access(kube, ns, registry, USER, PASSWORD, "reg")
    body = cron(registry)
    body["spec"]["retentionPolicy"] = "None"
    kube.create(CRONS.format(ns=ns), body)
    one = f"fedora-{digest.removeprefix('sha256:')[:12]}"
    wait_pointed(kube, ns, one, deployed)
    kube.delete(f"{CRONS.format(ns=ns)}/fedora-cron")
    wait_until(
        lambda: (
            kube.get_or_none(f"{SOURCES.format(ns=ns)}/fedora") is None
            and kube.get_or_none(f"{DVS.format(ns=ns)}/{one}") is None
        ),
        "DataSource and import deleted with the cron (retentionPolicy None)",
        90,
    )
