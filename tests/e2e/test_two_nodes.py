"""Two real nodes (issues 24 and 26): where volumes and worker pods land when there is a choice.

One two-node real-node cluster for the module (``testkit-node``, ``testkit-node-2``: kubelet,
containerd and CNI each, in the cluster's network namespace), ``deploy/`` applied unchanged.
The loop-device provisioner serves both nodes (each volume local to the node it was made on,
``testkit.volumeplacement``), so:

* a host-assisted clone copies across nodes: the source volume on the first node (a class
  whose ``allowedTopologies`` names it), the target on the second, the clone source pod on the
  source's node, the upload server on the target's, the bytes identical;
* the CDI resource's ``workload`` placement and a DataVolume's
  ``cdi.kubevirt.io/storage.pod.nodeSelector`` put the importer, and with it a
  WaitForFirstConsumer volume, on the node they name; a placement no node satisfies leaves the
  DataVolume ``ImportScheduled`` with Running False ``Unschedulable``, never ``Failed``.

Nothing is skipped: a missing real-node part makes the cluster fixture error with the command
that provides it.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster, ClusterConfig
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.product import Product
from testkit.volumeplacement import HOSTNAME, pv_node
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    build_images,
    condition,
    datavolume,
    dv_path,
    pv_of,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
    wait_running_reason,
)

pytestmark = pytest.mark.integration

NODE_1, NODE_2 = "testkit-node", "testkit-node-2"
CLASS_ON = {NODE_1: "two-nodes-on-1", NODE_2: "two-nodes-on-2"}
WFFC = "testkit-fs-wffc"
CSI_FS, CSI_BLOCK = "testkit-csi-fs", "testkit-csi-block"
CDI = f"{DV_API}/cdis/cdi"
CONFIG = f"{DV_API}/cdiconfigs/config"
RETAIN = "cdi.kubevirt.io/storage.pod.retainAfterCompletion"
IMMEDIATE = "cdi.kubevirt.io/storage.bind.immediate.requested"
NODE_SELECTOR = "cdi.kubevirt.io/storage.pod.nodeSelector"
CLONE_STRATEGY = "cdi.kubevirt.io/clone-strategy"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    state = Path(tempfile.mkdtemp(prefix="testkit-"))
    c = Cluster(ClusterConfig(state_dir=state, node="real", nodes=2, start_timeout=120))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def kube(cluster: Cluster) -> Kube:
    return cluster.kube()


@pytest.fixture(scope="module")
def product(cluster: Cluster, kube: Kube) -> Product:
    """``deploy/`` Available, a CDIConfig that lets imports reach the test's image server,
    and one StorageClass per node (the provisioner's, ``allowedTopologies`` that node; clone
    strategy ``copy``, as a storage admin marks local storage)."""
    product = Product.on(cluster).install(timeout=240)
    policy = {
        "importPolicy": {
            "allowedSourceCIDRs": [f"{cluster.host_address}/32"],
            "clusterCIDRs": [cluster.pod_cidr, cluster.service_cidr],
        }
    }
    try:
        kube.create(
            f"{DV_API}/cdiconfigs",
            {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDIConfig",
             "metadata": {"name": "config"}, "spec": policy},
        )  # fmt: skip
    except ApiError as e:
        if not e.conflict:
            raise
        kube.patch(CONFIG, {"spec": policy})
    for node, name in CLASS_ON.items():
        kube.create(
            "/apis/storage.k8s.io/v1/storageclasses",
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                # local volumes: the storage cannot clone one to another node
                "metadata": {"name": name, "annotations": {CLONE_STRATEGY: "copy"}},
                "provisioner": "testkit.local/loop",
                "reclaimPolicy": "Delete",
                "volumeBindingMode": "Immediate",
                "allowedTopologies": [
                    {"matchLabelExpressions": [{"key": HOSTNAME, "values": [node]}]}
                ],
            },
        )
    return product


@pytest.fixture(scope="module")
def served(
    cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Images, str]]:
    """The test images, served inside the cluster's network namespace where pods reach."""
    images = build_images(tmp_path_factory.mktemp("images"))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

    server = cluster.network_call(
        lambda: http.server.ThreadingHTTPServer(
            (cluster.host_address, 0), partial(Quiet, directory=str(images.root))
        )
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield images, f"http://{cluster.host_address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def make_namespace(kube: Kube, hint: str) -> str:
    name = f"{hint}-{secrets.token_hex(3)}"
    kube.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    sa = ns_path(name, "serviceaccounts", "default")
    wait_until(lambda: kube.get_or_none(sa), f"default service account in {name}", 30)
    return name


@pytest.fixture
def namespace(kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = make_namespace(kube, slug)
    yield name
    kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def scheduled_nodes(kube: Kube, ns: str) -> dict[str, str]:
    """Pod name -> node, from the scheduler's ``Scheduled`` events in ``ns`` (they outlive
    the worker pods the controller deletes when done)."""
    out = {}
    for event in kube.get(ns_path(ns, "events"))["items"]:
        if event.get("reason") != "Scheduled":
            continue
        m = re.search(r" to (\S+)$", event.get("message", ""))
        if m:
            out[event["involvedObject"]["name"]] = m.group(1)
    return out


def importer_of(kube: Kube, ns: str, dv: str) -> dict[str, Any]:
    pods = kube.get(ns_path(ns, "pods"), labelSelector="cdi.kubevirt.io=importer")["items"]
    (pod,) = [p for p in pods if dv in p["metadata"]["name"]]
    return dict(pod)


def test_a_host_assisted_clone_copies_a_volume_of_one_node_to_the_other(
    kube: Kube, product: Product, served: tuple[Images, str], namespace: str
) -> None:
    """The source on the first node, the target on the second: the classes say clone strategy
    ``copy`` (a local volume cannot be cloned by the storage to another node), so the clone
    source pod reads the source on its node and streams to the upload server on the other."""
    images, base = served
    profile = f"{DV_API}/storageprofiles/{CLASS_ON[NODE_2]}"
    wait_until(
        lambda: (
            ((kube.get_or_none(profile) or {}).get("status") or {}).get("cloneStrategy") == "copy"
        ),
        f"StorageProfile {CLASS_ON[NODE_2]} with cloneStrategy copy",
        60,
    )
    src = datavolume("src", {"http": {"url": f"{base}/disk.qcow2"}}, storage_class=CLASS_ON[NODE_1])
    kube.create(dv_path(namespace), src)
    done = wait_phase(kube, namespace, "src", ("Succeeded", "Failed"), timeout=240)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert pv_node(pv_of(kube, namespace, "src")) == NODE_1

    target_ns = make_namespace(kube, f"{namespace[:45]}-to")
    try:
        clone = datavolume(
            "dst", {"pvc": {"namespace": namespace, "name": "src"}},
            storage_class=CLASS_ON[NODE_2],
        )  # fmt: skip
        kube.create(dv_path(target_ns), clone)
        done = wait_phase(kube, target_ns, "dst", ("Succeeded", "Failed"), timeout=240)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert pv_node(pv_of(kube, target_ns, "dst")) == NODE_2
        source_pods = {
            pod: node for pod, node in scheduled_nodes(kube, namespace).items()
            if pod.endswith("-source-pod")
        }  # fmt: skip
        assert list(source_pods.values()) == [NODE_1], scheduled_nodes(kube, namespace)
        upload = {p: n for p, n in scheduled_nodes(kube, target_ns).items() if "upload" in p}
        assert list(upload.values()) == [NODE_2], scheduled_nodes(kube, target_ns)

        copied = volume_dir(kube, target_ns, "dst") / "disk.img"
        same_prefix_then_zeros(copied, images.reference)
        original = volume_dir(kube, namespace, "src") / "disk.img"
        assert _digest(copied) == _digest(original)
    finally:
        kube.delete_ignore_missing(f"/api/v1/namespaces/{target_ns}")


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture
def workload(kube: Kube, product: Product) -> Iterator[Any]:
    """Set the CDI resource's ``workload``; afterwards the resource goes (its uninstall
    unblocked first) and CDIConfig's status loses the workload."""

    def place(spec: dict[str, Any]) -> None:
        body = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
                "metadata": {"name": "cdi"}, "spec": {"workload": spec}}  # fmt: skip
        if kube.get_or_none(CDI) is None:
            kube.create(f"{DV_API}/cdis", body)
        else:
            kube.patch(CDI, {"spec": {"workload": spec}})
        wait_until(
            lambda: ((kube.get(CONFIG).get("status") or {}).get("workload") or {}) == spec,
            "the workload in CDIConfig's status",
            60,
        )

    yield place
    if kube.get_or_none(CDI) is not None:
        kube.patch(CDI, {"spec": {"uninstallStrategy": "RemoveWorkloads"}})
        kube.delete_ignore_missing(CDI)
    wait_until(
        lambda: "workload" not in (kube.get(CONFIG).get("status") or {}),
        "CDIConfig's status without the workload",
        60,
    )


def placed_blank(name: str, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    """A blank DataVolume on the WaitForFirstConsumer class whose importer is its first
    consumer (CDI's immediate-binding request): the volume goes where the importer is
    scheduled."""
    annotations = {RETAIN: "true", IMMEDIATE: "true"}
    if node_selector is not None:
        annotations[NODE_SELECTOR] = json.dumps(node_selector)
    return datavolume(name, {"blank": {}}, "16Mi", WFFC, annotations=annotations)


def test_a_datavolumes_node_selector_puts_its_importer_and_volume_on_that_node(
    kube: Kube, product: Product, namespace: str
) -> None:
    for name, node in (("on-two", NODE_2), ("on-one", NODE_1)):
        kube.create(dv_path(namespace), placed_blank(name, {HOSTNAME: node}))
    for name, node in (("on-two", NODE_2), ("on-one", NODE_1)):
        done = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), timeout=240)
        assert done["status"]["phase"] == "Succeeded", done["status"]
        assert importer_of(kube, namespace, name)["spec"]["nodeName"] == node
        assert pv_node(pv_of(kube, namespace, name)) == node


def test_the_cdi_resources_workload_places_importers_and_an_unsatisfiable_one_waits(
    kube: Kube, product: Product, namespace: str, workload: Any
) -> None:
    """``workload`` on the second node: an import runs there. A DataVolume asking for the
    first node (the tenant narrows the admin's placement, never leaves it) matches no node:
    it waits ``ImportScheduled``, Running False ``Unschedulable``, and does not fail."""
    workload({"nodeSelector": {HOSTNAME: NODE_2}})
    kube.create(dv_path(namespace), placed_blank("admins"))
    kube.create(dv_path(namespace), placed_blank("nowhere", {HOSTNAME: NODE_1}))

    done = wait_phase(kube, namespace, "admins", ("Succeeded", "Failed"), timeout=240)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    pod = importer_of(kube, namespace, "admins")
    assert pod["spec"]["nodeSelector"] == {HOSTNAME: NODE_2}
    assert pod["spec"]["nodeName"] == NODE_2
    assert pv_node(pv_of(kube, namespace, "admins")) == NODE_2

    running = wait_running_reason(kube, namespace, "nowhere", "Unschedulable", 120)
    assert running["status"] == "False"
    assert running["message"].startswith("Importer pod cannot be scheduled")
    time.sleep(5)  # it waits; it does not fail
    dv = kube.get(dv_path(namespace, "nowhere"))
    assert dv["status"]["phase"] == "ImportScheduled", dv["status"]
    assert condition(dv, "Ready")["status"] == "False"
    pod = importer_of(kube, namespace, "nowhere")
    assert pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")
    claim = kube.get(ns_path(namespace, "persistentvolumeclaims", "nowhere"))
    assert claim["status"]["phase"] == "Pending"  # no node chosen: no volume made anywhere


BASE_IMAGE = "quay.io/cdi-py/cdi-base:latest"


def reader_pod(name: str, claim: str, script: str, block: bool = False) -> dict[str, Any]:
    """A pod of the base image that runs ``script`` with the claim at /data (or the block
    device at /dev/xvda) and ends; its log is the result."""
    container: dict[str, Any] = {
        "name": "main",
        "image": BASE_IMAGE,
        "command": ["/opt/cdi/bin/python", "-c", script],
    }
    if block:
        container["volumeDevices"] = [{"name": "v", "devicePath": "/dev/xvda"}]
    else:
        container["volumeMounts"] = [{"name": "v", "mountPath": "/data", "readOnly": True}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [container],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


def digest_script(path: str, size: int) -> str:
    return (
        "import hashlib\n"
        f"f = open({path!r}, 'rb'); h = hashlib.sha256(); left = {size}\n"
        "while left:\n"
        "    b = f.read(min(left, 1 << 20)); h.update(b); left -= len(b)\n"
        "    assert b, 'short read'\n"
        "print('sha256', h.hexdigest())\n"
    )


def pod_result(cluster: Cluster, kube: Kube, ns: str, name: str) -> tuple[str, str]:
    def ended() -> dict[str, Any] | None:
        pod = kube.get(ns_path(ns, "pods", name))
        return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    pod = wait_until(ended, f"pod {ns}/{name} ended", 180)
    log = cluster.container_log(ns, name, "main")
    assert pod["status"]["phase"] == "Succeeded", log[-2000:]
    return str(pod["spec"]["nodeName"]), log


def test_the_csi_classes_work_on_real_nodes_through_the_csi_node_plugin(
    cluster: Cluster,
    kube: Kube,
    product: Product,
    served: tuple[Images, str],
    namespace: str,
) -> None:
    """The provisioner's CSI classes need a CSI node plugin on a real node
    (hack/csinode): an import through the populators into a filesystem and a block volume,
    a CSI clone of the filesystem one (on its source's node), a DataVolume restored from a
    VolumeSnapshot of it, and pods that read each volume through the plugin's publish, all
    with the image's bytes."""
    images, base = served
    size = images.reference.stat().st_size
    want = _digest(images.reference)
    url = f"{base}/disk.qcow2"
    kube.create(dv_path(namespace), datavolume("csi-fs", {"http": {"url": url}}, "64Mi", CSI_FS))
    block = datavolume("csi-block", {"http": {"url": url}}, "64Mi", CSI_BLOCK, mode="Block")
    kube.create(dv_path(namespace), block)
    for name in ("csi-fs", "csi-block"):
        done = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), timeout=240)
        assert done["status"]["phase"] == "Succeeded", done["status"]
    clone = datavolume("csi-clone", {"pvc": {"namespace": namespace, "name": "csi-fs"}},
                       "64Mi", CSI_FS)  # fmt: skip
    kube.create(dv_path(namespace), clone)
    snapshots = f"/apis/snapshot.storage.k8s.io/v1/namespaces/{namespace}/volumesnapshots"
    snapshot = {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": {"name": "snap"},
        "spec": {"source": {"persistentVolumeClaimName": "csi-fs"}},
    }
    kube.create(snapshots, snapshot)
    wait_until(
        lambda: (kube.get(f"{snapshots}/snap").get("status") or {}).get("readyToUse"),
        "VolumeSnapshot snap ready",
        60,
    )
    restored = datavolume("restored", {"snapshot": {"namespace": namespace, "name": "snap"}},
                          "64Mi", CSI_FS)  # fmt: skip
    kube.create(dv_path(namespace), restored)
    for name in ("csi-clone", "restored"):
        done = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), timeout=240)
        assert done["status"]["phase"] == "Succeeded", done["status"]
    assert pv_node(pv_of(kube, namespace, "csi-clone")) == pv_node(pv_of(kube, namespace, "csi-fs"))
    for name in ("csi-fs", "csi-clone", "restored"):
        pv = pv_of(kube, namespace, name)
        assert pv["spec"]["csi"]["driver"] == "loop.testkit.local"
        same_prefix_then_zeros(volume_dir(kube, namespace, name) / "disk.img", images.reference)

    readers = {
        "read-fs": ("csi-fs", "/data/disk.img", False),
        "read-clone": ("csi-clone", "/data/disk.img", False),
        "read-restored": ("restored", "/data/disk.img", False),
        "read-block": ("csi-block", "/dev/xvda", True),
    }
    for pod, (claim, path, is_block) in readers.items():
        kube.create(
            ns_path(namespace, "pods"),
            reader_pod(pod, claim, digest_script(path, size), is_block),
        )
    for pod, (claim, _, _) in readers.items():
        node, log = pod_result(cluster, kube, namespace, pod)
        assert f"sha256 {want}" in log, log[-2000:]
        assert node == pv_node(pv_of(kube, namespace, claim))
