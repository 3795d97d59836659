"""N7 on the real control plane (deploy/ as installed: the webhook signs a DataSource's creator,
the controller asks real SubjectAccessReviews): a DataSource pointing into another namespace
tells its creator nothing the creator may not read there. Alice (``edit`` and DataSource rights
in her namespace, nothing in bob's) gets the same status for bob's existing claim and for a
missing one, and none of bob's labels; bob himself (``view`` in his namespace, DataSource
rights in alice's) gets CDI's full answer (Ready, the source's ``*.kubevirt.io/*`` labels)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import DV_API

pytestmark = pytest.mark.integration

RBAC = "/apis/rbac.authorization.k8s.io/v1"
LABEL = "instancetype.kubevirt.io/default-instancetype"


def ds_path(ns: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/datasources" + (f"/{name}" if name else "")


def bind(kube: Kube, namespace: str, user: str, role_kind: str, role: str) -> None:
    kube.create(
        f"{RBAC}/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


def may_use_datasources(kube: Kube, namespace: str, user: str) -> None:
    """``edit`` and DataSource rights in ``namespace`` (CDI's aggregated edit role gives them)."""
    role = "datasources"
    if kube.get_or_none(f"{RBAC}/namespaces/{namespace}/roles/{role}") is None:
        rule = {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datasources"],
                "verbs": ["get", "list", "create", "delete"]}  # fmt: skip
        kube.create(
            f"{RBAC}/namespaces/{namespace}/roles",
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": role}, "rules": [rule]},
        )  # fmt: skip
    bind(kube, namespace, user, "ClusterRole", "edit")
    bind(kube, namespace, user, "Role", role)


@pytest.fixture
def bob(kube: Kube) -> Iterator[str]:
    """Bob's namespace with a claim ``existing-pvc`` labelled with a private instance type."""
    ns = f"bob-{secrets.token_hex(3)}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns}})  # fmt: skip
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "existing-pvc", "labels": {LABEL: "bob-private-u1.large"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    }
    kube.create(ns_path(ns, "persistentvolumeclaims"), pvc)
    yield ns
    kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}")


def pointer(name: str, namespace: str, claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataSource",
        "metadata": {"name": name},
        "spec": {"source": {"pvc": {"namespace": namespace, "name": claim}}},
    }


def settled(kube: Kube, ns: str, name: str) -> tuple[tuple[str, str, str], dict[str, str]]:
    """The Ready condition (status, reason, message) once written, and the DataSource's labels."""

    def read() -> tuple[tuple[str, str, str], dict[str, str]] | None:
        ds = kube.get(ds_path(ns, name))
        conds = (ds.get("status") or {}).get("conditions") or []
        cond = next((c for c in conds if c["type"] == "Ready"), None)
        if cond is None:
            return None
        labels = ds["metadata"].get("labels") or {}
        return (cond["status"], cond["reason"], cond["message"]), labels

    return wait_until(read, f"DataSource {ns}/{name} to get a Ready condition", 60, 0.2)


def create_as(cluster: Cluster, kube: Kube, user: str, ns: str, ds: dict[str, Any]) -> None:
    """As ``user``, once the RBAC grants reach the authorizer."""
    as_user = Kube.from_kubeconfig(cluster.kubeconfig_for(user))

    def created() -> bool:
        try:
            as_user.create(ds_path(ns), ds)
        except Exception:
            return False
        return True

    wait_until(created, f"{user} to create DataSource {ds['metadata']['name']}", 30, 0.5)


def test_a_datasource_reveals_nothing_of_a_namespace_its_creator_may_not_read(
    cluster: Cluster, kube: Kube, product: Product, namespace: str, bob: str
) -> None:
    may_use_datasources(kube, namespace, "alice")
    create_as(cluster, kube, "alice", namespace, pointer("probe-existing", bob, "existing-pvc"))
    create_as(cluster, kube, "alice", namespace, pointer("probe-missing", bob, "no-such-pvc"))
    existing, existing_labels = settled(kube, namespace, "probe-existing")
    missing, missing_labels = settled(kube, namespace, "probe-missing")
    assert existing == missing
    assert existing[:2] == ("False", "SourceNotAuthorized")
    assert LABEL not in existing_labels and LABEL not in missing_labels


def test_a_datasource_by_a_creator_who_may_read_the_source_is_ready_with_its_labels(
    cluster: Cluster, kube: Kube, product: Product, namespace: str, bob: str
) -> None:
    may_use_datasources(kube, namespace, "bob")
    bind(kube, bob, "bob", "ClusterRole", "view")
    create_as(cluster, kube, "bob", namespace, pointer("golden", bob, "existing-pvc"))
    ready, labels = settled(kube, namespace, "golden")
    assert ready[:2] == ("True", "Ready")
    assert labels.get(LABEL) == "bob-private-u1.large"  # copied before the status is written
    create_as(cluster, kube, "bob", namespace, pointer("nothing", bob, "no-such-pvc"))
    assert settled(kube, namespace, "nothing")[0][:2] == ("False", "NotFound")


def test_a_tenant_cannot_forge_the_creator_of_a_datasource(
    cluster: Cluster, kube: Kube, product: Product, namespace: str, bob: str
) -> None:
    """Alice writes the admin's requester record herself: the webhook overwrites
    it on create, and an unsigned or re-signed record gives no access."""
    may_use_datasources(kube, namespace, "alice")
    forged = pointer("forged", bob, "existing-pvc")
    forged["metadata"]["annotations"] = {
        "cdi.kubevirt.io/storage.requester.username": "system:admin",
        "cdi.kubevirt.io/storage.requester.groups": '["system:masters"]',
        "cdi.kubevirt.io/storage.requester.signature": "v1:2030-01-01T00:00:00Z:00",
    }
    create_as(cluster, kube, "alice", namespace, forged)
    recorded = kube.get(ds_path(namespace, "forged"))["metadata"]["annotations"]
    assert recorded["cdi.kubevirt.io/storage.requester.username"] == "alice"
    (status, reason, _), labels = settled(kube, namespace, "forged")
    assert (status, reason) == ("False", "SourceNotAuthorized") and LABEL not in labels
