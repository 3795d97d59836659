"""Tenants get CDI's rights through the built-in roles (deploy/13-rbac-tenants.yaml, CDI's
``rbac_test.go``, scenarios 3945-3950), on the installed product: alice is bound to ``edit``,
bob to ``view``, carol to nothing, each by a RoleBinding in the test namespace. The cluster's
clusterrole-aggregation controller folds our ClusterRoles into the API server's bootstrap
roles; every request below goes through the real authorizer (and, when allowed, our webhooks
and the token API), as that user's own token."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from functools import partial
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import DV_API, datavolume, dv_path, wait_phase

pytestmark = pytest.mark.integration

RBAC = "/apis/rbac.authorization.k8s.io/v1"
UPLOAD_API = "/apis/upload.cdi.kubevirt.io/v1beta1"
KINDS = ("datavolumes", "datasources", "dataimportcrons")


def bind(kube: Kube, ns: str, user: str, role: str) -> None:
    kube.create(f"{RBAC}/namespaces/{ns}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": f"{user}-{role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    })  # fmt: skip


def objects(prefix: str) -> dict[str, dict[str, Any]]:
    """One valid object of each kind (the webhooks admit them), named after ``prefix``."""
    dv = datavolume(f"{prefix}-dv", {"blank": {}}, size="16Mi")
    ds = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
          "metadata": {"name": f"{prefix}-ds"},
          "spec": {"source": {"pvc": {"namespace": "default", "name": "none"}}}}  # fmt: skip
    cron = {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataImportCron",
        "metadata": {"name": f"{prefix}-cron"},
        "spec": {
            "schedule": "0 0 1 1 *",
            "managedDataSource": f"{prefix}-managed",
            "template": {"spec": {
                "source": {"registry": {"url": "docker://127.0.0.1:9/none"}},
                "storage": {"resources": {"requests": {"storage": "16Mi"}}},
            }},
        },
    }  # fmt: skip
    return {"datavolumes": dv, "datasources": ds, "dataimportcrons": cron}


def path(ns: str, kind: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/{kind}" + (f"/{name}" if name else "")


def status_of(call: Any, *args: Any) -> int:
    """The HTTP status of ``call(*args)``: 200 for any success, else the API's error status."""
    try:
        call(*args)
    except ApiError as e:
        return e.status
    return 200


def token_request() -> dict[str, Any]:
    return {"apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
            "metadata": {"generateName": "roles-"}, "spec": {"pvcName": "target"}}  # fmt: skip


def upload_target(kube: Kube, ns: str) -> None:
    """An upload target nobody starts a server for (WaitForFirstConsumer, no consumer)."""
    kube.create(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "target",
                     "annotations": {"cdi.kubevirt.io/storage.upload.target": ""}},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "testkit-fs-wffc",
                 "resources": {"requests": {"storage": "1Mi"}}},
    })  # fmt: skip


def may_clone(kube: Kube, ns: str, user: str) -> bool:
    """What clone authorization asks in a source namespace (cdi/api/cloneauth.py)."""
    review = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["testkit:users", "system:authenticated"],
                 "resourceAttributes": {"namespace": ns, "verb": "create",
                                        "group": "cdi.kubevirt.io", "resource": "datavolumes",
                                        "subresource": "source", "name": "src"}},
    })  # fmt: skip
    return bool(review["status"].get("allowed"))


def test_edit_view_and_no_role_may_do_exactly_what_cdis_roles_allow(
    cluster: Cluster, kube: Kube, product: Product, namespace: str
) -> None:
    bind(kube, namespace, "alice", "edit")
    bind(kube, namespace, "bob", "view")
    upload_target(kube, namespace)
    alice, bob, carol = (cluster.kube(u) for u in ("alice", "bob", "carol"))
    made = objects("alice")

    def created(kind: str) -> bool:  # the bindings and the aggregation reach the authorizer
        return status_of(alice.create, path(namespace, kind), made[kind]) == 200

    for kind in KINDS:
        wait_until(partial(created, kind), f"alice (edit) creates {kind}", 30, 0.5)
    wait_until(
        lambda: status_of(bob.get, path(namespace, "datavolumes")) == 200, "bob's view", 30, 0.5
    )

    for kind in KINDS:
        name = made[kind]["metadata"]["name"]
        for who, user in ((alice, "alice"), (bob, "bob")):
            assert status_of(who.get, path(namespace, kind, name)) == 200, user
            listed = who.get(path(namespace, kind))["items"]
            assert name in {o["metadata"]["name"] for o in listed}, (user, kind)
        assert status_of(carol.get, path(namespace, kind, name)) == 403, kind
        assert status_of(carol.get, path(namespace, kind)) == 403, kind
        for who, user in ((bob, "bob"), (carol, "carol")):
            body = objects(user)[kind]
            assert status_of(who.create, path(namespace, kind), body) == 403, user
            assert status_of(who.delete, path(namespace, kind, name)) == 403, user
        patch = {"metadata": {"labels": {"touched": "yes"}}}
        assert status_of(bob.patch, path(namespace, kind, name), patch) == 403
        assert status_of(alice.patch, path(namespace, kind, name), patch) == 200

    # upload tokens: edit yes (through the aggregated API and its own access review)
    tokens = f"{UPLOAD_API}/namespaces/{namespace}/uploadtokenrequests"
    answer = alice.create(tokens, token_request())
    assert answer["status"]["token"]
    for who in (bob, carol):
        assert status_of(who.create, tokens, token_request()) == 403

    # cloning from here: CDI grants datavolumes/source to edit and view alike
    assert may_clone(kube, namespace, "alice") and may_clone(kube, namespace, "bob")
    assert not may_clone(kube, namespace, "carol")

    # cluster-scoped settings stay the administrator's: a RoleBinding reaches none of them
    # (and our view role does not read CDIConfig even cluster-wide: docs/security.md)
    config = f"{DV_API}/cdiconfigs/config"
    for who in (alice, bob, carol):
        assert status_of(who.get, config) == 403
        assert status_of(who.patch, config, {"spec": {"logVerbosity": 9}}) == 403
    profiles = f"{DV_API}/storageprofiles/testkit-fs"
    assert status_of(alice.patch, profiles, {"spec": {"cloneStrategy": "copy"}}) == 403

    # and what edit made, edit may remove
    dv = made["datavolumes"]["metadata"]["name"]
    assert status_of(alice.delete, path(namespace, "datavolumes", dv)) == 200


@pytest.fixture
def target_namespace(kube: Kube) -> Iterator[str]:
    name = f"roles-target-{secrets.token_hex(3)}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": name}})  # fmt: skip
    yield name
    kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def test_view_of_the_source_namespace_is_enough_to_clone_from_it_and_nothing_is_not(
    cluster: Cluster, kube: Kube, product: Product, namespace: str, target_namespace: str
) -> None:
    """Bob (view where the source is, edit in his own namespace) clones; carol (edit in the
    same target namespace, nothing where the source is) is refused with CDI's message. Neither
    has ``create pods`` in the source namespace, CDI's other way to be allowed."""
    kube.create(dv_path(namespace), datavolume("src", {"blank": {}}, size="16Mi"))
    wait_phase(kube, namespace, "src", ("Succeeded",), 120)
    bind(kube, namespace, "bob", "view")
    for user in ("bob", "carol"):
        bind(kube, target_namespace, user, "edit")
    bob, carol = cluster.kube("bob"), cluster.kube("carol")

    def clone(name: str) -> dict[str, Any]:
        return datavolume(name, {"pvc": {"namespace": namespace, "name": "src"}}, size="16Mi")

    def admitted(who: Kube, name: str) -> bool:
        try:
            who.create(dv_path(target_namespace), clone(name))
        except ApiError as e:
            if e.status == 403 or "insufficient permissions" in str(e):
                return False  # the bindings have not reached the authorizer yet
            raise
        return True

    wait_until(lambda: admitted(bob, "bobs-copy"), "bob's clone admitted", 30, 0.5)
    done = wait_phase(kube, target_namespace, "bobs-copy", ("Succeeded", "Failed"), 180)
    assert done["status"]["phase"] == "Succeeded"  # the controller's re-check allowed it too

    # carol's own bindings work (she may create a DataVolume in the target namespace) ...
    blank = datavolume("carols-blank", {"blank": {}}, size="16Mi")
    wait_until(
        lambda: status_of(carol.create, dv_path(target_namespace), blank) == 200,
        "carol's edit binding",
        30,
        0.5,
    )
    # ... but she may not read the source namespace, so she may not clone from it
    with pytest.raises(ApiError) as refused:
        carol.create(dv_path(target_namespace), clone("carols-copy"))
    assert f"User carol has insufficient permissions in clone source namespace {namespace}" in str(
        refused.value
    )
