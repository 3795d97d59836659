"""deploy/15-admission-policy.yaml on the real API server: the controller's ServiceAccount may
create the pods the controller renders and nothing else (other images, hostPath, host
namespaces, privileged containers), while other users' pods are not the policy's business.

Requests are made with ``kubectl --as=system:serviceaccount:cdi:cdi-controller`` and a
server-side dry run: authentication aside, the API server handles them exactly as the
controller's own (RBAC, then admission, ValidatingAdmissionPolicy included), and nothing runs.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from testkit.product import Kubectl, KubectlFailed, Product
from testkit.waiting import wait_until
from tests.worker_pods import IMPORTER_IMAGE, NODE_PULL_SOURCE, importer_pod, worker_pods

pytestmark = pytest.mark.integration

CONTROLLER_SA = "system:serviceaccount:cdi:cdi-controller"


def _create(kubectl: Kubectl, pod: dict[str, Any], user: str | None = CONTROLLER_SA) -> str:
    """'' when admitted, else the API server's refusal."""
    args = ["create", "--dry-run=server", "-o", "name", "-f", "-"]
    try:
        kubectl(*([f"--as={user}"] if user else []), *args, stdin=json.dumps(pod))
    except KubectlFailed as e:
        return str(e)
    return ""


def _variant(pod: dict[str, Any], change: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    spec, container = out["spec"], out["spec"]["containers"][0]
    if change == "hostPath":
        spec["volumes"].append({"name": "host", "hostPath": {"path": "/"}})
        container["volumeMounts"].append({"name": "host", "mountPath": "/host"})
    elif change == "image":
        container["image"] = "quay.io/cdi-py/cdi-importer-evil:latest"
    elif change == "privileged":
        container["securityContext"] = {"privileged": True}
    elif change == "hostNetwork":
        spec["hostNetwork"] = True
    elif change == "hostPID":
        spec["hostPID"] = True
    elif change == "capabilities":
        container["securityContext"]["capabilities"] = {"add": ["SYS_ADMIN"]}
    elif change == "initContainer":
        spec["initContainers"] = [{"name": "i", "image": "docker.io/library/busybox:1"}]
    elif change == "privilegedInitContainer":
        init = {"name": "i", "image": IMPORTER_IMAGE, "securityContext": {"privileged": True}}
        spec["initContainers"] = [init]
    elif change == "serviceAccountToken":
        spec["automountServiceAccountToken"] = True
    return out


def test_the_controller_may_create_its_importer_pod_but_not_a_hostpath_pod(
    product: Product, namespace: str
) -> None:
    pod = importer_pod(namespace)
    # The policy takes effect once the API server has loaded it: wait for the first refusal.
    wait_until(
        lambda: _create(product.kubectl, _variant(pod, "hostPath")) != "",
        "the admission policy to refuse a hostPath pod",
        30,
    )
    refused = _create(product.kubectl, _variant(pod, "hostPath"))
    assert "cdi-controller-pods" in refused and "persistentVolumeClaim" in refused, refused
    assert _create(product.kubectl, pod) == ""


@pytest.mark.parametrize(
    "change",
    [
        "image",
        "privileged",
        "hostNetwork",
        "hostPID",
        "capabilities",
        "initContainer",
        "privilegedInitContainer",
        "serviceAccountToken",
    ],
)
def test_the_controller_may_not_create_pods_beyond_what_it_renders(
    product: Product, namespace: str, change: str
) -> None:
    pod = importer_pod(namespace)
    wait_until(lambda: _create(product.kubectl, pod) == "", "the importer pod admitted", 30)
    refused = _create(product.kubectl, _variant(pod, change))
    assert "cdi-controller-pods" in refused, (change, refused)


def test_other_users_pods_are_not_the_policys_business(product: Product, namespace: str) -> None:
    pod = _variant(importer_pod(namespace), "image")
    assert _create(product.kubectl, pod, user=None) == ""  # the admin


def _server_variant(pod: dict[str, Any], change: str) -> dict[str, Any]:
    """A node-pull pod whose containerDisk container (the arbitrary image) asks for more."""
    out = copy.deepcopy(pod)
    server = out["spec"]["containers"][0]
    assert server["name"] == "server"
    if change == "command":
        server["command"] = ["/bin/sh", "-c", "cat /etc/shadow"]
    elif change == "args":
        server["args"] = ["--evil"]
    elif change == "env":
        secret = {"secretKeyRef": {"name": "creds", "key": "secretKey"}}
        server["env"] = [{"name": "S", "valueFrom": secret}]
    elif change == "pvcMount":
        server["volumeMounts"].append({"name": "cdi-data-vol", "mountPath": "/data"})
    elif change == "sharedIsNotEmptyDir":
        server["volumeMounts"] = [{"name": "cdi-data-vol", "mountPath": "/shared"}]
    elif change == "privileged":
        server["securityContext"] = {"privileged": True}
    elif change == "otherName":
        server["name"] = "sidecar"
    return out


def test_the_controller_may_create_a_node_pullimporter_pod(
    product: Product, namespace: str
) -> None:
    """The tenant's image runs only as the holder, with nothing but the shared emptyDir."""
    pod = importer_pod(namespace, NODE_PULL_SOURCE)
    assert pod["spec"]["containers"][0]["image"] == "quay.io/tenant/disk:v1"
    wait_until(lambda: _create(product.kubectl, pod) == "", "the node-pull pod admitted", 30)


@pytest.mark.parametrize(
    "change",
    ["command", "args", "env", "pvcMount", "sharedIsNotEmptyDir", "privileged", "otherName"],
)
def test_the_node_pull_container_may_not_ask_for_more(
    product: Product, namespace: str, change: str
) -> None:
    pod = importer_pod(namespace, NODE_PULL_SOURCE)
    wait_until(lambda: _create(product.kubectl, pod) == "", "the node-pull pod admitted", 30)
    refused = _create(product.kubectl, _server_variant(pod, change))
    assert "cdi-controller-pods" in refused, (change, refused)


# -- N9: command, environment, security context and Secrets are the renderers' -----------------


@pytest.mark.parametrize(
    "kind",
    [
        "importer",
        "importer-default-command",
        "importer-block",
        "size-detection",
        "node-pull",
        "poller",
        "upload",
        "upload-block",
        "clone-source",
        "clone-source-block",
    ],
)
def test_every_rendered_worker_pod_is_admitted(product: Product, namespace: str, kind: str) -> None:
    pod = worker_pods(namespace)[kind]
    wait_until(lambda: _create(product.kubectl, importer_pod(namespace)) == "", "admission", 30)
    assert _create(product.kubectl, pod) == ""


def _reviewers_pod() -> dict[str, Any]:
    """N9's reproduction: a worker image running any code, as root, unconfined, with a Secret
    of kube-system mounted."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "not-a-worker", "namespace": "kube-system"},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "securityContext": {"runAsUser": 0, "seccompProfile": {"type": "Unconfined"}},
            "containers": [
                {
                    "name": "c",
                    "image": IMPORTER_IMAGE,
                    "command": ["python", "-c", "print(open('/s/token').read())"],
                    "securityContext": {"allowPrivilegeEscalation": True},
                    "volumeMounts": [{"name": "s", "mountPath": "/s"}],
                }
            ],
            "volumes": [{"name": "s", "secret": {"secretName": "bootstrap-token-abcdef"}}],
        },
    }


def test_the_reviewers_root_pod_reading_a_kube_system_secret_is_refused(
    product: Product, namespace: str
) -> None:
    pod = importer_pod(namespace)
    wait_until(lambda: _create(product.kubectl, pod) == "", "the importer pod admitted", 30)
    refused = _create(product.kubectl, _reviewers_pod())
    assert "cdi-controller-pods" in refused, refused


def _worker_variant(pod: dict[str, Any], change: str) -> dict[str, Any]:
    """The rendered importer pod with one thing a worker never asks for."""
    out = copy.deepcopy(pod)
    spec = out["spec"]
    c = next(c for c in spec["containers"] if c["name"] == "importer")
    changes = {
        "command": lambda: c.update(command=["python", "-c", "import os; os.system('id')"]),
        "args": lambda: c.update(args=["-c", "print(1)"]),
        "workingDir": lambda: c.update(workingDir="/data"),
        "pythonPath": lambda: c["env"].append({"name": "PYTHONPATH", "value": "/data"}),
        "home": lambda: c["env"].append({"name": "HOME", "value": "/data"}),
        "ldPreload": lambda: c["env"].append({"name": "LD_PRELOAD", "value": "/data/x.so"}),
        "envFromSecret": lambda: c["env"].append(
            {"name": "IMPORTER_ENDPOINT", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
        ),
        "envFrom": lambda: c.update(envFrom=[{"secretRef": {"name": "s"}}]),
        "postStart": lambda: c.update(
            lifecycle={"postStart": {"exec": {"command": ["/bin/sh", "-c", "id"]}}}
        ),
        "execProbe": lambda: c.update(livenessProbe={"exec": {"command": ["/bin/sh"]}}),
        "runAsRoot": lambda: spec["securityContext"].update(runAsUser=0, runAsNonRoot=False),
        "containerRoot": lambda: c["securityContext"].update(runAsUser=0, runAsNonRoot=False),
        "unconfined": lambda: spec["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "containerUnconfined": lambda: c["securityContext"].update(
            seccompProfile={"type": "Unconfined"}
        ),
        "escalation": lambda: c["securityContext"].update(allowPrivilegeEscalation=True),
        "writableRoot": lambda: c["securityContext"].update(readOnlyRootFilesystem=False),
        "keepCapabilities": lambda: c["securityContext"].pop("capabilities"),
        "seLinux": lambda: spec["securityContext"].update(seLinuxOptions={"type": "spc_t"}),
        "sysctls": lambda: spec["securityContext"].update(
            sysctls=[{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}]
        ),
        "rootGroup": lambda: spec["securityContext"].update(supplementalGroups=[0]),
        "unmaskedProc": lambda: (
            spec.update(hostUsers=False),
            c["securityContext"].update(procMount="Unmasked"),
        ),
        "otherSecret": lambda: (
            spec["volumes"].append({"name": "s", "secret": {"secretName": "default-token"}}),
            c["volumeMounts"].append({"name": "s", "mountPath": "/s", "readOnly": True}),
        ),
        "secretAsUploadTls": lambda: (
            spec["volumes"].append(
                {"name": "cdi-upload-tls", "secret": {"secretName": "default-token"}}
            ),
        ),
        "secretRefAllKeys": lambda: next(
            v for v in spec["volumes"] if v["name"] == "cdi-auth-secret-vol"
        )["secret"].pop("items"),
        "headerSecretElsewhere": lambda: next(
            m for m in c["volumeMounts"] if m["name"] == "cdi-secret-extra-headers-vol-0"
        ).update(mountPath="/tmp/h"),
        "serviceAccountToken": lambda: spec.pop("automountServiceAccountToken"),
    }
    changes[change]()
    return out


N9_CHANGES = [
    "command",
    "args",
    "workingDir",
    "pythonPath",
    "home",
    "ldPreload",
    "envFromSecret",
    "envFrom",
    "postStart",
    "execProbe",
    "runAsRoot",
    "containerRoot",
    "unconfined",
    "containerUnconfined",
    "escalation",
    "writableRoot",
    "keepCapabilities",
    "seLinux",
    "sysctls",
    "rootGroup",
    "unmaskedProc",
    "otherSecret",
    "secretAsUploadTls",
    "secretRefAllKeys",
    "headerSecretElsewhere",
    "serviceAccountToken",
]


def test_the_controller_may_not_run_its_images_beyond_what_it_renders(
    product: Product, namespace: str
) -> None:
    """One pod per change (a dry run each): every one is refused by the policy."""
    pod = worker_pods(namespace)["importer"]
    wait_until(lambda: _create(product.kubectl, pod) == "", "the importer pod admitted", 30)
    admitted = [
        change
        for change in N9_CHANGES
        if "cdi-controller-pods" not in _create(product.kubectl, _worker_variant(pod, change))
    ]
    assert admitted == []
