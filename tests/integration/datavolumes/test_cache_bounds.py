"""A tenant's oversized objects do not fill the controller's and the webhook's caches
(security review N8), and what the caches drop changes nothing the controller does.

The attack: claims, DataVolumes and DataSources carrying ~200 KiB of annotations each (the
API server allows 256 KiB), which the controller and the webhook used to cache whole: a few
thousand of them ran the 384Mi controller / 256Mi webhook out of memory. Here a handful are
created in the real API server and the caches are the ones the processes build
(``controller_informers``, ``keys_cache``); what they hold of the namespace is measured as
JSON bytes. A DataVolume the cache keeps only in part still gets every label and annotation
onto its claim: the reconciler reads it whole (``cdi.kube.informer_slim``).
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest

from cdi.controller.caches import controller_informers
from cdi.kube.client import DATA_SOURCES, DATAVOLUMES, PVCS, AsyncKube
from cdi.kube.client import Kube as ProductKube
from cdi.kube.informer import Informer, keys_cache, wait_all_synced
from cdi.kube.informer_slim import Slim, is_partial
from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from tests.integration.datavolumes.cdi_env import DV_API, dv_path
from tests.integration.datavolumes.test_reconcile_cache import (
    Listed,
    async_kube,
    reconciler,
    vddk_datavolume,
)

__all__ = ["async_kube"]  # the fixture

pytestmark = pytest.mark.integration

COPIES = 12
BULK = {f"tenant.example/junk-{i}": "x" * (50 * 1024) for i in range(4)}  # 200 KiB
SPEC = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "8Mi"}}}


def claim(name: str) -> dict[str, Any]:
    meta = {"name": name, "annotations": BULK, "labels": {"app": "bulk"}}
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": SPEC}


def data_source(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataSource",
        "metadata": {"name": name, "annotations": BULK},
        "spec": {"source": {"pvc": {"name": "absent", "namespace": ns}}},
    }


def held(informer: Informer, namespace: str) -> int:
    """JSON bytes the cache holds of ``namespace``'s objects."""
    mine = [o for o in informer.items() if o["metadata"].get("namespace") == namespace]
    assert len(mine) == COPIES, f"{informer.resource.plural}: {len(mine)} cached"
    return sum(len(json.dumps(o)) for o in mine)


async def synced(informers: list[Informer]) -> None:
    for informer in informers:
        informer.start()
    try:
        async with asyncio.timeout(30):
            await wait_all_synced(informers)
    finally:
        for informer in informers:
            informer.stop()


async def test_tenant_bulk_annotations_stay_out_of_the_controller_and_webhook_caches(
    kube: Kube, namespace: str, cluster: Cluster, cdi_crds: None
) -> None:
    for i in range(COPIES):
        kube.create(ns_path(namespace, "persistentvolumeclaims"), claim(f"c{i}"))
        dv = vddk_datavolume(f"d{i}")  # a source the installed controller leaves alone
        dv["metadata"]["annotations"] = BULK
        kube.create(dv_path(namespace), dv)
        kube.create(f"{DV_API}/namespaces/{namespace}/datasources", data_source(namespace, f"s{i}"))
    product = ProductKube(cluster.api_client())
    controller = controller_informers(product, resync=300.0)
    webhook = keys_cache(product, PVCS)
    await synced([controller[PVCS], controller[DATAVOLUMES], controller[DATA_SOURCES], webhook])

    stored = COPIES * 200 * 1024  # what the API server holds of each kind here
    for name in (PVCS, DATAVOLUMES, DATA_SOURCES):
        assert held(controller[name], namespace) < stored / 10, name.plural
    assert held(webhook, namespace) < COPIES * 1024
    cached = controller[PVCS].get(f"{namespace}/c0")
    assert cached is not None and not cached["metadata"].get("managedFields")
    # the DataVolumes keep what fits and say they are partial: their readers read them fresh
    assert is_partial(controller[DATAVOLUMES].get(f"{namespace}/d0"))


async def test_a_datavolume_cached_in_part_still_gives_its_claim_every_annotation(
    kube: Kube, namespace: str, async_kube: AsyncKube
) -> None:
    dv = vddk_datavolume("many")
    users = {f"tenant.example/note-{i}": "n" * 1024 for i in range(24)}  # 24 KiB: over budget
    dv["metadata"]["annotations"] = users
    dv["metadata"]["labels"] = {"team": "a"}
    created = kube.create(dv_path(namespace), dv)
    slim = Slim()(copy.deepcopy(created))  # what the controller's DataVolume cache holds
    assert is_partial(slim) and len(slim["metadata"]["annotations"]) < len(users)

    r = await reconciler(async_kube, Listed([slim]), Listed([]))
    await r.reconcile(f"{namespace}/many")

    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "many"))
    assert users.items() <= pvc["metadata"]["annotations"].items()
    assert pvc["metadata"]["labels"]["team"] == "a"
