"""The controller's ``/metrics`` answers only a bearer token the real API server accepts
(TokenReview) and allows ``get /metrics`` (SubjectAccessReview), as CDI's #4121; tokens are real
ServiceAccount tokens (TokenRequest, and the ``cdi-metrics-reader-token`` Secret the token
controller fills, which the ServiceMonitor sends).

- the guard itself (``cdi.controller.metrics_auth.MetricsGuard``) against the API server: 401
  without or with a bad token, 403 for a ServiceAccount without the right, 200 once bound to
  ``cdi-metrics-reader``; answers remembered (one TokenReview for many checks) until their
  time is up on the guard's clock, so a revoked binding is seen after ``allow_ttl``;
- the installed product: both replicas (the standby too) serve HTTPS only, verified with the
  CA in ConfigMap ``cdi-controller-metrics-signer-bundle`` for the Service's name as the
  ServiceMonitor
  does, and answer 401/401/403/200 the same way; ten scrapes with one token cost the API
  server at most one TokenReview per replica (its own ``apiserver_request_total``);
- the metrics server follows CDIConfig's ``tlsSecurityProfile`` without a restart: under
  Modern a TLS 1.2 client is refused and TLS 1.3 served, back to the default TLS 1.2 again.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdi.controller.metrics_auth import MetricsGuard
from cdi.kube.client import AsyncKube
from cdi.kube.client import Kube as ProductKube
from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.kubeconfig import ADMIN
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.metrics_env import (
    get,
    metrics_ca,
    metrics_url,
    reader_token,
    service_account_token,
)
from tests.integration.datavolumes.test_alerts import controller_pods
from tests.integration.datavolumes.test_tls_profile import (
    TLS12,
    TLS13,
    every_time,
    set_profile,
    version_refused,
)

pytestmark = pytest.mark.integration

RBAC = "/apis/rbac.authorization.k8s.io/v1"


def service_account(kube: Kube, namespace: str, name: str) -> None:
    kube.create(f"/api/v1/namespaces/{namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount",
                 "metadata": {"name": name}})  # fmt: skip


@pytest.fixture
def reader_binding(kube: Kube, namespace: str) -> Iterator[tuple[str, str]]:
    """(ServiceAccount, ClusterRoleBinding name): a ServiceAccount bound to cdi-metrics-reader;
    the binding is removed at the end (the test may remove it first)."""
    name = f"metrics-reader-test-{secrets.token_hex(3)}"
    service_account(kube, namespace, "scraper")
    kube.create(f"{RBAC}/clusterrolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cdi-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "scraper", "namespace": namespace}],
    })  # fmt: skip
    yield "scraper", name
    kube.delete_ignore_missing(f"{RBAC}/clusterrolebindings/{name}")


def may_get_metrics(kube: Kube, user: str) -> bool:
    review = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                 "nonResourceAttributes": {"path": "/metrics", "verb": "get"}},
    })  # fmt: skip
    return bool(review["status"].get("allowed"))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_guard_asks_the_api_server_and_remembers_its_answers_briefly(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    product: Product,  # the ClusterRole cdi-metrics-reader is installed
    reader_binding: tuple[str, str],
) -> None:
    sa, binding = reader_binding
    service_account(kube, namespace, "nobody")
    user = f"system:serviceaccount:{namespace}:{sa}"
    wait_until(lambda: may_get_metrics(kube, user), "the binding seen by the authorizer", 30, 0.5)
    allowed = service_account_token(kube, namespace, sa)
    refused = service_account_token(kube, namespace, "nobody")
    clock = Clock()
    api = AsyncKube(ProductKube(cluster.api_client(ADMIN)), max_threads=2)
    guard = MetricsGuard(api, allow_ttl=60, deny_ttl=10, clock=clock)

    async def statuses(*headers: str | None) -> list[int]:
        return [(await guard.check(h)).status for h in headers]

    try:
        first = asyncio.run(
            statuses(
                None,
                "Basic dXNlcjpwYXNz",
                "Bearer not-a-token",
                f"Bearer {refused}",
                f"Bearer {allowed}",
            )
        )
        assert first == [401, 401, 401, 403, 200]
        sent = guard.reviews_sent
        assert sent == 3  # no header and Basic never reach the API server

        # remembered: many checks, no new review, even after the binding is gone
        kube.delete(f"{RBAC}/clusterrolebindings/{binding}")
        assert asyncio.run(statuses(*[f"Bearer {allowed}"] * 10)) == [200] * 10
        assert asyncio.run(statuses(f"Bearer {refused}")) == [403]
        assert guard.reviews_sent == sent

        # a refusal is forgotten after deny_ttl, an allowance after allow_ttl
        clock.now += 11
        assert asyncio.run(statuses(f"Bearer {refused}", f"Bearer {allowed}")) == [403, 200]
        assert guard.reviews_sent == sent + 1
        clock.now += 50

        def revoked() -> bool:  # the authorizer's cache of the deleted binding may lag
            clock.now += 61
            return asyncio.run(statuses(f"Bearer {allowed}")) == [403]

        wait_until(revoked, "the revoked binding seen after allow_ttl", 30, interval=0.5)
    finally:
        api.close()


def apiserver_token_reviews(cluster: Cluster) -> float:
    """POSTs of tokenreviews the API server has served (its own /metrics)."""
    ctx = ssl.create_default_context(cafile=str(cluster.ca_path))
    request = urllib.request.Request(
        f"{cluster.server}/metrics", headers={"Authorization": f"Bearer {cluster.token(ADMIN)}"}
    )
    with urllib.request.urlopen(request, context=ctx, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "apiserver_request_total"
        and s.labels.get("resource") == "tokenreviews"
        and s.labels.get("verb") == "POST"
    )


def test_the_installed_controller_answers_only_a_metrics_reader_over_tls(
    cluster: Cluster, kube: Kube, product: Product, namespace: str
) -> None:
    service_account(kube, namespace, "nobody")
    refused = service_account_token(kube, namespace, "nobody")
    token, ca = reader_token(kube), metrics_ca(kube)  # what the ServiceMonitor uses
    ips = wait_until(
        lambda: (lambda p: p if len(p) == 2 else None)(controller_pods(kube)),
        "two controller pods with addresses",
        60,
    )
    for ip in ips:  # the leader and the standby alike
        url = metrics_url(ip)
        assert get(url, None, ca)[0] == 401, ip
        assert get(url, "not-a-token", ca)[0] == 401, ip
        status, body = get(url, refused, ca)
        assert status == 403, (ip, body)
        assert "may not get" in body
        status, body = wait_until(lambda url=url: (lambda r: r if r[0] == 200 else None)(
            get(url, token, ca)), f"{ip} answers the reader", 30, interval=0.5)  # fmt: skip
        assert "kubevirt_cdi_cr_ready" in body
        assert get(url.replace("https://", "http://"), token)[0] == 0  # no plain HTTP there
        assert get(url, token, b"")[0] == 0  # a client that does not trust the CA stops

    before = apiserver_token_reviews(cluster)
    for _ in range(10):
        for ip in ips:
            assert get(metrics_url(ip), token, ca)[0] == 200
    # answers remembered 60 s: at most one more review per replica (one may have expired),
    # where 20 uncached scrapes would have cost 20 (room left for other components' reviews)
    assert apiserver_token_reviews(cluster) - before < 10


def test_the_metrics_server_follows_cdiconfigs_tls_profile(kube: Kube, product: Product) -> None:
    ips = controller_pods(kube)
    assert ips
    set_profile(kube, {"type": "Modern", "modern": {}})
    try:
        for ip in ips:
            wait_until(
                lambda ip=ip: every_time(lambda: version_refused(ip, TLS12, 8080)),
                f"the metrics server on {ip} refuses a TLS 1.2 client under Modern",
                60,
            )
            assert not version_refused(ip, TLS13, 8080)
    finally:
        set_profile(kube, None)
    for ip in ips:
        wait_until(
            lambda ip=ip: every_time(lambda: not version_refused(ip, TLS12, 8080)),
            f"the metrics server on {ip} serves TLS 1.2 again",
            60,
        )
