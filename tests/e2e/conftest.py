"""The end-to-end tier (issue 24): the product as its users run it, on ONE real-node cluster
shared by every test of ``tests/e2e`` (package scope: it starts before the first e2e test and
stops after the last, before the integration tier starts its own).

- The cluster: ``ClusterConfig(node="real")``: kubelet + containerd + runc + CNI + kube-proxy in
  the cluster's own network namespace, the images ``scripts/images.sh`` built in its registry.
- The product: ``crds/`` and ``deploy/`` applied by ``kubectl apply -k deploy/``, the README's
  install, and a CDIConfig an operator would write for this cluster (imports may reach the
  test's servers at ``cluster.host_address``; its registry is listed as insecure: plain http).
- The sources: the test images (made by qemu-img; ``Images.reference`` is ``qemu-img convert
  -O raw`` of the qcow2, what every volume must hold), served by the loopback image server of
  the DataVolume tests (``/ok``, ``/slow`` and ``/crawl``), and a containerDisk of the same qcow2
  in a loopback ``docker-registry``. Both stay on the host's 127.0.0.1 and are exposed inside the
  namespace on ``host_address`` (``testkit.netns.expose``), where pods and containerd reach them.

Nothing is skipped: a missing part (``hack/kube/build.sh``, ``scripts/setup.sh --test``,
``scripts/images.sh``) makes the cluster fixture error with the command to run.
"""

from __future__ import annotations

import json
import re
import secrets
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testkit.cluster import Cluster, ClusterConfig
from testkit.containerdisk import Layout, add_disk, push
from testkit.kubeclient import ApiError, Kube
from testkit.netns import Exposed, expose
from testkit.product import Product
from testkit.registry import Registry
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    ImageServer,
    MiB,
    build_images,
    run,
)

CONTAINERDISK = "disks/e2e"  # repository of the containerDisk in the test registry
CONTAINERDISK_TAG = "v1"
# ``/crawl`` sends a sixteenth of this per second, 64 KiB/s: the 2.6 MB qcow2 takes about 40 s,
# long enough for a controller crash and the standby's takeover (15 s Lease) mid-import.
SLOW_RATE = MiB


@dataclass
class Served:
    """Where pods find the test's sources."""

    images: Images
    http: Exposed
    registry: Exposed
    digest: str  # the containerDisk's manifest digest, as the registry computed it
    blank: Path  # qemu-img convert -O raw of a blank qcow2 (1 MiB of zeros): a blank volume's start

    def url(self, mode: str, name: str) -> str:
        return f"http://{self.http.address}:{self.http.port}/{mode}/{name}"

    @property
    def registry_host(self) -> str:
        return f"{self.registry.address}:{self.registry.port}"

    def containerdisk(self) -> str:
        return f"docker://{self.registry_host}/{CONTAINERDISK}:{CONTAINERDISK_TAG}"


@pytest.fixture(scope="package")
def cluster() -> Iterator[Cluster]:
    state = Path(tempfile.mkdtemp(prefix="testkit-"))
    with Cluster(ClusterConfig(state_dir=state, node="real", start_timeout=120)) as c:
        yield c


@pytest.fixture(scope="package")
def kube(cluster: Cluster) -> Kube:
    return cluster.kube()


@pytest.fixture(scope="package")
def served(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("e2e")
    images = build_images(root / "images")
    server = ImageServer(images.root, slow_rate=SLOW_RATE).start()
    registry = Registry(root / "registry").start()
    layout = Layout.create(root / "layout")
    layout.build(CONTAINERDISK_TAG, [add_disk(("disk.qcow2", images.path("disk.qcow2")))])
    digest = push(layout, CONTAINERDISK_TAG, registry, CONTAINERDISK)
    assert cluster.netns is not None
    http = expose(cluster.netns, cluster.host_address, ("127.0.0.1", server.port))
    reg = expose(cluster.netns, cluster.host_address, ("127.0.0.1", registry.port))
    blank = root / "blank.raw"
    run("qemu-img", "create", "-q", "-f", "qcow2", root / "blank.qcow2", "1M")
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", root / "blank.qcow2", blank)
    out = Served(images, http, reg, digest, blank)
    for node in cluster.realnodes:  # pullMethod: node: containerd pulls it, over plain http
        node.allow_plain_http(out.registry_host)
    try:
        yield out
    finally:
        http.close()
        reg.close()
        registry.stop()
        server.stop()


@pytest.fixture(scope="package")
def product(cluster: Cluster, kube: Kube, served: Served) -> Product:
    """``deploy/`` applied by ``kubectl apply -k``, every Deployment Available, the webhook and
    the upload token API answering; then the operator's CDIConfig, once the controller has
    published its status (a filesystem claim is sized with the class's overhead)."""
    product = Product.on(cluster).install(timeout=300, kustomize=True)
    spec = {
        "importPolicy": {
            "allowedSourceCIDRs": [f"{cluster.host_address}/32"],
            "clusterCIDRs": [cluster.pod_cidr, cluster.service_cidr],
        },
        "insecureRegistries": [served.registry_host],
        # The loop provisioner's small ext4 keeps over 10 % (journal, inode tables, the 5 %
        # reserved for root): more than CDI's default 6 %, so a block device cloned into a
        # filesystem claim of the same request would not fit. What an operator sets for it.
        "filesystemOverhead": {"storageClass": {"testkit-fs": "0.2"}},
    }
    config = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDIConfig"}
    try:
        kube.create(
            f"{DV_API}/cdiconfigs", {**config, "metadata": {"name": "config"}, "spec": spec}
        )
    except ApiError as e:
        if not e.conflict:
            raise
        kube.patch(f"{DV_API}/cdiconfigs/config", {"spec": spec})

    def published() -> bool:
        status = kube.get(f"{DV_API}/cdiconfigs/config").get("status") or {}
        overhead = status.get("filesystemOverhead", {}).get("storageClass", {})
        return overhead.get("testkit-fs") == "0.2"

    wait_until(published, "the CDIConfig's status to carry the operator's overhead", 60)
    return product


def make_namespace(kube: Kube, name: str) -> str:
    kube.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    sa = f"/api/v1/namespaces/{name}/serviceaccounts/default"
    wait_until(lambda: kube.get_or_none(sa), f"default service account in {name}", 30)
    return name


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = make_namespace(kube, f"{slug}-{secrets.token_hex(3)}")
    yield name
    kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def describe(kube: Kube, product: Product | None) -> str:
    """What a failed e2e test leaves for its reader (CI shows it under the failure): every
    DataVolume, claim and pod outside the system namespaces with their status, the events,
    and the tail of the controller's log."""
    out = []
    for ns in kube.get("/api/v1/namespaces")["items"]:
        name = ns["metadata"]["name"]
        if name.startswith("kube-") or name == "default":
            continue
        for dv in kube.get(f"{DV_API}/namespaces/{name}/datavolumes")["items"]:
            out.append(f"{name} dv/{dv['metadata']['name']}: {json.dumps(dv.get('status'))}")
        for kind in ("persistentvolumeclaims", "pods"):
            for obj in kube.get(f"/api/v1/namespaces/{name}/{kind}")["items"]:
                status = {k: v for k, v in obj["status"].items() if k != "conditions"}
                out.append(f"{name} {kind}/{obj['metadata']['name']}: {json.dumps(status)}")
        for e in kube.get(f"/api/v1/namespaces/{name}/events")["items"]:
            out.append(f"{name} event {e['involvedObject']['name']} {e['reason']}: {e['message']}")
    if product is not None:
        out.append(product.log()[-8000:])
    return "\n".join(out)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    args = getattr(item, "funcargs", {})
    product = args.get("product")
    kube = args.get("kube") or (product.kube if isinstance(product, Product) else None)
    if report.failed and call.when == "call" and isinstance(kube, Kube):
        try:
            text = describe(kube, product if isinstance(product, Product) else None)
        except Exception as e:  # the cluster itself may be what failed
            text = f"could not describe the cluster: {e!r}"
        report.sections.append(("e2e cluster state", text))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run ``test_two_nodes.py`` (its own module-scoped two-node cluster) before the rest of the
    tier, so its cluster is torn down before this package's one-node cluster starts: never two
    real-node clusters at once on a 2-core machine."""
    here = Path(__file__).parent
    two_nodes = [i for i in items if i.path.name == "test_two_nodes.py"]
    if two_nodes:
        first = next(n for n, i in enumerate(items) if i.path.parent == here)
        rest = [i for i in items if i.path.name != "test_two_nodes.py"]
        items[:] = rest[:first] + two_nodes + rest[first:]
