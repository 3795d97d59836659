"""DataImportCron with a registry ``pullMethod: node`` template, end to end on the real control
plane (issue 27): the deployed controller's poller pod is CDI's shape, the tag's image run by
the node (``imagePullPolicy: Always``) as the ``server`` container with the static holder, and
the digest the cron imports is the ``imageID`` the node reports for it (the test node resolves
the tag with skopeo, as a kubelet's runtime does, from the anonymous ``docker-registry`` on
127.0.0.1). A new image pushed to the tag and a forced poll import the new digest and move the
DataSource; a tag that does not exist is a poll error (``ImagePullFailed``, CDI's "failed to
pull image") and nothing is imported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.containerdisk import Layout, add_disk, push
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.registry import Registry
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
from tests.integration.test_dataimportcron import CRONS, DVS, wait_pointed

pytestmark = pytest.mark.integration
REPO = "disks/cron-np"  # clear of the node map's globs (*fedora*, *python*, ...)
POLL_ERROR = "cdi.kubevirt.io/storage.import.pollError"


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    reg = Registry(tmp_path_factory.mktemp("cron-nodepull") / "reg").start()
    yield reg
    reg.stop()


def publish(registry: Registry, disk: Path, work: Path) -> str:
    layout = Layout.create(work)
    layout.build("latest", [add_disk((disk.name, disk))], env=["TEST_KUBEVIRT_IO_TEST=cronnode"])
    return push(layout, "latest", registry, REPO)


def node_cron(name: str, url: str) -> dict[str, Any]:
    storage = {"storageClassName": "testkit-fs", "resources": {"requests": {"storage": "64Mi"}}}
    source = {"registry": {"url": url, "pullMethod": "node"}}
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataImportCron",
        "metadata": {"name": name},
        "spec": {
            "schedule": "0 0 1 1 *",  # once a year: polls here are the creation one and forced
            "managedDataSource": name,
            "importsToKeep": 1,
            "template": {"spec": {"source": source, "storage": storage}},
        },
    }


def test_a_node_pull_cron_imports_the_digest_the_node_resolved_and_follows_the_tag(
    kube: Kube,
    namespace: str,
    registry: Registry,
    controller: Product,
    images: Images,
    tmp_path: Path,
) -> None:
    ns = namespace
    first = publish(registry, images.root / "disk.qcow2", tmp_path / "one")
    kube.create(CRONS.format(ns=ns), node_cron("np", registry.url(REPO, "latest")))
    one = f"np-{first.removeprefix('sha256:')[:12]}"
    wait_pointed(kube, ns, one, controller, cron="np", source="np")
    dv = kube.get(f"{DVS.format(ns=ns)}/{one}")
    registry_source = dv["spec"]["source"]["registry"]
    assert registry_source["url"].endswith(f"/{REPO}@{first}"), registry_source
    assert registry_source["pullMethod"] == "node"
    claim = kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{one}")["metadata"]
    assert claim["annotations"]["cdi.kubevirt.io/storage.import.sourceDigest"] == first
    assert claim["labels"]["test.kubevirt.io/test"] == "cronnode"
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, one)["spec"]["local"]["path"]) / "disk.img", images.reference
    )
    cron = kube.get(f"{CRONS.format(ns=ns)}/np")
    assert POLL_ERROR not in cron["metadata"]["annotations"]

    # a new image on the same tag; a forced poll: the node resolves the tag again (Always)
    second = publish(registry, images.root / "disk.raw.gz", tmp_path / "two")
    assert second != first
    forced = {"cdi.kubevirt.io/storage.import.nextCronTime": "2000-01-01T00:00:00Z"}
    kube.patch(f"{CRONS.format(ns=ns)}/np", {"metadata": {"annotations": forced}})
    two = f"np-{second.removeprefix('sha256:')[:12]}"
    wait_pointed(kube, ns, two, controller, cron="np", source="np")
    wait_until(lambda: kube.get_or_none(f"{DVS.format(ns=ns)}/{one}") is None, "old import", 60)
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, two)["spec"]["local"]["path"]) / "disk.img", images.reference
    )
    pollers = [
        p["metadata"]["name"]
        for p in kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
        if p["metadata"]["name"].startswith("poller-")
    ]
    assert pollers == [], pollers  # each poll's pod is deleted once read


def test_a_node_pull_cron_on_a_missing_tag_says_the_pull_failed_and_imports_nothing(
    kube: Kube, namespace: str, registry: Registry, controller: Product
) -> None:
    ns = namespace
    kube.create(CRONS.format(ns=ns), node_cron("np", registry.url(REPO, "no-such-tag")))

    def error() -> dict[str, str] | None:
        ann = kube.get(f"{CRONS.format(ns=ns)}/np")["metadata"].get("annotations") or {}
        return json.loads(ann[POLL_ERROR]) if POLL_ERROR in ann else None

    found = wait_until(error, "the cron's poll error", 120)
    assert found["reason"] == "ImagePullFailed", found
    assert found["message"].startswith("failed to pull image"), found
    assert kube.get(DVS.format(ns=ns))["items"] == []
    cron = kube.get(f"{CRONS.format(ns=ns)}/np")
    assert "cdi.kubevirt.io/storage.import.sourceDesiredDigest" not in cron["metadata"].get(
        "annotations", {}
    )
