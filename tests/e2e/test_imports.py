"""Imports on a real node, every one started at once by the module's fixture (the importer pods
run side by side; each test then waits for its own): CDI's documented http import and blank
DataVolumes (to a filesystem and a block volume), a registry import pulled by the importer pod
and one pulled by the node (``pullMethod: node``: containerd pulls the containerDisk, the
importer reads it through the holder), and a populated claim whose consumer pod is held back
until the data is in, then reads the whole image. Every volume's bytes are compared with
``qemu-img convert -O raw`` of the served qcow2.

The qemu VM of the process-node tests (``testkit/vm-launcher``) does not run here: that image
is a process-node mapping (a kernel, an initramfs and the host's qemu-system), not an image in
the registry, and building one (qemu-system with its firmware, about 100 MiB more) would double
the tier's image cost; the consumer pod reads the same bytes a VM would boot from.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from string import Template
from typing import Any

import pytest
import yaml

from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.product import Product
from testkit.realnode import PRODUCT_REPOSITORY
from tests.e2e.conftest import Served, make_namespace
from tests.integration.datavolumes.cdi_env import (
    REPO,
    datavolume,
    dv_path,
    events_for,
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
from tests.integration.helpers import pod_manifest, wait_pod_phase

pytestmark = pytest.mark.e2e

EXAMPLES = REPO / "tests" / "integration" / "data" / "cdi-examples.yaml"
# CDI's manifests/example/import-kubevirt-datavolume.yaml and blank-image-datavolume.yaml (the
# default class, a filesystem volume) and doc/datavolumes.md's block example.
HTTP_EXAMPLE, BLANK_EXAMPLE, BLOCK_EXAMPLE = (
    "import-kubevirt-datavolume",
    "blank-image-datavolume",
    "example-import-dv-block",
)
BASE_IMAGE = f"{PRODUCT_REPOSITORY}/cdi-base:latest"
# Run in the consumer pod: the sha256 of the first N bytes of a file, how many bytes it has and
# how many after N are not zero.
READER = """
import hashlib, sys
n, path = int(sys.argv[1]), sys.argv[2]
h, total, nonzero = hashlib.sha256(), 0, 0
with open(path, "rb") as f:
    while chunk := f.read(1 << 20):
        head = chunk[: max(0, n - total)]
        h.update(head)
        nonzero += len(chunk) - len(head) - chunk[len(head):].count(0)
        total += len(chunk)
print(f"sha256={h.hexdigest()} bytes={total} nonzero-after={nonzero}")
"""


@dataclass(frozen=True)
class Started:
    ns: str  # the DataVolumes
    gated: str  # the populated claim "disk", its source "src" and the consumer pod "reader"


def cdi_examples(served: Served, names: tuple[str, ...]) -> list[dict[str, Any]]:
    values = {"IMAGE_URL": served.url("ok", "disk.qcow2")}
    text = Template(EXAMPLES.read_text()).safe_substitute(values)
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(text) if d}
    return [docs[n] for n in names]


def reader_pod(size: int) -> dict[str, Any]:
    argv = ["/opt/cdi/bin/python", "-c", READER, str(size), "/data/disk.img"]
    return pod_manifest(
        "reader",
        "",
        image=BASE_IMAGE,
        command=argv,
        volumes=[{"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}],
        mounts=[{"name": "disk", "mountPath": "/data", "readOnly": True}],
    )


@pytest.fixture(scope="module")
def started(kube: Kube, product: Product, served: Served) -> Iterator[Started]:
    token = secrets.token_hex(3)
    gated = make_namespace(kube, f"e2e-gated-{token}")
    # A claim populated from a VolumeImportSource, and the pod that reads it.
    src = import_source("src", {"http": {"url": served.url("ok", "disk.qcow2")}})
    kube.create(vis_path(gated), src)
    kube.create(pvc_path(gated), populated_claim("disk", "src", "64Mi"))
    kube.create(ns_path(gated, "pods"), reader_pod(served.images.reference.stat().st_size))

    ns = make_namespace(kube, f"e2e-imports-{token}")
    examples = cdi_examples(served, (HTTP_EXAMPLE, BLANK_EXAMPLE, BLOCK_EXAMPLE))
    product.kubectl("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump_all(examples))
    url = served.containerdisk()
    kube.create(dv_path(ns), datavolume("registry-pod", {"registry": {"url": url}}))
    node_pull = {"registry": {"url": url, "pullMethod": "node"}}
    kube.create(dv_path(ns), datavolume("registry-node", node_pull))
    yield Started(ns, gated)
    for name in (ns, gated):
        kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def _succeeded(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    dv = wait_phase(kube, ns, name, ("Succeeded", "Failed"), timeout=300)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    return dv


def test_a_consumer_pod_waits_for_the_populator_then_reads_the_whole_image(
    cluster: Cluster, kube: Kube, started: Started, served: Served
) -> None:
    ns = started.gated
    wait_claim_bound(kube, ns, "disk", timeout=300)
    pod = wait_pod_phase(kube, ns, "reader", ("Succeeded", "Failed"), timeout=240)
    log = cluster.container_log(ns, "reader", "main")
    assert pod["status"]["phase"] == "Succeeded", log
    # Held back: the scheduler refused it while its claim waited for the populator (the
    # claim binds only once the data is in), so it ran after and read all of it.
    refusals = [
        e["message"] for e in events_for(kube, ns, "reader") if e["reason"] == "FailedScheduling"
    ]
    assert any("unbound immediate PersistentVolumeClaims" in m for m in refusals), refusals
    reference = served.images.reference
    expected = hashlib.sha256(reference.read_bytes()).hexdigest()
    fields = dict(item.split("=", 1) for item in log.split())
    assert fields["sha256"] == expected, log
    assert int(fields["bytes"]) >= reference.stat().st_size, log
    assert fields["nonzero-after"] == "0", log
    # It was the populator's claim: the prime's importer pod did the work and is gone.
    prime = kube.get(pvc_path(ns, "disk"))["metadata"]["annotations"]
    assert prime.get("cdi.kubevirt.io/storage.populator.progress") == "100.0%", prime


def test_cdis_documented_http_import_and_blank_datavolumes(
    kube: Kube, started: Started, served: Served
) -> None:
    reference = served.images.reference
    _succeeded(kube, started.ns, HTTP_EXAMPLE)
    same_prefix_then_zeros(volume_dir(kube, started.ns, HTTP_EXAMPLE) / "disk.img", reference)
    _succeeded(kube, started.ns, BLOCK_EXAMPLE)
    same_prefix_then_zeros(volume_dir(kube, started.ns, BLOCK_EXAMPLE), reference)
    _succeeded(kube, started.ns, BLANK_EXAMPLE)
    blank = volume_dir(kube, started.ns, BLANK_EXAMPLE) / "disk.img"
    assert blank.stat().st_size > 400 * 1024 * 1024, blank.stat()  # of the 500Mi asked
    same_prefix_then_zeros(blank, served.blank)


@pytest.mark.parametrize("name", ["registry-pod", "registry-node"])
def test_a_registry_import_pulled_by_the_importer_pod_and_by_the_node(
    kube: Kube, started: Started, served: Served, name: str
) -> None:
    _succeeded(kube, started.ns, name)
    same_prefix_then_zeros(volume_dir(kube, started.ns, name) / "disk.img", served.images.reference)
    pvc = kube.get(pvc_path(started.ns, name))
    digest = pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceDigest"]
    assert digest == served.digest
