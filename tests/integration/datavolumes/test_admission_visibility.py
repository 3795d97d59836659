"""Through the real API server and our webhook process: a tenant's DataVolume that clones from
another namespace gets the same answer whether the source PVC exists or not, unless the tenant
may read it (the webhook asks a real SubjectAccessReview, with its deployed RBAC rules)."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import dv_path
from tests.integration.datavolumes.test_admission import admission  # noqa: F401

pytestmark = pytest.mark.integration

RBAC = "/apis/rbac.authorization.k8s.io/v1"
MISMATCH = "Source contentType (archive) and target contentType (kubevirt) do not match"


def clone_of(name: str, namespace: str, source: str) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name},
        "spec": {
            "source": {"pvc": {"namespace": namespace, "name": source}},
            "pvc": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    }


def grant(kube: Kube, namespace: str, name: str, user: str, rule: dict[str, Any]) -> None:
    kube.create(
        f"{RBAC}/namespaces/{namespace}/roles",
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name}, "rules": [rule]},
    )  # fmt: skip
    kube.create(
        f"{RBAC}/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )


@pytest.fixture
def finance(kube: Kube) -> Iterator[str]:
    """Another namespace holding an archive PVC ``payroll``."""
    ns = f"finance-{secrets.token_hex(3)}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": ns}})  # fmt: skip
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "payroll",
            "annotations": {"cdi.kubevirt.io/storage.contentType": "archive"},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}},
    }
    kube.create(ns_path(ns, "persistentvolumeclaims"), pvc)
    yield ns
    kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}")


def outcome(kube: Kube, namespace: str, dv: dict[str, Any]) -> str:
    """ "admitted" or the rejection message; an admitted DataVolume is deleted again."""
    try:
        kube.create(dv_path(namespace), dv)
    except ApiError as err:
        return str(err.body.get("message") if err.body else err)
    kube.delete(dv_path(namespace, dv["metadata"]["name"]))
    return "admitted"


def test_a_tenant_cannot_probe_another_namespace_through_admission(
    cluster: Cluster,
    kube: Kube,
    admission: str,  # noqa: F811
    finance: str,
) -> None:
    rule = {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"],
            "verbs": ["create", "delete", "get"]}  # fmt: skip
    grant(kube, admission, f"bob-dvs-{secrets.token_hex(2)}", "bob", rule)
    # bob may clone from finance (cdi-cloner's right) but not read its PVCs.
    clone = {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"],
             "verbs": ["create"]}  # fmt: skip
    grant(kube, finance, "bob-clones", "bob", clone)
    bob = Kube.from_kubeconfig(cluster.kubeconfig_for("bob"))

    def bob_may_create() -> bool:
        try:
            return outcome(bob, admission, clone_of("probe", finance, "ghost")) == "admitted"
        except ApiError:
            return False

    wait_until(bob_may_create, "bob's RBAC grant to reach the authorizer", 30, 0.5)
    existing = outcome(bob, admission, clone_of("probe", finance, "payroll"))
    missing = outcome(bob, admission, clone_of("probe", finance, "ghost"))
    assert existing == missing == "admitted"
    # The administrator may read it, so gets CDI's full answer.
    assert MISMATCH in outcome(kube, admission, clone_of("probe", finance, "payroll"))
    # Once bob may read the source, he gets it too.
    read = {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get"]}
    grant(kube, finance, "bob-reads-pvcs", "bob", read)
    wait_until(
        lambda: MISMATCH in outcome(bob, admission, clone_of("probe", finance, "payroll")),
        "the webhook to show bob the source he may now read",
        30,
        0.5,
    )
