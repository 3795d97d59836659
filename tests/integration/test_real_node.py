"""Real nodes (issue 24): kubelet, kube-proxy, containerd + runc and CNI in the cluster's own
network namespace (two nodes here), pulling the images scripts/images.sh built from the
namespace's loopback registry. Nothing is skipped: a missing part (``hack/kube/build.sh``,
``scripts/setup.sh --test``, ``scripts/images.sh``) makes the cluster fixture error with the
command to run. The node itself is tested here; the product on a real node (``deploy/``,
imports, upload, clones, a controller crash) is the end-to-end tier's, ``tests/e2e``.
"""

from __future__ import annotations

import ipaddress
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit import realnode
from testkit.cluster import Cluster, ClusterConfig
from testkit.kubeclient import Kube
from testkit.waiting import wait_until

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
