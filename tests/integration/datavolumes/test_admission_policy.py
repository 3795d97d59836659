"""deploy/15-admission-policy.yaml on the real API server: the controller's ServiceAccount may
create the pods the controller renders and nothing else (other images, hostPath, host
namespaces, privileged containers), while other users' pods are not the policy's business.

Requests are made with ``kubectl --as=system:serviceaccount:cdi:cdi-controller`` and a
server-side dry run: authentication aside, the API server handles them exactly as the
controller's own (RBAC, then admission, ValidatingAdmissionPolicy included), and nothing runs.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from cdi.api.types import DataVolume
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from testkit.product import Kubectl, KubectlFailed, Product
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration

CONTROLLER_SA = "system:serviceaccount:cdi:cdi-controller"
IMPORTER_IMAGE = "quay.io/cdi-py/cdi-importer:latest"  # the controller's --importer-image


HTTP_SOURCE = {"http": {"url": "http://127.0.0.1:9/disk.img"}}
NODE_PULL_SOURCE = {"registry": {"url": "docker://quay.io/tenant/disk:v1", "pullMethod": "node"}}


def _importer_pod(namespace: str, source: dict[str, Any] = HTTP_SOURCE) -> dict[str, Any]:
    dv = DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": namespace, "uid": "dv-uid"},
            "spec": {
                "source": source,
                "pvc": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        }
    )
    pvc = {
        "metadata": {"name": "disk", "namespace": namespace, "uid": "pvc-uid"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    config = ImporterPodConfig(
        image=IMPORTER_IMAGE, scratch_pvc_name="disk-scratch", proxy_auth_secret="proxy-auth"
    )
    return render_importer_pod(dv, pvc, config)


def _create(kubectl: Kubectl, pod: dict[str, Any], user: str | None = CONTROLLER_SA) -> str:
    """'' when admitted, else the API server's refusal."""
    args = ["create", "--dry-run=server", "-o", "name", "-f", "-"]
    try:
        kubectl(*([f"--as={user}"] if user else []), *args, stdin=yaml.safe_dump(pod))
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
    pod = _importer_pod(namespace)
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
    pod = _importer_pod(namespace)
    wait_until(lambda: _create(product.kubectl, pod) == "", "the importer pod admitted", 30)
    refused = _create(product.kubectl, _variant(pod, change))
    assert "cdi-controller-pods" in refused, (change, refused)


def test_other_users_pods_are_not_the_policys_business(product: Product, namespace: str) -> None:
    pod = _variant(_importer_pod(namespace), "image")
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


def test_the_controller_may_create_a_node_pull_importer_pod(
    product: Product, namespace: str
) -> None:
    """The tenant's image runs only as the holder, with nothing but the shared emptyDir."""
    pod = _importer_pod(namespace, NODE_PULL_SOURCE)
    assert pod["spec"]["containers"][0]["image"] == "quay.io/tenant/disk:v1"
    wait_until(lambda: _create(product.kubectl, pod) == "", "the node-pull pod admitted", 30)


@pytest.mark.parametrize(
    "change",
    ["command", "args", "env", "pvcMount", "sharedIsNotEmptyDir", "privileged", "otherName"],
)
def test_the_node_pull_container_may_not_ask_for_more(
    product: Product, namespace: str, change: str
) -> None:
    pod = _importer_pod(namespace, NODE_PULL_SOURCE)
    wait_until(lambda: _create(product.kubectl, pod) == "", "the node-pull pod admitted", 30)
    refused = _create(product.kubectl, _server_variant(pod, change))
    assert "cdi-controller-pods" in refused, (change, refused)
