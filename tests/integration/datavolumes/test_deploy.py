"""deploy/ against the real API server: every manifest passes a server-side dry run, and each
component's service account may do what its component does and nothing broad (checked with
SubjectAccessReview after applying the RBAC objects for real). That deploy/ also runs, applied
with kubectl as it is, is test_product.py's part."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from testkit.kubeclient import ApiError, Kube
from tests.integration.datavolumes.cdi_env import REPO

pytestmark = pytest.mark.integration

DEPLOY = REPO / "deploy"
APPLY = "application/apply-patch+yaml"
PLURALS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Service": ("/api/v1", "services", True),
    "ConfigMap": ("/api/v1", "configmaps", True),
    "Secret": ("/api/v1", "secrets", True),
    "ValidatingAdmissionPolicy": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicies",
        False,
    ),
    "ValidatingAdmissionPolicyBinding": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
        False,
    ),
    "Deployment": ("/apis/apps/v1", "deployments", True),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies", True),
    "APIService": ("/apis/apiregistration.k8s.io/v1", "apiservices", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
    "CustomResourceDefinition": (
        "/apis/apiextensions.k8s.io/v1",
        "customresourcedefinitions",
        False,
    ),
    "ValidatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "validatingwebhookconfigurations",
        False,
    ),
    "MutatingWebhookConfiguration": (
        "/apis/admissionregistration.k8s.io/v1",
        "mutatingwebhookconfigurations",
        False,
    ),
}
RBAC_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}


def manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(DEPLOY.glob("*.yaml")) + sorted((DEPLOY / "crds").glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def object_path(doc: dict[str, Any]) -> str:
    prefix, plural, namespaced = PLURALS[doc["kind"]]
    meta = doc["metadata"]
    ns = f"/namespaces/{meta.get('namespace', 'default')}" if namespaced else ""
    return f"{prefix}{ns}/{plural}/{meta['name']}"


def apply(kube: Kube, doc: dict[str, Any], *, dry_run: bool) -> dict[str, Any]:
    return kube.request(
        "PATCH",
        object_path(doc),
        doc,
        content_type=APPLY,
        query={
            "fieldManager": "cdi-deploy-test",
            "force": "true",
            "dryRun": "All" if dry_run else None,
        },
    )


def can(
    kube: Kube,
    sa: str,
    verb: str,
    resource: str,
    group: str = "",
    namespace: str | None = "some-ns",
    name: str | None = None,
    subresource: str | None = None,
) -> bool:
    attrs = {
        "verb": verb,
        "resource": resource,
        "group": group,
        "namespace": namespace,
        "name": name,
        "subresource": subresource,
    }
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:cdi:{sa}",
            "groups": [
                "system:serviceaccounts",
                "system:serviceaccounts:cdi",
                "system:authenticated",
            ],
            "resourceAttributes": {k: v for k, v in attrs.items() if v is not None},
        },
    }
    out = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
    return bool(out["status"].get("allowed"))


def test_the_example_tenant_network_policies_pass_a_server_side_dry_run(kube: Kube) -> None:
    text = (DEPLOY / "examples" / "tenant-networkpolicies.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text.replace("TENANT", "default")) if d]
    names = [apply(kube, doc, dry_run=True)["metadata"]["name"] for doc in docs]
    assert names == [
        "cdi-upload-server",
        "cdi-worker-metrics",
        "cdi-importer-egress",
        "cdi-clone-source-egress",
        "cdi-upload-server-egress",
    ]


def test_the_optional_control_plane_network_policies_pass_a_server_side_dry_run(
    kube: Kube,
) -> None:
    """deploy/optional/networkpolicies.yaml as shipped (its placeholders are valid ranges), in a
    namespace that exists here (the dry run of the install does not create `cdi`)."""
    text = (DEPLOY / "optional" / "networkpolicies.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text.replace("namespace: cdi", "namespace: default"))]
    names = [apply(kube, doc, dry_run=True)["metadata"]["name"] for doc in docs if doc]
    assert names == [
        "cdi-default-deny",
        "cdi-apiserver-egress",
        "cdi-from-apiserver",
        "cdi-controller-scrapes-workers",
        "cdi-metrics-ingress",
        "cdi-uploadproxy",
        "cdi-import-proxy-ingress",
        "cdi-import-proxy-egress",
    ]


@pytest.fixture(scope="module")
def applied_rbac(kube: Kube, cdi_crds: None) -> None:
    for doc in manifests():
        if doc["kind"] in RBAC_KINDS:
            apply(kube, doc, dry_run=False)


def test_every_manifest_passes_a_server_side_dry_run(kube: Kube, cdi_crds: None) -> None:
    kinds = set()
    for doc in manifests():
        try:
            out = apply(kube, doc, dry_run=True)
        except ApiError as e:
            raise AssertionError(f"{doc['kind']} {doc['metadata']['name']}: {e}") from e
        assert out["metadata"]["name"] == doc["metadata"]["name"]
        kinds.add(doc["kind"])
    assert {
        "Namespace",
        "CustomResourceDefinition",
        "Deployment",
        "Service",
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    } <= kinds


def test_no_role_uses_wildcards_or_touches_rbac() -> None:
    for doc in manifests():
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            for key in ("verbs", "resources", "apiGroups"):
                assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)
            assert "rbac.authorization.k8s.io" not in rule.get("apiGroups", [])
            assert not {"escalate", "bind", "impersonate"} & set(rule["verbs"])
        assert doc["metadata"]["name"] != "cluster-admin"
    bindings = [d for d in manifests() if d["kind"] in ("ClusterRoleBinding", "RoleBinding")]
    assert all(b["roleRef"]["name"].startswith("cdi-") for b in bindings)


CONTROLLER_MAY = [
    ("watch", "datavolumes", "cdi.kubevirt.io", None, None, None),
    ("patch", "datavolumes", "cdi.kubevirt.io", "some-ns", "dv", "status"),
    ("create", "persistentvolumeclaims", "", "some-ns", None, None),
    ("patch", "persistentvolumeclaims", "", "some-ns", "dv", None),
    ("create", "pods", "", "some-ns", None, None),
    ("delete", "pods", "", "some-ns", "importer-dv", None),
    ("delete", "persistentvolumeclaims", "", "some-ns", "prime-x", None),  # a populated prime
    ("patch", "persistentvolumes", "", None, "pvc-x", None),  # claimRef rebinding
    ("create", "volumeimportsources", "cdi.kubevirt.io", "some-ns", None, None),
    ("get", "csidrivers", "storage.k8s.io", None, "x", None),
    ("list", "pods", "", None, None, None),
    ("create", "events", "", "some-ns", None, None),
    ("create", "secrets", "", "some-ns", None, None),  # importProxy credentials, create only
    # importProxy.trustedCAProxy: read in its namespace, copied beside each import
    ("get", "configmaps", "", "cdi", "proxy-ca", None),
    ("create", "configmaps", "", "some-ns", None, None),
    ("update", "configmaps", "", "some-ns", "import-proxy-cm-dv", None),
    ("delete", "secrets", "", "some-ns", "cdi-upload-dv-tls", None),  # upload server cert
    ("create", "services", "", "some-ns", None, None),  # upload server Service
    ("delete", "services", "", "some-ns", "cdi-upload-dv", None),
    ("get", "secrets", "", "cdi", "cdi-uploadserver-ca", None),
    ("update", "secrets", "", "cdi", "cdi-uploadserver-client-ca", None),
    ("update", "secrets", "", "cdi", "cdi-controller-metrics-server-cert", None),
    ("update", "configmaps", "", "cdi", "cdi-controller-metrics-signer-bundle", None),
    ("list", "storageclasses", "storage.k8s.io", None, None, None),
    # a cross-namespace clone: its temporary claim, the PV it moves, the requester's rights
    ("delete", "persistentvolumeclaims", "", "some-ns", "tmp-pvc-x", None),
    ("patch", "persistentvolumes", "", None, "pv", None),
    ("create", "subjectaccessreviews", "authorization.k8s.io", None, None, None),
    ("create", "tokenreviews", "authentication.k8s.io", None, None, None),  # /metrics scrapers
    ("patch", "datasources", "cdi.kubevirt.io", "some-ns", "ds", None),
    ("watch", "storageprofiles", "cdi.kubevirt.io", None, None, None),
    ("get", "cdiconfigs", "cdi.kubevirt.io", None, "config", None),
    ("create", "leases", "coordination.k8s.io", "cdi", None, None),
    (
        "update",
        "leases",
        "coordination.k8s.io",
        "cdi",
        "cdi-controller-leader-election-helper",
        None,
    ),
]
CONTROLLER_MUST_NOT = [
    ("get", "configmaps", "", "some-ns", "x", None),  # tenants' ConfigMaps: mounted, never read
    ("get", "secrets", "", "some-ns", "x", None),
    ("update", "secrets", "", "some-ns", "x", None),
    ("list", "secrets", "", None, None, None),
    ("get", "secrets", "", "cdi", "cdi-api-signing-key", None),  # the token signing keys
    ("update", "datavolumes", "cdi.kubevirt.io", "some-ns", "dv", None),  # spec: users' only
    ("delete", "namespaces", "", None, "some-ns", None),
    ("delete", "persistentvolumes", "", None, "pvc-x", None),  # the provisioner's job
    ("create", "clusterrolebindings", "rbac.authorization.k8s.io", None, None, None),
    ("update", "leases", "coordination.k8s.io", "kube-system", "kube-scheduler", None),
    ("update", "leases", "coordination.k8s.io", "cdi", "someone-elses-lease", None),
    ("create", "pods", "", "some-ns", None, "exec"),
    ("delete", "persistentvolumes", "", None, "pv", None),
    ("update", "datasources", "cdi.kubevirt.io", "some-ns", "ds", None),  # spec: users' only
]
WEBHOOK_MAY = [
    ("get", "persistentvolumeclaims", "", "some-ns", "x", None),
    # a claim informer serves the existing-claim check of each create (docs/controller.md)
    ("list", "persistentvolumeclaims", "", None, None, None),
    ("watch", "persistentvolumeclaims", "", None, None, None),
    ("get", "datasources", "cdi.kubevirt.io", "some-ns", "x", None),
    ("get", "cdiconfigs", "cdi.kubevirt.io", None, "config", None),
    ("create", "secrets", "", "cdi", None, None),
    ("update", "secrets", "", "cdi", "cdi-webhook-certs", None),
    (
        "patch",
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        None,
        "cdi-datavolume-validator",
        None,
    ),
    (
        "patch",
        "mutatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        None,
        "cdi-datavolume-mutator",
        None,
    ),
]
WEBHOOK_MUST_NOT = [
    ("list", "secrets", "", "cdi", None, None),
    ("get", "secrets", "", "cdi", "some-other-secret", None),
    ("get", "secrets", "", "some-ns", "x", None),
    ("update", "secrets", "", "some-ns", "x", None),
    ("list", "secrets", "", None, None, None),
    (
        "patch",
        "validatingwebhookconfigurations",
        "admissionregistration.k8s.io",
        None,
        "someone-elses-webhook",
        None,
    ),
    ("create", "pods", "", "some-ns", None, None),
    ("update", "persistentvolumeclaims", "", "some-ns", "x", None),
    ("delete", "persistentvolumeclaims", "", "some-ns", "x", None),
    ("patch", "datavolumes", "cdi.kubevirt.io", "some-ns", "dv", None),
]


@pytest.mark.parametrize(
    ("sa", "checks", "expected"),
    [
        ("cdi-controller", CONTROLLER_MAY, True),
        ("cdi-controller", CONTROLLER_MUST_NOT, False),
        ("cdi-webhook", WEBHOOK_MAY, True),
        ("cdi-webhook", WEBHOOK_MUST_NOT, False),
    ],
    ids=["controller-may", "controller-must-not", "webhook-may", "webhook-must-not"],
)
def test_service_accounts_have_exactly_what_their_component_needs(
    kube: Kube, applied_rbac: None, sa: str, checks: list[tuple], expected: bool
) -> None:
    wrong = [c for c in checks if can(kube, sa, *c) != expected]
    assert not wrong, f"{sa} {'denied' if expected else 'allowed'}: {wrong}"
