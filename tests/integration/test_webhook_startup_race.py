"""Webhook (and upload API server) replicas starting together converge on one CA, on the real
API server.

A real node found it (issue 24): two ``cdi webhook`` replicas started at once, both read the
webhook configurations, one patched the CA bundle in, and the other's JSON patch then failed its
``test`` of ``/metadata/resourceVersion``. The API server answers that with 422 (``Invalid``),
not 409, and the replica crashed once before a restart put it right. The upload API server's
replicas publish their CA into the APIService the same way.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from cdi.admission import WebhookCertStore, WebhookConfig
from cdi.kube.client import MUTATING_WEBHOOKS, SECRETS, VALIDATING_WEBHOOKS, Kube, Resource
from cdi.kube.shared_key import ensure_shared_key
from cdi.pki.certs import Bundle
from cdi.pki.store import ServingCertConfig
from cdi.upload.kubestore import API_SERVICES, ApiServiceCertStore
from testkit.cluster import Cluster

pytestmark = pytest.mark.integration


class ReplicaKube(Kube):
    """The product's gateway to the real API server, holding each ``verb`` on ``held`` until
    both replicas reach it (both have read first): the interleaving of the real node's crash,
    made certain instead of left to timing (the requests themselves are real)."""

    def __init__(
        self, cluster: Cluster, both_read: threading.Barrier, verb: str, held: Resource
    ) -> None:
        super().__init__(cluster.api_client())
        self.both_read = both_read
        self.verb, self.held = verb, held

    def _hold(self, verb: str, res: Resource) -> None:
        if verb == self.verb and res is self.held and not self.both_read.broken:
            self.both_read.wait(timeout=10)

    def patch(self, res: Resource, name: str, patch: Any, *args: Any, **kw: Any) -> Any:
        self._hold("patch", res)
        return super().patch(res, name, patch, *args, **kw)

    def create(self, res: Resource, obj: Any, *args: Any, **kw: Any) -> Any:
        self._hold("create", res)
        return super().create(res, obj, *args, **kw)


def _webhook_configuration(kind: str, name: str) -> dict[str, Any]:
    hook = {
        "name": f"{name}.cdi.kubevirt.io",
        "clientConfig": {"url": "https://127.0.0.1:9/never-called"},
        "rules": [
            {
                "operations": ["CREATE"],
                "apiGroups": ["cdi.kubevirt.io"],
                "apiVersions": ["v1beta1"],
                "resources": ["no-such-resource"],
            }
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": [hook, {**hook, "name": f"{name}-2.cdi.kubevirt.io"}],
    }


@pytest.fixture
def webhook_config(cluster: Cluster, namespace: str) -> Iterator[WebhookConfig]:
    kube = Kube(cluster.api_client())
    config = WebhookConfig(
        namespace=namespace,
        validating_config=f"race-validator-{namespace}",
        mutating_config=f"race-mutator-{namespace}",
    )
    made = [
        (VALIDATING_WEBHOOKS, "ValidatingWebhookConfiguration", config.validating_config),
        (MUTATING_WEBHOOKS, "MutatingWebhookConfiguration", config.mutating_config),
    ]
    for res, kind, name in made:
        kube.create(res, _webhook_configuration(kind, name))
    yield config
    for res, _, name in made:
        kube.delete(res, name)


def _published(kube: Kube, config: WebhookConfig) -> set[bytes]:
    bundles = set()
    for res, name in (
        (VALIDATING_WEBHOOKS, config.validating_config),
        (MUTATING_WEBHOOKS, config.mutating_config),
    ):
        for hook in kube.get(res, name)["webhooks"]:
            bundles.add(base64.b64decode(hook["clientConfig"]["caBundle"]))
    return bundles


def test_two_replicas_starting_together_both_serve_the_one_published_ca(
    cluster: Cluster, webhook_config: WebhookConfig
) -> None:
    both_read = threading.Barrier(2)
    kubes = [ReplicaKube(cluster, both_read, "patch", VALIDATING_WEBHOOKS) for _ in range(2)]
    stores = [WebhookCertStore(kube, webhook_config) for kube in kubes]
    with ThreadPoolExecutor(2) as pool:
        bundles: list[Bundle] = list(pool.map(lambda s: s.ensure(), stores))  # raises if one did
    assert both_read.n_waiting == 0 and not both_read.broken  # the patches did race
    first, second = bundles
    assert first.ca == second.ca and first.serving == second.serving
    kube = Kube(cluster.api_client())
    assert _published(kube, webhook_config) == {first.ca_bundle}
    secret = kube.get(SECRETS, webhook_config.cert_secret, webhook_config.namespace)
    assert base64.b64decode(secret["data"]["ca.crt"]) == first.ca.cert_pem


def test_two_upload_api_replicas_starting_together_publish_one_ca_in_the_api_service(
    cluster: Cluster, namespace: str
) -> None:
    kube = Kube(cluster.api_client())
    group = f"{namespace}.race.test"
    service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"v1.{group}"},
        "spec": {
            "group": group,
            "version": "v1",
            "groupPriorityMinimum": 1000,
            "versionPriority": 15,
            "service": {"namespace": namespace, "name": "cdi-api", "port": 443},
        },
    }
    kube.create(API_SERVICES, service)
    try:
        config = ServingCertConfig(namespace=namespace, service="cdi-api", cert_secret="api-certs")
        both_read = threading.Barrier(2)
        kubes = [ReplicaKube(cluster, both_read, "patch", API_SERVICES) for _ in range(2)]
        stores = [ApiServiceCertStore(k, config, f"v1.{group}") for k in kubes]
        with ThreadPoolExecutor(2) as pool:
            bundles: list[Bundle] = list(pool.map(lambda s: s.ensure(), stores))
        assert both_read.n_waiting == 0 and not both_read.broken
        assert bundles[0].ca == bundles[1].ca
        published = kube.get(API_SERVICES, f"v1.{group}")["spec"]["caBundle"]
        assert base64.b64decode(published) == bundles[0].ca_bundle
    finally:
        kube.delete(API_SERVICES, f"v1.{group}")


def test_two_replicas_creating_the_requester_key_together_end_with_the_same_key(
    cluster: Cluster, namespace: str
) -> None:
    """The other Secret a webhook makes at start-up (deploy/: --requester-key-secret): both
    find it missing, both create, one gets 409 and reads the winner's key."""
    both_read = threading.Barrier(2)
    kubes = [ReplicaKube(cluster, both_read, "create", SECRETS) for _ in range(2)]
    with ThreadPoolExecutor(2) as pool:
        keys = list(pool.map(lambda k: ensure_shared_key(k, namespace, "requester-key"), kubes))
    assert both_read.n_waiting == 0 and not both_read.broken  # both did try to create
    assert keys[0] == keys[1] and len(keys[0]) == 64
