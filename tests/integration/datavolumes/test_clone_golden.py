"""Golden images across namespaces on the real control plane, with the product as installed.

An admin imports a qcow2 into ``golden`` and points a DataSource at it; tenant alice, with only
the ``cdi-cloner`` role bound in ``golden``, clones it into her namespace through ``sourceRef``
and gets the same bytes; bob, without it, is refused at admission with CDI's message; and a
DataVolume whose requester record the webhook did not write (created while the webhooks were
out of the path, with alice's name forged on it) clones nothing.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    Images,
    ImageServer,
    condition,
    datavolume,
    dv_path,
    event_reasons,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)
from tests.integration.datavolumes.test_admission_visibility import grant

pytestmark = pytest.mark.integration

RBAC = "/apis/rbac.authorization.k8s.io/v1"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
WEBHOOKS = (
    ("validatingwebhookconfigurations", "cdi-datavolume-validator"),
    ("mutatingwebhookconfigurations", "cdi-datavolume-mutator"),
)


def new_namespace(kube: Kube, prefix: str) -> str:
    name = f"{prefix}-{secrets.token_hex(3)}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": name}})  # fmt: skip
    return name


@pytest.fixture
def golden(kube: Kube, controller: Any, image_server: ImageServer) -> Iterator[str]:
    """Namespace ``golden-*`` with an imported qcow2 ``fedora`` and a DataSource naming it."""
    ns = new_namespace(kube, "golden")
    source = {"http": {"url": image_server.url("ok", "disk.qcow2")}}
    kube.create(dv_path(ns), datavolume("fedora", source, size="64Mi"))
    kube.create(f"{DV_API}/namespaces/{ns}/datasources", {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
        "metadata": {"name": "fedora"},
        "spec": {"source": {"pvc": {"namespace": ns, "name": "fedora"}}},
    })  # fmt: skip
    yield ns
    kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}")


def datasource_ready(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    ds = kube.get(f"{DV_API}/namespaces/{ns}/datasources/{name}")
    conds = (ds.get("status") or {}).get("conditions") or []
    return ds if any(c["type"] == "Ready" and c["status"] == "True" for c in conds) else None


def clone_ref(name: str, golden: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name},
        "spec": {
            "sourceRef": {"kind": "DataSource", "namespace": golden, "name": "fedora"},
            "storage": {"storageClassName": "testkit-fs"},
        },
    }


def tenant(kube: Kube, cluster: Cluster, ns: str, user: str) -> Kube:
    rule = {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"],
            "verbs": ["create", "get", "delete"]}  # fmt: skip
    grant(kube, ns, f"{user}-dvs", user, rule)
    return Kube.from_kubeconfig(cluster.kubeconfig_for(user))


def bind_cloner(kube: Kube, ns: str, user: str) -> None:
    kube.create(f"{RBAC}/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{user}-cdi-cloner"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cdi-cloner"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })  # fmt: skip


def create_when_allowed(client: Kube, ns: str, dv: dict[str, Any]) -> None:
    """Create as soon as RBAC grants have reached the authorizer."""

    def attempt() -> bool:
        try:
            client.create(dv_path(ns), dv)
        except ApiError as err:
            if err.status == 403 or "insufficient permissions" in str(err.body):
                return False
            raise
        return True

    wait_until(attempt, f"{dv['metadata']['name']} admitted", 30, 0.5)


def volume_file(kube: Kube, ns: str, claim: str) -> Path:
    return Path(pv_of(kube, ns, claim)["spec"]["local"]["path"]) / "disk.img"


def test_golden_image_flow_alice_clones_bob_is_refused(
    cluster: Cluster, kube: Kube, namespace: str, golden: str, images: Images
) -> None:
    wait_phase(kube, golden, "fedora", ("Succeeded",), 120)
    wait_until(lambda: datasource_ready(kube, golden, "fedora"), "DataSource Ready", 30)
    alice = tenant(kube, cluster, namespace, "alice")
    bind_cloner(kube, golden, "alice")
    create_when_allowed(alice, namespace, clone_ref("mine", golden))
    dv = wait_phase(kube, namespace, "mine", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert condition(dv, "Running")["message"] == "Clone Complete"
    event_reasons(kube, namespace, "mine", {"CloneSucceeded"})
    same_prefix_then_zeros(volume_file(kube, namespace, "mine"), images.reference)
    source_pv = pv_of(kube, golden, "fedora")
    assert source_pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    target_pv = pv_of(kube, namespace, "mine")
    assert target_pv["spec"]["persistentVolumeReclaimPolicy"] == "Delete"  # restored after move
    assert "cdi.kubevirt.io/cloneFor" not in (target_pv["metadata"].get("labels") or {})
    assert (
        kube.get_or_none(
            ns_path(golden, "persistentvolumeclaims", f"tmp-pvc-{dv['metadata']['uid']}")
        )
        is None
    )

    bob_ns = new_namespace(kube, "bob")
    try:
        bob = tenant(kube, cluster, bob_ns, "bob")
        wait_until(
            lambda: _admission_answer(bob, bob_ns, golden) != "forbidden", "bob RBAC", 30, 0.5
        )
        assert _admission_answer(bob, bob_ns, golden) == (
            f"User bob has insufficient permissions in clone source namespace {golden}"
        )
    finally:
        kube.delete_ignore_missing(f"/api/v1/namespaces/{bob_ns}")


def _admission_answer(client: Kube, ns: str, golden: str) -> str:
    try:
        client.create(dv_path(ns), clone_ref("theirs", golden))
    except ApiError as err:
        if err.status == 403:
            return "forbidden"
        message = str((err.body or {}).get("message") or err)
        return message.split("denied the request: ", 1)[-1]
    return "admitted"


@pytest.fixture
def webhooks_out_of_the_path(kube: Kube) -> Iterator[None]:
    """Both webhook configurations removed (as in an outage with failurePolicy Ignore, or a
    restore from backup), then put back exactly as they were (CA bundle included)."""
    saved = []
    for kind, name in WEBHOOKS:
        obj = kube.get(f"{ADMISSION}/{kind}/{name}")
        for key in ("resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"):
            obj["metadata"].pop(key, None)
        saved.append((kind, name, obj))
        kube.delete(f"{ADMISSION}/{kind}/{name}")
    try:
        yield
    finally:
        for kind, name, obj in saved:
            kube.delete_ignore_missing(f"{ADMISSION}/{kind}/{name}")
            kube.create(f"{ADMISSION}/{kind}", obj)


def test_a_forged_requester_record_gets_nobody_anything(
    kube: Kube, namespace: str, golden: str, webhooks_out_of_the_path: None
) -> None:
    wait_phase(kube, golden, "fedora", ("Succeeded",), 120)
    forged = clone_ref("forged", golden)
    forged["metadata"]["annotations"] = {
        "cdi.kubevirt.io/storage.requester.username": "system:admin",
        "cdi.kubevirt.io/storage.requester.groups": '["system:masters"]',
        "cdi.kubevirt.io/storage.requester.signature": "v1:2026-01-01T00:00:00Z:" + "0" * 64,
    }
    kube.create(dv_path(namespace), forged)

    def refused() -> dict[str, Any] | None:
        dv = kube.get(dv_path(namespace, "forged"))
        bound = next((c for c in (dv.get("status") or {}).get("conditions") or []
                      if c["type"] == "Bound"), {})  # fmt: skip
        return dv if bound.get("reason") == "CloneNotAuthorized" else None

    dv = wait_until(refused, "the controller to refuse the unrecorded requester", 60)
    assert "not recorded by the admission webhook" in condition(dv, "Bound")["message"]
    assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", "forged")) is None
    uid = dv["metadata"]["uid"]
    assert kube.get_or_none(ns_path(golden, "persistentvolumeclaims", f"tmp-pvc-{uid}")) is None


def test_a_claim_naming_a_source_its_user_may_not_read_copies_nothing(
    cluster: Cluster, kube: Kube, namespace: str, golden: str
) -> None:
    """Alice prepares a claim with a copy clone's bookkeeping naming ``golden/fedora`` (which
    she may not read: no ``cdi-cloner`` there), then lets her same-namespace clone adopt it.
    The controller authorizes the source the claim names, as any source, and refuses: no
    source pod ever reads ``golden/fedora`` for her."""
    wait_phase(kube, golden, "fedora", ("Succeeded",), 120)
    alice = tenant(kube, cluster, namespace, "alice")
    claims = ns_path(namespace, "persistentvolumeclaims")
    for name, marks in (
        ("own", {}),
        ("mine", {"cdi.kubevirt.io/cloneType": "copy", "k8s.io/CloneRequest": f"{golden}/fedora"}),
    ):
        kube.create(claims, {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "annotations": marks},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "testkit-fs",
                     "resources": {"requests": {"storage": "64Mi"}}},
        })  # fmt: skip
    dv = {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "mine", "annotations": {"cdi.kubevirt.io/allowClaimAdoption": "true"}},
        "spec": {"source": {"pvc": {"namespace": namespace, "name": "own"}},
                 "storage": {"storageClassName": "testkit-fs",
                             "resources": {"requests": {"storage": "64Mi"}}}},
    }  # fmt: skip
    create_when_allowed(alice, namespace, dv)

    def source_pods() -> list[str]:
        pods = kube.get(ns_path(golden, "pods"))["items"]
        return [
            p["metadata"]["name"] for p in pods if p["metadata"]["name"].endswith("-source-pod")
        ]

    def refused_or_read() -> dict[str, Any] | None:
        got = kube.get(dv_path(namespace, "mine"))
        bound = next((c for c in (got.get("status") or {}).get("conditions") or []
                      if c["type"] == "Bound"), {})  # fmt: skip
        return got if bound.get("reason") == "CloneNotAuthorized" or source_pods() else None

    refused_dv = wait_until(refused_or_read, "the controller to refuse the claim's source", 60)
    assert not source_pods(), f"a source pod in {golden} reads fedora for alice"
    message = condition(refused_dv, "Bound")["message"]
    assert message == f"User alice has insufficient permissions in clone source namespace {golden}"
    time.sleep(3)  # reconciles go on: still nothing reads the source
    assert not source_pods()
    assert kube.get(dv_path(namespace, "mine"))["status"]["phase"] != "Succeeded"
