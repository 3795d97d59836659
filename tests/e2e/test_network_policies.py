"""The shipped NetworkPolicies enforced for real (issue 26): ``deploy/optional/
networkpolicies.yaml`` and ``webhook-networkpolicy.yaml`` in ``cdi`` (their placeholder API
server range replaced by the address ``kubectl get endpoints kubernetes`` gives, as their
header tells an installer) and ``deploy/examples/tenant-networkpolicies.yaml`` in a tenant
namespace, enforced on the real node by kube-network-policies (:mod:`testkit.netpolenforcer`).

A tenant's pod (no CDI label, the product's base image, ``python`` socket connects every few
hundred ms, one JSON line a round) dials the controller's metrics Service, the webhook's
Service, an upload server pod's own address and the upload proxy's Service:

- before the policies, every connection is accepted (so the refusals below are the policies');
- with them, the first three are refused and the upload proxy (which faces users) still is
  not; the upload goes through the proxy to that upload server pod (both ends' policies judge
  the proxy's connection) and the DataVolume reconciles to Succeeded with the image's bytes;
- once they are deleted, the control plane's ports answer the tenant again.

On this harness the node's own connections are not judged (the API server calling the webhook,
the kubelet's probes, the controller's connections to the API server's local address): see
:mod:`testkit.netpolenforcer`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import REPO_ROOT, Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.netpolenforcer import Enforcer
from testkit.product import Product
from testkit.realnode import PRODUCT_REPOSITORY
from testkit.waiting import wait_until
from tests.e2e.conftest import Served
from tests.integration.datavolumes.cdi_env import (
    datavolume,
    dv_path,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)
from tests.integration.helpers import pod_manifest

pytestmark = pytest.mark.e2e

CDI_POLICIES = [
    REPO_ROOT / "deploy" / "optional" / "networkpolicies.yaml",
    REPO_ROOT / "deploy" / "optional" / "webhook-networkpolicy.yaml",
]
TENANT_POLICIES = REPO_ROOT / "deploy" / "examples" / "tenant-networkpolicies.yaml"
APISERVER_PLACEHOLDER = "192.0.2.0/24"
BASE_IMAGE = f"{PRODUCT_REPOSITORY}/cdi-base:latest"
FORBIDDEN = ("controller-metrics", "webhook", "upload-server")
ADMITTED = ("uploadproxy",)
# One round: every target dialled at once, 1 s to connect; prints {"t": start, "ok": {...}}.
PROBE = """
import json, socket, sys, threading, time
targets = json.loads(sys.argv[1])
def dial(name, host, port, out):
    try:
        socket.create_connection((host, port), timeout=1).close()
        out[name] = True
    except OSError:
        out[name] = False
while True:
    t, out = time.time(), {}
    threads = [threading.Thread(target=dial, args=(n, h, p, out)) for n, (h, p) in targets.items()]
    for th in threads: th.start()
    for th in threads: th.join()
    print(json.dumps({"t": t, "ok": out}), flush=True)
    time.sleep(0.2)
"""


@pytest.fixture
def enforcer(cluster: Cluster, product: Product) -> Iterator[Enforcer]:
    with Enforcer(cluster) as e:
        yield e


def _apiserver_cidr(kube: Kube) -> str:
    """What an installer reads from ``kubectl get endpoints kubernetes``."""
    ep = kube.get("/api/v1/namespaces/default/endpoints/kubernetes")
    return f"{ep['subsets'][0]['addresses'][0]['ip']}/32"


def _policies(kube: Kube, tenant: str) -> str:
    cidr = _apiserver_cidr(kube)
    texts = [p.read_text().replace(APISERVER_PLACEHOLDER, cidr) for p in CDI_POLICIES]
    texts.append(TENANT_POLICIES.read_text().replace("namespace: TENANT", f"namespace: {tenant}"))
    return "\n---\n".join(texts)


def _rounds(cluster: Cluster, ns: str, pod: str) -> list[dict[str, Any]]:
    try:
        text = cluster.container_log(ns, pod, "main")
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def _wait_round(
    enforcer: Enforcer, ns: str, pod: str, after: float, want: dict[str, bool], what: str
) -> dict[str, Any]:
    """The first probe round started after ``after`` whose results include ``want``."""

    cluster = enforcer.cluster

    def found() -> dict[str, Any] | None:
        for r in _rounds(cluster, ns, pod):
            if r["t"] > after and all(r["ok"].get(k) == v for k, v in want.items()):
                return r
        return None

    try:
        return wait_until(found, what, timeout=60)
    except TimeoutError:
        tail = _rounds(cluster, ns, pod)[-3:]
        raise AssertionError(
            f"{what}: the last probe rounds were {tail}\n{enforcer.describe()}"
        ) from None


def _service(kube: Kube, name: str, port: int) -> tuple[str, int]:
    return (kube.get(ns_path("cdi", "services", name))["spec"]["clusterIP"], port)


def _upload(
    cluster: Cluster, served: Served, ns: str, name: str
) -> subprocess.CompletedProcess[str]:
    kube = cluster.kube()
    host, port = _service(kube, "cdi-uploadproxy", 443)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable, "-m", "cdi", "upload", "dv", name, "--no-create", "--insecure",
        f"--image-path={served.images.path('disk.qcow2')}", f"--uploadproxy-url={host}:{port}",
        f"--kubeconfig={cluster.kubeconfig}", f"--namespace={ns}",
    ]  # fmt: skip
    return subprocess.run(
        cluster.in_network(argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=180,
        check=False,
    )


def test_shipped_policies_refuse_tenants_and_admit_the_upload_path(
    cluster: Cluster,
    kube: Kube,
    product: Product,
    served: Served,
    namespace: str,
    enforcer: Enforcer,
) -> None:
    t0 = time.monotonic()
    # An upload DataVolume: its upload server pod waits for the bytes.
    kube.create(dv_path(namespace), datavolume("np-up", {"upload": {}}))

    def upload_pod_ip() -> str | None:
        pods = kube.get(
            ns_path(namespace, "pods"), labelSelector="cdi.kubevirt.io=cdi-upload-server"
        )["items"]
        ready = [
            p
            for p in pods
            if any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in p["status"].get("conditions") or []
            )
        ]
        return ready[0]["status"].get("podIP") if ready else None

    server_ip = wait_until(upload_pod_ip, "the upload server pod ready", 120)
    targets = {
        "controller-metrics": _service(kube, "cdi-controller-metrics", 8080),
        "webhook": _service(kube, "cdi-webhook", 443),
        "upload-server": (server_ip, 8443),
        "uploadproxy": _service(kube, "cdi-uploadproxy", 443),
    }
    probe = pod_manifest(
        "np-probe",
        "",
        image=BASE_IMAGE,
        command=["/opt/cdi/bin/python", "-c", PROBE, json.dumps(targets)],
    )
    kube.create(ns_path(namespace, "pods"), probe)
    every = dict.fromkeys((*FORBIDDEN, *ADMITTED), True)
    _wait_round(enforcer, namespace, "np-probe", 0, every, "every target reachable before")

    policies = _policies(kube, namespace)
    applied = time.time()
    product.kubectl("apply", "-f", "-", stdin=policies)
    try:
        enforced = {**dict.fromkeys(FORBIDDEN, False), **dict.fromkeys(ADMITTED, True)}
        _wait_round(enforcer, namespace, "np-probe", applied, enforced, "the policies enforced")
        t_enforced = time.monotonic()

        # What they admit: the upload through the proxy to that upload server pod (egress
        # of cdi-uploadproxy, ingress of the tenant's cdi-upload-server), and the controller
        # reconciling the DataVolume (it created the pod; it sees the upload done).
        done = _upload(cluster, served, namespace, "np-up")
        assert done.returncode == 0, f"cdi upload through the proxy: {done.stdout[-3000:]}"
        dv = wait_phase(kube, namespace, "np-up", ("Succeeded", "Failed"), timeout=120)
        assert dv["status"]["phase"] == "Succeeded", dv["status"]
        same_prefix_then_zeros(
            volume_dir(kube, namespace, "np-up") / "disk.img", served.images.reference
        )
        # Still refused once the upload is over (no rule was loosened by the traffic).
        last = _rounds(cluster, namespace, "np-probe")[-1]
        assert all(last["ok"][k] is False for k in ("controller-metrics", "webhook")), last
        enforcer.alive()
    finally:
        deleted = time.time()
        product.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=policies)
    lifted = {"controller-metrics": True, "webhook": True, "uploadproxy": True}
    _wait_round(
        enforcer, namespace, "np-probe", deleted, lifted, "the control plane reachable after"
    )
    print(
        f"\nnetwork policies: enforced {t_enforced - t0:.1f} s after the start, "
        f"test body {time.monotonic() - t0:.1f} s"
    )
