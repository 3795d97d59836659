"""Acceptance tests of the real control plane: version, CRD schemas, RBAC, SubjectAccessReview
and admission webhooks, all answered by the kube-apiserver built from hack/kube."""

from __future__ import annotations

import json
import re
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from testkit import pki
from testkit.cluster import Cluster
from testkit.kubeclient import JSON, ApiError, Kube, ns_path
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TEST_CRD = Path(__file__).parent / "data" / "widget-crd.yaml"


def test_api_server_reports_the_release_built_from_go_modules(kube: Kube) -> None:
    go_mod = (REPO / "hack" / "kube" / "k8s" / "go.mod").read_text()
    release = re.search(r"k8s\.io/kubernetes (v[0-9.]+)", go_mod)
    assert release is not None
    version = kube.get("/version")
    assert version["gitVersion"] == release.group(1)
    assert version["major"] == "1"


def _crd_files() -> list[Path]:
    return [*sorted((REPO / "crds").glob("*.yaml")), TEST_CRD]


def _apply_crd(kube: Kube, doc: JSON) -> JSON:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    try:
        kube.create(path, doc)
    except ApiError as e:
        if not e.conflict:
            raise

    def established() -> JSON | None:
        crd = kube.get(f"{path}/{doc['metadata']['name']}")
        conds = crd.get("status", {}).get("conditions") or []
        ok = any(c["type"] == "Established" and c["status"] == "True" for c in conds)
        return crd if ok else None

    return wait_until(established, f"CRD {doc['metadata']['name']} established", 30)


@pytest.mark.parametrize("crd_file", _crd_files(), ids=lambda p: p.name)
def test_crd_is_served_and_rejects_schema_violations(
    kube: Kube, namespace: str, crd_file: Path
) -> None:
    for doc in yaml.safe_load_all(crd_file.read_text()):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        crd = _apply_crd(kube, doc)
        group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        base = f"/apis/{group}/{version['name']}"
        scoped = crd["spec"]["scope"] == "Namespaced"
        path = f"{base}/namespaces/{namespace}/{plural}" if scoped else f"{base}/{plural}"
        items = kube.get(path)["items"]  # the new resource is served
        # cluster-scoped CDI objects (StorageProfiles, the CDIConfig) may already exist: the
        # DataVolume tests' controller keeps them; a fresh namespace has none of its own kinds
        assert items == [] or not scoped
        bad = {
            "apiVersion": f"{group}/{version['name']}",
            "kind": crd["spec"]["names"]["kind"],
            "metadata": {"name": "violates-schema"},
            "spec": 42,  # every schema here declares spec an object
        }
        with pytest.raises(ApiError) as err:
            kube.create(path, bad)
        assert err.value.status == 422
        assert err.value.reason == "Invalid"


def test_widget_schema_checks_fields_and_accepts_valid_objects(kube: Kube, namespace: str) -> None:
    _apply_crd(kube, yaml.safe_load(TEST_CRD.read_text()))
    path = f"/apis/testkit.example.com/v1/namespaces/{namespace}/widgets"

    def widget(name: str, spec: JSON) -> JSON:
        return {
            "apiVersion": "testkit.example.com/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": spec,
        }

    with pytest.raises(ApiError) as err:
        kube.create(path, widget("zero", {"size": 0, "colour": "mauve"}))
    message = str(err.value)
    assert err.value.status == 422
    assert "spec.size" in message and "spec.colour" in message
    created = kube.create(path, widget("ok", {"size": 3, "colour": "red"}))
    assert created["spec"] == {"size": 3, "colour": "red"}


def test_unprivileged_token_is_refused_and_subject_access_review_agrees(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    alice = client.CoreV1Api(cluster.api_client("alice"))
    with pytest.raises(client.ApiException) as err:
        alice.list_namespaced_secret(namespace)
    assert err.value.status == 403

    def review(user: str, verb: str, resource: str) -> bool:
        groups = ["system:masters"] if user == "admin" else ["testkit:users"]
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": [*groups, "system:authenticated"],
                "resourceAttributes": {"namespace": namespace, "verb": verb, "resource": resource},
            },
        }
        resp = kube.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", body)
        return bool(resp["status"]["allowed"])

    assert review("alice", "list", "secrets") is False
    assert review("admin", "list", "secrets") is True

    # Grant alice read access to pods only: RBAC and the review change together.
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    kube.create(
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "alice-reads-pods"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}
            ],
        },
    )
    wait_until(lambda: review("alice", "list", "pods"), "RBAC grant to reach the authorizer")
    assert alice.list_namespaced_pod(namespace).items == []
    assert review("alice", "list", "secrets") is False
    assert review("bob", "list", "pods") is False
    bob = Kube.from_kubeconfig(cluster.kubeconfig_for("bob"))
    with pytest.raises(ApiError) as bob_err:
        bob.get(ns_path(namespace, "pods"))
    assert bob_err.value.status == 403


class _Webhook:
    """A validating admission webhook on loopback: rejects ConfigMaps labelled reject=yes."""

    def __init__(self, ca: pki.CertificateAuthority, tmp: Path) -> None:
        self.calls: list[JSON] = []
        calls = self.calls

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                review = json.loads(body)
                req = review["request"]
                calls.append(req)
                labels = (req.get("object") or {}).get("metadata", {}).get("labels") or {}
                response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
                if labels.get("reject") == "yes":
                    response = {
                        "uid": req["uid"],
                        "allowed": False,
                        "status": {"code": 403, "message": "testkit webhook says no"},
                    }
                out = json.dumps(
                    {
                        "apiVersion": "admission.k8s.io/v1",
                        "kind": "AdmissionReview",
                        "response": response,
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        pair = ca.issue("webhook", ips=("127.0.0.1",), dns_names=("localhost",))
        cert, key = pair.write(tmp / "webhook.crt", tmp / "webhook.key")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook(tmp_path: Path) -> Iterator[tuple[_Webhook, pki.CertificateAuthority]]:
    ca = pki.CertificateAuthority("webhook-ca")
    hook = _Webhook(ca, tmp_path)
    yield hook, ca
    hook.close()


def test_validating_webhook_on_loopback_is_called_and_can_reject(
    kube: Kube, namespace: str, webhook: tuple[_Webhook, pki.CertificateAuthority]
) -> None:
    import base64

    hook, ca = webhook
    name = f"testkit-{namespace}"
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    kube.create(
        path,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "configmaps.testkit.local",
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{hook.port}/validate",
                        "caBundle": base64.b64encode(ca.cert_pem).decode(),
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 5,
                }
            ],
        },
    )
    try:
        cms = ns_path(namespace, "configmaps")
        counter = iter(range(1000))

        def accepted_after_a_call() -> bool:
            kube.create(
                cms,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"probe-{next(counter)}"},
                },
            )
            return any(c["namespace"] == namespace for c in hook.calls)

        wait_until(accepted_after_a_call, "the API server to call the webhook", 30)
        call = hook.calls[-1]
        assert call["kind"]["kind"] == "ConfigMap" and call["operation"] == "CREATE"
        assert call["userInfo"]["username"] == "admin"

        with pytest.raises(ApiError) as err:
            kube.create(
                cms,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "rejected", "labels": {"reject": "yes"}},
                },
            )
        assert err.value.status == 403
        assert "testkit webhook says no" in str(err.value)
        assert kube.get_or_none(ns_path(namespace, "configmaps", "rejected")) is None
    finally:
        kube.delete_ignore_missing(f"{path}/{name}")
