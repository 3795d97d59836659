"""The webhook's existing-claim check from its claim cache, on the real API server.

``cdi.webhooks.claims``: a claim absent from the synced cache is taken as absent (no GET);
a claim the cache shows is judged as the API server holds it now, because the verdict rests
on its owner reference and annotations, which a cached version may show wrong; an unsynced
cache reads everything fresh. The caches here are filled by hand (what a lagging informer
would hold) or are the real ``Informer`` the webhook process runs; the rules and the GETs are
the product's (``validate_datavolume``, ``cdi.admission.KubeLookup``).

What the trusted absence can let through (a claim created a moment before its DataVolume,
not yet in the cache) is what the controller stops anyway: it never takes a claim that is not
its own (``test_a_claim_the_webhook_missed_is_left_alone_by_the_controller``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from cdi.admission import KubeLookup
from cdi.kube.client import PVCS, AsyncKube
from cdi.kube.client import Kube as ProductKube
from cdi.kube.informer import Informer
from cdi.webhooks.validation import validate_datavolume
from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from tests.integration.datavolumes.cdi_env import dv_path
from tests.integration.datavolumes.test_reconcile_cache import (
    Listed,
    async_kube,
    reconciler,
    vddk_datavolume,
)

__all__ = ["async_kube"]  # the fixture

pytestmark = pytest.mark.integration

SPEC = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}}}


class Cached:
    """A claim cache filled by hand: what an informer holds at one moment."""

    def __init__(self, claims: list[dict[str, Any]], synced: bool = True) -> None:
        self.synced = synced
        self.store = {f"{c['metadata']['namespace']}/{c['metadata']['name']}": c for c in claims}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.store.get(key)


@pytest.fixture
def product_kube(cluster: Cluster) -> Iterator[ProductKube]:
    yield ProductKube(cluster.api_client())


def claim(ns: str, name: str, owner: dict[str, Any] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": SPEC}


def dv(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"source": {"blank": {}}, "storage": SPEC},
    }


def owned_by_a_datavolume(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "name": name,
        "uid": "00000000-0000-0000-0000-000000000001",
        "controller": True,
    }


def taken_message(ns: str, name: str) -> str:
    return f"Destination PVC {ns}/{name} already exists"


def test_a_cached_claim_is_judged_as_the_api_server_holds_it(
    kube: Kube, product_kube: ProductKube, namespace: str
) -> None:
    """The cache still shows the claim owned by a DataVolume (which would admit); the API
    server's claim is nobody's now: rejected. And a claim the cache still shows but the server
    has deleted refuses nothing."""
    kube.create(ns_path(namespace, "persistentvolumeclaims"), claim(namespace, "taken"))
    stale = claim(namespace, "taken", owned_by_a_datavolume("taken"))
    gone = claim(namespace, "gone")
    lookup = KubeLookup(product_kube, Cached([stale, gone]))
    verdict = validate_datavolume(dv(namespace, "taken"), None, lookup)
    assert not verdict.allowed
    assert taken_message(namespace, "taken") in verdict.messages
    assert validate_datavolume(dv(namespace, "gone"), None, lookup).allowed


def test_an_unsynced_cache_reads_every_claim_fresh(
    kube: Kube, product_kube: ProductKube, namespace: str
) -> None:
    kube.create(ns_path(namespace, "persistentvolumeclaims"), claim(namespace, "taken"))
    lookup = KubeLookup(product_kube, Cached([], synced=False))
    verdict = validate_datavolume(dv(namespace, "taken"), None, lookup)
    assert taken_message(namespace, "taken") in verdict.messages


async def test_the_webhooks_claim_informer_answers_the_check(
    kube: Kube, product_kube: ProductKube, namespace: str
) -> None:
    """The informer the webhook process runs: a claim it has seen refuses the DataVolume of
    its name, a name with no claim is admitted."""
    kube.create(ns_path(namespace, "persistentvolumeclaims"), claim(namespace, "taken"))
    informer = Informer(product_kube, PVCS)
    informer.start()
    try:
        await asyncio.wait_for(informer.wait_synced(), 30)  # listed after the claim's create
        assert informer.get(f"{namespace}/taken") is not None
        lookup = KubeLookup(product_kube, informer)
        taken = await asyncio.to_thread(validate_datavolume, dv(namespace, "taken"), None, lookup)
        assert taken_message(namespace, "taken") in taken.messages
        free = await asyncio.to_thread(validate_datavolume, dv(namespace, "free"), None, lookup)
        assert free.allowed
    finally:
        informer.stop()


async def test_a_claim_the_webhook_missed_is_left_alone_by_the_controller(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    """The window the cache leaves open: a DataVolume admitted while a claim of its name,
    nobody's, came into being (created a moment before, not yet in the webhook's cache). The
    controller, its claim cache lagging too, creates (409), reads the claim, finds it is not
    its own and leaves it alone: no owner reference, no record, ErrResourceExists."""
    dv = kube.create(dv_path(namespace), vddk_datavolume("squat"))
    kube.create(ns_path(namespace, "persistentvolumeclaims"), claim(namespace, "squat"))
    r = await reconciler(async_kube, Listed([dv]), Listed([]))
    await r.reconcile(f"{namespace}/squat")

    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "squat"))
    assert not pvc["metadata"].get("ownerReferences")
    assert not any(
        k.startswith("cdi.kubevirt.io/") for k in pvc["metadata"].get("annotations") or {}
    )
    assert kube.get_or_none(ns_path(namespace, "pods", "importer-squat")) is None
    status = kube.get(dv_path(namespace, "squat"))["status"]
    assert "ErrResourceExists" in [c.get("reason") for c in status["conditions"]]
