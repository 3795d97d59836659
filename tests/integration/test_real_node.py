"""Real nodes (issue 24): kubelet, kube-proxy, containerd + runc and CNI in the cluster's own
network namespace (two nodes here), pulling the images scripts/images.sh built from the
namespace's loopback registry. Nothing is skipped: a missing part (``hack/kube/build.sh``,
``scripts/setup.sh --test``, ``scripts/images.sh``) makes the cluster fixture error with the
command to run.
"""

from __future__ import annotations

import http.server
import ipaddress
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from testkit import realnode
from testkit.cluster import REPO_ROOT as REPO
from testkit.cluster import Cluster, ClusterConfig
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    build_images,
    datavolume,
    dv_path,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)

pytestmark = pytest.mark.integration
BASE_IMAGE = f"{realnode.PRODUCT_REPOSITORY}/cdi-base:latest"


@pytest.fixture(scope="module")
def real_cluster() -> Iterator[Cluster]:
    state = Path(tempfile.mkdtemp(prefix="testkit-"))
    c = Cluster(ClusterConfig(state_dir=state, node="real", nodes=2, start_timeout=120))
    c.start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def real_kube(real_cluster: Cluster) -> Kube:
    return real_cluster.kube()


def _pod(
    name: str, command: list[str], node: str | None = None, labels: dict[str, str] | None = None
) -> dict:
    """A one-container pod of the base image that runs ``command`` once."""
    spec: dict = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": BASE_IMAGE, "command": command}],
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def _wait_pod_phase(kube: Kube, ns: str, name: str, phase: str, timeout: float) -> dict:
    def done() -> dict | None:
        pod = kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        got = pod.get("status", {}).get("phase")
        assert got != "Failed" or phase == "Failed", f"pod {name} failed: {pod['status']}"
        return pod if got == phase else None

    return wait_until(done, f"pod {ns}/{name} {phase}", timeout, interval=0.2)


def test_components_run_in_their_own_network_namespace(real_cluster: Cluster) -> None:
    own = os.readlink("/proc/self/ns/net")
    names = {"kubelet", "containerd", "kube-proxy", "kube-apiserver", "registry"}
    procs = [p for p in real_cluster.processes if p.name in names]
    assert {p.name for p in procs} == names
    for p in procs:
        assert os.readlink(f"/proc/{p.pid}/ns/net") != own, f"{p.name} on the host network"
    node = real_cluster.kube().get("/api/v1/nodes/testkit-node")
    info = node["status"]["nodeInfo"]
    assert info["containerRuntimeVersion"].startswith("containerd://")
    assert info["kubeletVersion"].startswith("v1.")
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == realnode.NODE_IP


def test_a_plain_pod_runs_to_completion_in_a_container(
    real_cluster: Cluster, real_kube: Kube
) -> None:
    ns = "default"
    name = "real-node-hello"
    script = (
        "echo real-node uid=$(id -u); grep pids /proc/self/cgroup; "
        "test ! -e /etc/kubernetes && test -x /opt/cdi/bin/python"
    )
    real_kube.create(f"/api/v1/namespaces/{ns}/pods", _pod(name, ["/bin/sh", "-c", script]))
    pod = _wait_pod_phase(real_kube, ns, name, "Succeeded", 180)
    state = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 0
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(realnode.POD_CIDR)
    log = real_cluster.container_log(ns, name, "main")
    assert "real-node uid=0" in log
    # Under the cgroup root of one of this cluster's kubelets, in a container of its own.
    assert re.search(rf"/testkit-rn-{real_cluster.net.n}(-2)?/kubepods/", log)  # type: ignore[union-attr]
    real_kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}/pods/{name}")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture(scope="module")
def real_product(real_cluster: Cluster, real_kube: Kube) -> Product:
    """``deploy/`` applied unchanged, every Deployment Available, and a CDIConfig that lets
    imports reach the node's address (where the image server listens)."""
    product = Product.on(real_cluster).install(timeout=240)
    config = {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "CDIConfig",
        "metadata": {"name": "config"},
        "spec": {
            "importPolicy": {
                "allowedSourceCIDRs": [f"{real_cluster.host_address}/32"],
                "clusterCIDRs": [real_cluster.pod_cidr, real_cluster.service_cidr],
            }
        },
    }
    try:
        real_kube.create(f"{DV_API}/cdiconfigs", config)
    except ApiError as e:
        if not e.conflict:
            raise
        real_kube.patch(f"{DV_API}/cdiconfigs/config", {"spec": config["spec"]})
    return product


@pytest.fixture(scope="module")
def served(
    real_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Images, str]]:
    """The test images and the base URL of a server inside the namespace, on the node's
    address: where pods reach."""
    images = build_images(tmp_path_factory.mktemp("images"))
    server = real_cluster.network_call(
        lambda: http.server.ThreadingHTTPServer(
            (real_cluster.host_address, 0), partial(_Quiet, directory=str(images.root))
        )
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield images, f"http://{real_cluster.host_address}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def real_namespace(real_kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{slug}-{secrets.token_hex(3)}"
    real_kube.create(
        "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    sa = f"/api/v1/namespaces/{name}/serviceaccounts/default"
    wait_until(lambda: real_kube.get_or_none(sa), f"default service account in {name}", 30)
    yield name
    real_kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def test_deploy_runs_as_containers_and_no_replica_restarts(real_product: Product) -> None:
    pods = [p for app in ("cdi-controller", "cdi-webhook") for p in real_product.pods(app)]
    assert len(pods) == 4  # two replicas each, started together
    for pod in pods:
        (status,) = pod["status"]["containerStatuses"]
        assert status["containerID"].startswith("containerd://")
        # Two webhook replicas publishing their CA bundle at once must not crash one of them.
        assert status["restartCount"] == 0, f"{pod['metadata']['name']} restarted: {status}"


@pytest.mark.parametrize(
    ("storage_class", "mode"), [("testkit-fs", "Filesystem"), ("testkit-block", "Block")]
)
def test_http_qcow2_import_gives_identical_bytes(
    real_kube: Kube,
    real_product: Product,
    served: tuple[Images, str],
    real_namespace: str,
    storage_class: str,
    mode: str,
) -> None:
    images, base = served
    dv = datavolume(
        "http-dv", {"http": {"url": f"{base}/disk.qcow2"}}, storage_class=storage_class, mode=mode
    )
    real_kube.create(dv_path(real_namespace), dv)
    wait_phase(real_kube, real_namespace, "http-dv", ("Succeeded",), timeout=240)
    target = volume_dir(real_kube, real_namespace, "http-dv")
    same_prefix_then_zeros(
        target / "disk.img" if mode == "Filesystem" else target, images.reference
    )


def test_upload_through_the_deployed_proxy_then_a_host_assisted_clone_to_block(
    real_cluster: Cluster,
    real_kube: Kube,
    real_product: Product,
    served: tuple[Images, str],
    real_namespace: str,
) -> None:
    """``cdi upload`` (token API, upload proxy, upload server pod: all containers), then a
    clone of the uploaded filesystem volume into a block volume of another namespace (cloner
    source pod + upload server), each with identical bytes."""
    images, _ = served
    svc = real_kube.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable,
        "-m",
        "cdi",
        "upload",
        "dv",
        "up-dv",
        f"--image-path={images.path('disk.qcow2')}",
        "--size=64Mi",
        "--storage-class=testkit-fs",
        "--insecure",
        f"--uploadproxy-url={svc['spec']['clusterIP']}:443",
        f"--kubeconfig={real_cluster.kubeconfig}",
        f"--namespace={real_namespace}",
    ]
    # The ClusterIP is reached where kube-proxy's rules are: inside the namespace.
    proc = subprocess.run(
        real_cluster.in_network(argv), env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    wait_phase(real_kube, real_namespace, "up-dv", ("Succeeded",), timeout=120)
    same_prefix_then_zeros(
        volume_dir(real_kube, real_namespace, "up-dv") / "disk.img", images.reference
    )

    target_ns = f"{real_namespace[:50]}-clone"
    real_kube.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": target_ns}},
    )
    try:
        source = {"pvc": {"namespace": real_namespace, "name": "up-dv"}}
        clone = datavolume("clone-dv", source, storage_class="testkit-block", mode="Block")
        real_kube.create(dv_path(target_ns), clone)
        wait_phase(real_kube, target_ns, "clone-dv", ("Succeeded",), timeout=240)
        same_prefix_then_zeros(volume_dir(real_kube, target_ns, "clone-dv"), images.reference)
    finally:
        real_kube.delete_ignore_missing(f"/api/v1/namespaces/{target_ns}")


def test_two_real_nodes_reach_each_others_pods_and_services(
    real_cluster: Cluster, real_kube: Kube
) -> None:
    """The module's cluster has two nodes: both Ready with their own addresses, and a pod on
    the first reaches a pod on the second by pod IP and through its Service."""
    two, kube = real_cluster, real_kube
    nodes = {n["metadata"]["name"]: n for n in kube.get("/api/v1/nodes")["items"]}
    assert sorted(nodes) == ["testkit-node", "testkit-node-2"]
    ips = {
        name: next(a["address"] for a in n["status"]["addresses"] if a["type"] == "InternalIP")
        for name, n in nodes.items()
    }
    assert ips == {"testkit-node": realnode.node_ip(0), "testkit-node-2": realnode.node_ip(1)}

    server = ["/opt/cdi/bin/python", "-m", "http.server", "8080", "-d", "/etc"]
    kube.create(
        "/api/v1/namespaces/default/pods",
        _pod("srv", server, node="testkit-node-2", labels={"app": "srv"}),
    )
    svc = kube.create(
        "/api/v1/namespaces/default/services",
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "srv"},
            "spec": {"selector": {"app": "srv"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    srv = _wait_pod_phase(kube, "default", "srv", "Running", 180)
    pod_ip = srv["status"]["podIP"]
    assert ipaddress.ip_address(pod_ip) in ipaddress.ip_network(realnode.node_pod_cidr(1))
    fetch = (
        "import time, urllib.request as u\n"
        "for url in ('http://{}:8080/hostname', 'http://{}/hostname'):\n"
        "    for _ in range(50):\n"
        "        try:\n"
        "            print(url, u.urlopen(url, timeout=3).status); break\n"
        "        except OSError:\n"
        "            time.sleep(0.2)\n"
    ).format(pod_ip, svc["spec"]["clusterIP"])
    kube.create(
        "/api/v1/namespaces/default/pods",
        _pod("cli", ["/opt/cdi/bin/python", "-c", fetch], node="testkit-node"),
    )
    cli = _wait_pod_phase(kube, "default", "cli", "Succeeded", 180)
    assert ipaddress.ip_address(cli["status"]["podIP"]) in ipaddress.ip_network(
        realnode.node_pod_cidr(0)
    )
    log = two.container_log("default", "cli", "main")
    assert f"http://{pod_ip}:8080/hostname 200" in log, log
    assert f"http://{svc['spec']['clusterIP']}/hostname 200" in log, log
