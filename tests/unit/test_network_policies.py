"""The NetworkPolicies the product ships (``deploy/optional/networkpolicies.yaml`` for namespace
``cdi``, ``deploy/examples/tenant-networkpolicies.yaml`` for the tenants' namespaces) evaluated
against the product's own pods: the control plane's from ``deploy/*.yaml`` (labels and ports
as deployed) and every worker pod as the controller's renderers make it (``tests/worker_pods``),
with NetworkPolicy's semantics (``testkit.netpolicy``). Enforced for real, with connections, on
the real node by ``tests/e2e/test_network_policies.py`` (pod-to-pod paths only: the node's own
connections are not judged there; ``docs/security.md``, "NetworkPolicies"); their acceptance by
the real API server is ``tests/integration/datavolumes/test_deploy.py``.

The cluster modelled is the strictest one the policies must work in: tenant namespaces deny
everything by default, an attacker's namespace and Prometheus' have no policies at all, and the
kube-apiserver, a web server holding images and the importProxy sit outside the pod network at
the addresses the files' placeholders name. Every connection that touches a product pod, on
every port that matters, is compared with what the product needs, written down independently
of the policies below: exactly those are let through, nothing else.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import yaml

from testkit.netpolicy import Endpoint, Network, matches
from tests.worker_pods import worker_pods

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
OPTIONAL = DEPLOY / "optional" / "networkpolicies.yaml"
TENANT = DEPLOY / "examples" / "tenant-networkpolicies.yaml"
TENANTS = ("vms", "other")
NAMESPACES = ("cdi", *TENANTS, "attacker", "monitoring", "kube-system")
PROBES = [(p, "TCP") for p in (22, 53, 80, 443, 3128, 6443, 8080, 8081, 8443, 9000)] + [(53, "UDP")]
CONTROL_PLANE = ("cdi-controller", "cdi-webhook", "cdi-apiserver", "cdi-uploadproxy",
                 "cdi-import-proxy")  # fmt: skip
WORKERS = {"importer": "importer", "poller": "poller", "upload": "upload-server",
           "clone-source": "clone-source"}  # fmt: skip


def docs(path: Path, **replace: str) -> list[dict[str, Any]]:
    text = path.read_text()
    for old, new in replace.items():
        text = text.replace(old, new)
    return [d for d in yaml.safe_load_all(text) if d]


def pod_endpoint(name: str, pod: dict[str, Any], ip: str) -> Endpoint:
    ports = {
        p["name"]: p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports") or []
        if p.get("name")
    }
    ns = pod["metadata"]["namespace"]
    return Endpoint(f"{ns}/{name}", ip, ns, dict(pod["metadata"].get("labels") or {}), ports)


def product_pods() -> list[Endpoint]:
    """The control plane as deploy/ runs it, and the workers in each tenant namespace."""
    pods: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        for d in docs(path):
            if d["kind"] == "Deployment":
                template = d["spec"]["template"]
                template["metadata"]["namespace"] = d["metadata"]["namespace"]
                pods.append((d["metadata"]["name"], template))
    for ns in TENANTS:
        rendered = worker_pods(ns)
        pods += [(name, rendered[kind]) for kind, name in WORKERS.items()]
    return [pod_endpoint(n, p, f"10.244.0.{i + 10}") for i, (n, p) in enumerate(pods)]


def others() -> list[Endpoint]:
    return [
        Endpoint("attacker/curl", "10.244.1.10", "attacker", {"app": "curl"}),
        Endpoint("vms/vm", "10.244.1.11", "vms", {"kubevirt.io": "virt-launcher"}),
        Endpoint(
            "monitoring/prometheus",
            "10.244.1.12",
            "monitoring",
            {"app.kubernetes.io/name": "prometheus"},
        ),
        Endpoint(
            "kube-system/dns", "10.244.1.13", "kube-system", {"k8s-app": "kube-dns"}, {"dns": 53}
        ),
        Endpoint("apiserver", "192.0.2.1"),  # the files' placeholder range
        Endpoint("image-server", "203.0.113.5"),  # a source on the internet
        Endpoint("import-proxy-upstream", "198.51.100.7"),  # CDIConfig importProxy
        Endpoint("user", "203.0.113.9"),  # runs `cdi upload`
    ]


def tenant_default_deny(ns: str) -> dict[str, Any]:
    return {"metadata": {"name": "default-deny", "namespace": ns},
            "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}  # fmt: skip


def shipped_policies() -> list[dict[str, Any]]:
    policies = docs(OPTIONAL)
    for ns in TENANTS:
        policies += [*docs(TENANT, TENANT=ns), tenant_default_deny(ns)]
    return policies


def network(policies: list[dict[str, Any]]) -> Network:
    labels = {ns: {"kubernetes.io/metadata.name": ns} for ns in NAMESPACES}
    return Network(labels, policies)


def expected(src: str, dst: str, port: int, protocol: str) -> bool:
    """What the product needs (docs/security.md, "NetworkPolicies"), by endpoint name."""
    tcp = protocol == "TCP"
    api_ports = tcp and port in (443, 6443)
    # sources nothing restricts: outside the pod network, unpoliced namespaces, importers
    open_egress = {"apiserver", "image-server", "import-proxy-upstream", "user", "attacker/curl",
                   "monitoring/prometheus", "kube-system/dns"} | {
        f"{ns}/{w}" for ns in TENANTS for w in ("importer", "poller")}  # fmt: skip
    importers = {f"{ns}/{w}" for ns in TENANTS for w in ("importer", "poller")}
    unpoliced = {"apiserver", "image-server", "import-proxy-upstream", "user", "attacker/curl",
                 "monitoring/prometheus", "kube-system/dns"}  # fmt: skip
    scraped = {f"{ns}/{w}" for ns in TENANTS for w in ("importer", "poller", "clone-source")}
    upload_servers = {f"{ns}/upload-server" for ns in TENANTS}
    clone_sources = {f"{ns}/clone-source" for ns in TENANTS}
    rules = [
        # users (and anything free to connect) reach the upload proxy
        dst == "cdi/cdi-uploadproxy" and tcp and port == 8443 and src in open_egress,
        # the control plane reaches the API server, which calls the webhook and the token API
        src in {f"cdi/{c}" for c in CONTROL_PLANE} and dst == "apiserver" and api_ports,
        src == "apiserver"
        and dst in ("cdi/cdi-webhook", "cdi/cdi-apiserver")
        and port == 8443
        and tcp,
        # the controller scrapes workers' progress; Prometheus scrapes the controller
        src == "cdi/cdi-controller" and dst in scraped and tcp and port == 8443,
        src == "monitoring/prometheus" and dst == "cdi/cdi-controller" and tcp and port == 8080,
        # uploads: proxy and clone sources (any namespace) to upload servers
        src in {"cdi/cdi-uploadproxy", *clone_sources}
        and dst in upload_servers
        and tcp
        and port == 8443,
        # the import proxy relay: importers in, DNS and the importProxy out
        src in importers and dst == "cdi/cdi-import-proxy" and tcp and port == 3128,
        src == "cdi/cdi-import-proxy" and dst == "kube-system/dns" and port == 53,
        src == "cdi/cdi-import-proxy" and dst == "import-proxy-upstream" and tcp and port == 3128,
        # importers reach their sources wherever they are (and whatever admits them)
        src in importers and dst in unpoliced,
    ]
    return any(rules)


def test_the_shipped_policies_let_through_exactly_what_the_product_needs() -> None:
    net = network(shipped_policies())
    product = product_pods()
    names = {p.name for p in product}
    endpoints = product + others()
    assert {f"{ns}/{w}" for ns in TENANTS for w in WORKERS.values()} <= names
    wrong = []
    for src, dst in itertools.permutations(endpoints, 2):
        if src.name not in names and dst.name not in names:
            continue
        for port, protocol in PROBES:
            got = net.allowed(src, dst, port, protocol)
            if got != expected(src.name, dst.name, port, protocol):
                wrong.append(
                    f"{src.name} -> {dst.name}:{port}/{protocol} {'open' if got else 'shut'}"
                )
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(
    ("src", "dst", "port"),
    [
        ("cdi/cdi-controller", "vms/importer", 8443),
        ("cdi/cdi-uploadproxy", "vms/upload-server", 8443),
        ("other/clone-source", "vms/upload-server", 8443),
        ("monitoring/prometheus", "cdi/cdi-controller", 8080),
        ("cdi/cdi-controller", "apiserver", 6443),
    ],
)
def test_without_the_allow_policies_the_default_deny_cuts_each_needed_path(
    src: str, dst: str, port: int
) -> None:
    """The evaluator can say no: the same cluster with only the default denies."""
    endpoints = {e.name: e for e in product_pods() + others()}
    deny_only = [tenant_default_deny(ns) for ns in ("cdi", *TENANTS)]
    assert network(shipped_policies()).allowed(endpoints[src], endpoints[dst], port)
    assert not network(deny_only).allowed(endpoints[src], endpoints[dst], port)


def test_every_shipped_policy_selects_a_pod_the_product_runs() -> None:
    """No selector names a label the product's pods do not carry (a typo opens nothing and
    shuts nothing, silently)."""
    pods = product_pods()
    everyone = pods + others()  # peers: the cluster DNS too
    for policy in shipped_policies():
        if policy["metadata"]["name"] == "default-deny":
            continue
        selector = policy["spec"]["podSelector"]
        selected = [
            p for p in pods
            if p.namespace == policy["metadata"]["namespace"] and matches(selector, p.labels)
        ]  # fmt: skip
        assert selected, policy["metadata"]["name"]
        for rule in policy["spec"].get("ingress", []) + policy["spec"].get("egress", []):
            for peer in rule.get("from", []) + rule.get("to", []):
                if peer.get("podSelector"):
                    assert any(matches(peer["podSelector"], p.labels) for p in everyone), peer


def test_the_webhook_fence_is_contained_in_the_full_set() -> None:
    """deploy/optional/webhook-networkpolicy.yaml admits the API server's range to the review
    port; the full set does too (and leaves the health port to the node, as probes come from
    there)."""
    endpoints = {e.name: e for e in product_pods() + others()}
    net = network(shipped_policies())
    assert net.allowed(endpoints["apiserver"], endpoints["cdi/cdi-webhook"], 8443)
    assert not net.allowed(endpoints["attacker/curl"], endpoints["cdi/cdi-webhook"], 8443)
    assert not net.allowed(endpoints["attacker/curl"], endpoints["cdi/cdi-webhook"], 8081)
