"""The local node runs pods like a kubelet: environment and volumes from the API, pod IPs on
loopback, readiness probes, restarts under restartPolicy, SIGTERM on deletion, log files."""

from __future__ import annotations

import base64
import itertools
import os
import time
import urllib.request

import pytest

from testkit import pki
from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.helpers import pod_manifest, terminated, wait_gone, wait_pod_phase

pytestmark = pytest.mark.integration


def test_env_and_volumes_come_from_secrets_configmaps_and_the_downward_api(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    kube.create(
        ns_path(namespace, "secrets"),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "creds"},
            "stringData": {"accessKeyId": "AKID", "secretKey": "s3cr3t"},
        },
    )
    kube.create(
        ns_path(namespace, "configmaps"),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"MODE": "fast", "config.ini": "[x]\ny=1\n"},
        },
    )
    script = (
        'echo "key=$ACCESS_KEY mode=$MODE pod=$POD_NAME ns=$POD_NS ip=$POD_IP greet=$GREETING";'
        " echo pwd=$(pwd); cat /etc/creds/secretKey; echo; cat /etc/settings/config.ini;"
        " cat /etc/podinfo/labels; echo; ls /var/run/secrets/kubernetes.io/serviceaccount;"
        " echo host=$(cat /proc/sys/kernel/hostname) env-host=$HOSTNAME"
    )
    pod = pod_manifest(
        "envy",
        script,
        env=[
            {
                "name": "ACCESS_KEY",
                "valueFrom": {"secretKeyRef": {"name": "creds", "key": "accessKeyId"}},
            },
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "GREETING", "value": "hello-$(POD_NAME)"},
        ],
        envFrom=[{"configMapRef": {"name": "settings"}}],
        workingDir="/work-dir-testkit",
        volumes=[
            {"name": "creds", "secret": {"secretName": "creds"}},
            {
                "name": "settings",
                "configMap": {
                    "name": "settings",
                    "items": [{"key": "config.ini", "path": "config.ini"}],
                },
            },
            {
                "name": "podinfo",
                "downwardAPI": {
                    "items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]
                },
            },
            {"name": "scratch", "emptyDir": {}},
        ],
        mounts=[
            {"name": "creds", "mountPath": "/etc/creds", "readOnly": True},
            {"name": "settings", "mountPath": "/etc/settings"},
            {"name": "podinfo", "mountPath": "/etc/podinfo"},
            {"name": "scratch", "mountPath": "/work-dir-testkit"},
        ],
    )
    pod["metadata"]["labels"] = {"app": "envy"}
    kube.create(ns_path(namespace, "pods"), pod)
    done = wait_pod_phase(kube, namespace, "envy", ("Succeeded", "Failed"))
    out = cluster.container_log(namespace, "envy", "main")
    assert done["status"]["phase"] == "Succeeded", out
    ip = done["status"]["podIP"]
    assert f"key=AKID mode=fast pod=envy ns={namespace} ip={ip} greet=hello-envy" in out
    assert "pwd=/work-dir-testkit" in out
    assert "s3cr3t" in out and "y=1" in out and 'app="envy"' in out
    assert "token" in out and "ca.crt" in out  # projected service-account volume
    assert "host=envy env-host=envy" in out  # its own UTS namespace, named like the pod
    assert os.uname().nodename != "envy"  # ... and the host's name is untouched


def test_read_only_root_filesystem_leaves_only_the_volumes_writable(
    cluster: Cluster, kube: Kube, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """As under a kubelet: a container with readOnlyRootFilesystem cannot write the host's
    files (the process node once let an importer make /scratch on the host), only its volumes."""
    host_dir = tmp_path_factory.mktemp("ro-root")  # on the host's root filesystem
    script = (
        f"touch {host_dir}/planted && echo wrote-host || echo host-refused;"
        " touch /data/ok && echo wrote-volume"
    )
    pod = pod_manifest(
        "readonly",
        script,
        securityContext={"readOnlyRootFilesystem": True},
        volumes=[{"name": "data", "emptyDir": {}}],
        mounts=[{"name": "data", "mountPath": "/data"}],
    )
    kube.create(ns_path(namespace, "pods"), pod)
    done = wait_pod_phase(kube, namespace, "readonly", ("Succeeded", "Failed"))
    out = cluster.container_log(namespace, "readonly", "main")
    assert done["status"]["phase"] == "Succeeded", out
    assert "host-refused" in out and "wrote-volume" in out
    assert not (host_dir / "planted").exists()
    assert os.access(host_dir, os.W_OK)  # read-only in the pod's namespace only


def test_readiness_probe_gates_ready_and_deletion_sends_sigterm(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    # A server on the pod IP, ready only once /tmp/ready-<pod> exists in its mount namespace.
    script = (
        "trap 'echo got SIGTERM; exit 0' TERM; "
        "python3 -m http.server --bind $POD_IP 8080 >/dev/null 2>&1 & "
        "while true; do sleep 0.2; done"
    )
    pod = pod_manifest(
        "server",
        script,
        restart_policy="Always",
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        ports=[{"name": "http", "containerPort": 8080}],
        readinessProbe={"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
    )
    kube.create(ns_path(namespace, "pods"), pod)
    path = ns_path(namespace, "pods", "server")

    def ready() -> dict | None:
        p = kube.get(path)
        conds = {c["type"]: c["status"] for c in p["status"].get("conditions") or []}
        return p if conds.get("Ready") == "True" else None

    p = wait_until(ready, "server pod Ready", 60)
    assert p["status"]["phase"] == "Running"
    assert p["status"]["containerStatuses"][0]["ready"] is True
    t0 = time.monotonic()
    kube.delete(path)
    wait_gone(kube, path, 30)
    assert time.monotonic() - t0 < 5  # exited on SIGTERM, not killed after the grace period
    assert "got SIGTERM" in cluster.container_log(namespace, "server", "main")


def test_failing_container_restarts_under_on_failure_and_reports_exit_codes(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    # Fails twice (exit 7), then succeeds; the count survives restarts in an emptyDir.
    script = (
        "n=$(cat /state/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /state/n; "
        'echo "attempt $n"; [ $n -ge 3 ] || exit 7'
    )
    kube.create(
        ns_path(namespace, "pods"),
        pod_manifest(
            "flaky",
            script,
            restart_policy="OnFailure",
            volumes=[{"name": "state", "emptyDir": {}}],
            mounts=[{"name": "state", "mountPath": "/state"}],
        ),
    )
    pod = wait_pod_phase(kube, namespace, "flaky", ("Succeeded", "Failed"), timeout=90)
    status = pod["status"]["containerStatuses"][0]
    assert pod["status"]["phase"] == "Succeeded"
    assert status["restartCount"] == 2
    assert status["lastState"]["terminated"]["exitCode"] == 7
    assert terminated(pod)["exitCode"] == 0
    log = cluster.container_log(namespace, "flaky", "main")
    assert log.splitlines() == ["attempt 1", "attempt 2", "attempt 3"]


def test_never_restart_pod_fails_with_exit_code_and_log_fallback_message(
    kube: Kube, namespace: str
) -> None:
    kube.create(
        ns_path(namespace, "pods"),
        pod_manifest(
            "broken",
            "echo something went wrong; exit 42",
            terminationMessagePolicy="FallbackToLogsOnError",
        ),
    )
    pod = wait_pod_phase(kube, namespace, "broken", ("Succeeded", "Failed"))
    state = terminated(pod)
    assert pod["status"]["phase"] == "Failed"
    assert state["exitCode"] == 42 and state["reason"] == "Error"
    assert state["message"].strip() == "something went wrong"


def test_service_cluster_ip_forwards_to_a_ready_pod(kube: Kube, namespace: str) -> None:
    script = (
        "echo hello-from-pod > /srv/index.html; exec python3 -m http.server -d /srv "
        "--bind $POD_IP 8080"
    )
    pod = pod_manifest(
        "web",
        script,
        restart_policy="Always",
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        ports=[{"name": "http", "containerPort": 8080}],
        readinessProbe={"tcpSocket": {"port": 8080}, "periodSeconds": 1},
        volumes=[{"name": "srv", "emptyDir": {}}],
        mounts=[{"name": "srv", "mountPath": "/srv"}],
    )
    pod["metadata"]["labels"] = {"app": "web"}
    kube.create(ns_path(namespace, "pods"), pod)
    svc = kube.create(
        ns_path(namespace, "services"),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": "http"}]},
        },
    )
    ip = svc["spec"]["clusterIP"]
    assert ip.startswith("127.")

    def fetch() -> str | None:
        try:
            with urllib.request.urlopen(f"http://{ip}:80/index.html", timeout=2) as resp:
                return resp.read().decode()
        except OSError:
            return None

    assert wait_until(fetch, "the Service to answer", 60) == "hello-from-pod\n"


def test_init_containers_run_first_and_liveness_failure_restarts_the_container(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    pod = pod_manifest(
        "lively",
        # Alive only while /shared/alive exists; the first run removes it after a moment.
        "cat /shared/from-init; n=$(cat /shared/n 2>/dev/null || echo 0); "
        "echo $((n+1)) > /shared/n; touch /shared/alive; "
        "if [ $n -eq 0 ]; then (sleep 2; rm /shared/alive) & fi; "
        "while true; do sleep 0.2; done",
        restart_policy="Always",
        volumes=[{"name": "shared", "emptyDir": {}}],
        mounts=[{"name": "shared", "mountPath": "/shared"}],
        livenessProbe={
            "exec": {"command": ["test", "-e", "/shared/alive"]},
            "periodSeconds": 1,
            "failureThreshold": 2,
            "initialDelaySeconds": 1,
        },
    )
    pod["spec"]["initContainers"] = [
        {
            "name": "prepare",
            "image": "busybox",
            "command": ["sh", "-c", "echo prepared > /shared/from-init"],
            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
        }
    ]
    kube.create(ns_path(namespace, "pods"), pod)
    path = ns_path(namespace, "pods", "lively")

    def restarted() -> dict | None:
        p = kube.get(path)
        statuses = p["status"].get("containerStatuses") or []
        ok = statuses and statuses[0]["restartCount"] >= 1 and "running" in statuses[0]["state"]
        return p if ok else None

    p = wait_until(restarted, "a liveness restart", 60)
    init = p["status"]["initContainerStatuses"][0]
    assert init["state"]["terminated"]["exitCode"] == 0
    assert p["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 137
    wait_until(
        lambda: cluster.container_log(namespace, "lively", "main").count("prepared") == 2,
        "the restarted container's log",
        10,
    )


WEBHOOK_SERVER = """
import json, os, ssl
from http.server import BaseHTTPRequestHandler, HTTPServer

class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["request"]
        labels = req["object"]["metadata"].get("labels") or {}
        resp = {"uid": req["uid"], "allowed": labels.get("reject") != "yes",
                "status": {"code": 403, "message": "pod webhook says no"}}
        body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "response": resp}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

server = HTTPServer((os.environ["POD_IP"], 8443), Hook)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain("/certs/tls.crt", "/certs/tls.key")
server.socket = ctx.wrap_socket(server.socket, server_side=True)
server.serve_forever()
"""


def test_service_webhook_served_by_a_pod_is_reached_through_its_cluster_ip(
    kube: Kube, namespace: str
) -> None:
    ca = pki.CertificateAuthority("pod-webhook-ca")
    pair = ca.issue("hook", dns_names=(f"hook.{namespace}.svc",))
    kube.create(
        ns_path(namespace, "secrets"),
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hook-tls"},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(pair.cert_pem).decode(),
                "tls.key": base64.b64encode(pair.key_pem).decode(),
            },
        },
    )
    pod = pod_manifest(
        "hook",
        "",
        restart_policy="Always",
        image="python:3.12",
        command=["python3", "-c", WEBHOOK_SERVER],
        env=[{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        readinessProbe={"tcpSocket": {"port": 8443}, "periodSeconds": 1},
        volumes=[{"name": "certs", "secret": {"secretName": "hook-tls"}}],
        mounts=[{"name": "certs", "mountPath": "/certs", "readOnly": True}],
    )
    pod["metadata"]["labels"] = {"app": "hook"}
    kube.create(ns_path(namespace, "pods"), pod)
    kube.create(
        ns_path(namespace, "services"),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "hook"},
            "spec": {"selector": {"app": "hook"}, "ports": [{"port": 443, "targetPort": 8443}]},
        },
    )
    name = f"pod-hook-{namespace}"
    path = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    kube.create(
        path,
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "hook.testkit.local",
                    "clientConfig": {
                        "service": {
                            "name": "hook",
                            "namespace": namespace,
                            "path": "/validate",
                            "port": 443,
                        },
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
        counter = itertools.count()

        def rejected() -> str | None:
            try:
                kube.create(
                    cms,
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "metadata": {"name": f"c{next(counter)}", "labels": {"reject": "yes"}},
                    },
                )
            except ApiError as e:
                return str(e) if "pod webhook says no" in str(e) else None
            return None

        assert "pod webhook says no" in wait_until(rejected, "the pod webhook to reject", 60)
        kube.create(
            cms, {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "accepted"}}
        )
    finally:
        kube.delete_ignore_missing(f"{path}/{name}")


def test_container_ignoring_sigterm_is_killed_after_the_grace_period(
    kube: Kube, namespace: str
) -> None:
    pod = pod_manifest(
        "stubborn",
        "trap '' TERM; echo started; while true; do sleep 0.2; done",
        restart_policy="Always",
    )
    pod["spec"]["terminationGracePeriodSeconds"] = 6  # room for a loaded CI machine
    kube.create(ns_path(namespace, "pods"), pod)
    wait_pod_phase(kube, namespace, "stubborn", ("Running",))
    path = ns_path(namespace, "pods", "stubborn")
    t0 = time.monotonic()
    kube.delete(path)
    time.sleep(1)
    assert kube.get_or_none(path) is not None  # still terminating: SIGTERM was ignored
    wait_gone(kube, path, 30)
    assert 6 <= time.monotonic() - t0 < 20
