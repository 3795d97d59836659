"""Requester signing is on in the deployed product: the webhook and the controller share the HMAC
key through the Secret cdi/cdi-requester-key, which our code generates (deploy/ holds no key),
and a DataVolume created through the webhook carries a record that verifies with that key.
"""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import pytest

from cdi.api.constants import ANN_REQUESTER_USERNAME
from cdi.api.requester import ANN_REQUESTER_SIGNATURE, trusted_requester
from cdi.kube.client import Kube as CdiKube
from cdi.kube.shared_key import ensure_shared_key
from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.kubeconfig import ADMIN
from testkit.product import Product, deploy_documents
from tests.integration.datavolumes.cdi_env import datavolume, dv_path, wait_phase

pytestmark = pytest.mark.integration

KEY_SECRET = "/api/v1/namespaces/cdi/secrets/cdi-requester-key"


def _shared_key(kube: Kube) -> bytes:
    secret = kube.get(KEY_SECRET)
    return base64.b64decode(secret["data"]["key"]).strip()


def test_no_key_is_checked_into_deploy() -> None:
    """No Secret with content: a ServiceAccount token Secret (the metrics reader's) is filled
    by the cluster's token controller, never by the manifest."""
    secrets = [d for d in deploy_documents() if d["kind"] == "Secret"]
    assert all(d.get("type") == "kubernetes.io/service-account-token" for d in secrets), secrets
    assert not [d for d in secrets if d.get("data") or d.get("stringData")], secrets


def test_a_datavolume_created_through_the_webhook_has_a_valid_signed_requester(
    product: Product, kube: Kube, namespace: str
) -> None:
    key = _shared_key(kube)
    assert len(key) == 64  # 32 random bytes, hex: made by cdi/kube/shared_key.py
    kube.create(dv_path(namespace), datavolume("signed", {"blank": {}}, size="8Mi"))
    dv = wait_phase(kube, namespace, "signed", ("Succeeded",))
    annotations = dv["metadata"]["annotations"]
    assert annotations[ANN_REQUESTER_USERNAME] == ADMIN
    assert annotations[ANN_REQUESTER_SIGNATURE].startswith("v2:")
    requester = trusted_requester(dv, key)
    assert requester is not None and requester.username == ADMIN
    assert trusted_requester(dv, b"0" * 64) is None  # the record is bound to this key


def test_a_forged_record_is_replaced_by_the_webhooks(
    product: Product, kube: Kube, namespace: str
) -> None:
    forged = {ANN_REQUESTER_USERNAME: "system:admin", ANN_REQUESTER_SIGNATURE: "v1:x:y"}
    kube.create(dv_path(namespace), datavolume("forged", {"blank": {}}, "8Mi", annotations=forged))
    dv = kube.get(dv_path(namespace, "forged"))
    requester = trusted_requester(dv, _shared_key(kube))
    assert requester is not None and requester.username == ADMIN


def test_processes_racing_to_make_the_key_all_end_with_the_same_one(
    cluster: Cluster, namespace: str
) -> None:
    def make(_: int) -> bytes:
        return ensure_shared_key(CdiKube(cluster.api_client()), namespace, "racing-key")

    with ThreadPoolExecutor(6) as pool:
        keys = set(pool.map(make, range(6)))
    assert len(keys) == 1 and len(next(iter(keys))) == 64
    assert make(0) in keys  # later readers get it too
