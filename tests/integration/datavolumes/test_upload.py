"""Upload end to end on the real control plane with the product installed from deploy/: the
controller's upload flavour runs the upload server pod (``uploader/``), a user gets a token
from the kube-apiserver (``UploadTokenRequest`` with the user's own credentials, through
aggregation to our token API) and POSTs the image through the deployed upload proxy, which
relays it over mutual TLS to the pod. Bytes are compared with ``qemu-img convert``'s."""

from __future__ import annotations

import asyncio
import os
import signal
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    condition,
    datavolume,
    dv_path,
    event_reasons,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)

pytestmark = pytest.mark.integration
PROXY_NAME = "cdi-uploadproxy.cdi.svc"
TOKEN_API = "/apis/upload.cdi.kubevirt.io/v1beta1/namespaces/{ns}/uploadtokenrequests"
RBAC = "/apis/rbac.authorization.k8s.io/v1"
ANN = "cdi.kubevirt.io/storage."


def pvc_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/persistentvolumeclaims" + (f"/{name}" if name else "")


def annotations(kube: Kube, ns: str, pvc: str) -> dict[str, str]:
    return dict(kube.get(pvc_path(ns, pvc))["metadata"].get("annotations") or {})


class User:
    """A tenant (``alice``, bound to ``edit`` in the namespace): tokens through the
    kube-apiserver with her own credentials, uploads through the deployed proxy."""

    def __init__(self, cluster: Cluster, admin: Kube, namespace: str) -> None:
        self.kube, self.admin, self.namespace = cluster.kube("alice"), admin, namespace
        admin.create(
            f"{RBAC}/namespaces/{namespace}/rolebindings",
            {
                "metadata": {"name": "alice-edit"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "edit",
                },
                "subjects": [
                    {"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}
                ],
            },
        )

    def token(self, pvc: str) -> str:
        body = {
            "apiVersion": "upload.cdi.kubevirt.io/v1beta1",
            "kind": "UploadTokenRequest",
            "metadata": {"generateName": "token-for-test-"},
            "spec": {"pvcName": pvc},
        }

        def issued() -> str | None:
            try:
                answer = self.kube.create(TOKEN_API.format(ns=self.namespace), body)
            except ApiError as e:
                if e.status == 403:  # the edit role aggregates our rule a moment later
                    return None
                raise
            return str(answer["status"]["token"])

        return wait_until(issued, f"a token for {pvc}", 30)

    def upload(self, token: str, body: bytes, path: str = "/v1beta1/upload") -> tuple[int, str]:
        svc = self.admin.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")
        # the bundle the proxy publishes, as `cdi upload` trusts it (CDIConfig
        # status.uploadProxyCA): mid-rotation it holds both CAs, the Secret's ca.crt only the next
        bundle = self.admin.get("/api/v1/namespaces/cdi/configmaps/cdi-uploadproxy-signer-bundle")
        ca = bundle["data"]["ca-bundle.crt"]
        url = f"https://{svc['spec']['clusterIP']}:443{path}"

        async def post() -> tuple[int, str]:
            ctx = ssl.create_default_context(cadata=ca)
            headers = {"Authorization": f"Bearer {token}"}
            async with (
                aiohttp.ClientSession() as s,
                s.post(url, data=body, headers=headers, ssl=ctx, server_hostname=PROXY_NAME) as r,
            ):
                return r.status, await r.text()

        return asyncio.run(post())


@pytest.fixture
def user(cluster: Cluster, kube: Kube, namespace: str, product: Product) -> User:
    return User(cluster, kube, namespace)


def upload_dv(name: str, mode: str = "Filesystem", **ann: str) -> dict[str, Any]:
    sc = "testkit-block" if mode == "Block" else "testkit-fs"
    return datavolume(
        name, {"upload": {}}, size="32Mi", storage_class=sc, mode=mode, annotations=ann
    )


def gone(kube: Kube, ns: str, kind: str, name: str) -> bool:
    return kube.get_or_none(f"/api/v1/namespaces/{ns}/{kind}/{name}") is None


@pytest.mark.parametrize(
    ("image", "mode"), [("disk.qcow2", "Filesystem"), ("disk.raw.gz", "Block")]
)
def test_datavolume_upload_through_the_proxy_is_byte_identical_and_cannot_be_repeated(
    kube: Kube, namespace: str, user: User, images: Images, image: str, mode: str
) -> None:
    kube.create(dv_path(namespace), upload_dv("up", mode))
    dv = wait_phase(kube, namespace, "up", ("UploadReady",), 120)
    assert (condition(dv, "Ready")["status"], condition(dv, "Ready")["reason"]) == (
        "False",
        "TransferRunning",
    )
    assert (condition(dv, "Running")["status"], condition(dv, "Running")["reason"]) == (
        "True",
        "Pod is running",
    )
    assert condition(dv, "Bound")["status"] == "True"
    ann = annotations(kube, namespace, "up")
    assert ann[ANN + "pod.ready"] == "true" and ANN + "upload.target" in ann
    token = user.token("up")
    status, text = user.upload(token, images.path(image).read_bytes())
    assert status == 200, text
    dv = wait_phase(kube, namespace, "up", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    local = Path(pv_of(kube, namespace, "up")["spec"]["local"]["path"])
    same_prefix_then_zeros(local if mode == "Block" else local / "disk.img", images.reference)
    assert annotations(kube, namespace, "up")[ANN + "pod.phase"] == "Succeeded"
    event_reasons(kube, namespace, "up", {"UploadReady", "UploadSucceeded"})
    wait_until(
        lambda: all(
            gone(kube, namespace, kind, name)
            for kind, name in (
                ("pods", "cdi-upload-up"),
                ("services", "cdi-upload-up"),
                ("secrets", "cdi-upload-up-tls"),
            )
        ),
        "the upload pod, Service and Secret cleaned up",
        30,
    )
    again = user.upload(token, b"x" * 4096)
    assert again == (503, "rejecting Upload Request for PVC up that already finished uploading")


def test_plain_pvc_upload_and_removing_the_annotation_removes_the_server(
    kube: Kube, namespace: str, user: User, images: Images
) -> None:
    def pvc(name: str) -> dict[str, Any]:
        return {
            "metadata": {
                "name": name,
                "annotations": {ANN + "upload.target": "", ANN + "contentType": "kubevirt"},
            },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "testkit-fs",
                "resources": {"requests": {"storage": "32Mi"}},
            },
        }

    for name in ("plain", "dropped"):
        kube.create(pvc_path(namespace), pvc(name))
    for name in ("plain", "dropped"):
        wait_until(
            lambda n=name: annotations(kube, namespace, n).get(ANN + "pod.ready") == "true",
            f"{name} ready",
            120,
        )
    status, text = user.upload(user.token("plain"), images.path("disk.qcow2").read_bytes())
    assert status == 200, text
    wait_until(
        lambda: annotations(kube, namespace, "plain").get(ANN + "pod.phase") == "Succeeded",
        "plain done",
        60,
    )
    local = Path(pv_of(kube, namespace, "plain")["spec"]["local"]["path"])
    same_prefix_then_zeros(local / "disk.img", images.reference)
    kube.patch(
        pvc_path(namespace, "dropped"), {"metadata": {"annotations": {ANN + "upload.target": None}}}
    )
    wait_until(
        lambda: gone(kube, namespace, "pods", "cdi-upload-dropped"),
        "the server of dropped deleted",
        30,
    )
    assert not (
        Path(pv_of(kube, namespace, "dropped")["spec"]["local"]["path"]) / "disk.img"
    ).exists()


def test_a_token_for_one_pvc_writes_only_that_pvc_and_a_deleted_one_takes_its_server(
    kube: Kube, namespace: str, user: User, images: Images
) -> None:
    for name in ("a", "b"):
        kube.create(dv_path(namespace), upload_dv(name))
    for name in ("a", "b"):
        wait_phase(kube, namespace, name, ("UploadReady",), 120)
    status, text = user.upload(user.token("a"), images.path("disk.qcow2").read_bytes())
    assert status == 200, text
    assert (
        wait_phase(kube, namespace, "a", ("Succeeded", "Failed"), 60)["status"]["phase"]
        == "Succeeded"
    )
    assert kube.get(dv_path(namespace, "b"))["status"]["phase"] == "UploadReady"
    assert not (Path(pv_of(kube, namespace, "b")["spec"]["local"]["path"]) / "disk.img").exists()
    kube.delete(dv_path(namespace, "b"))  # its server holds the claim: it must go first
    wait_until(lambda: gone(kube, namespace, "persistentvolumeclaims", "b"), "b's claim gone", 60)
    assert gone(kube, namespace, "pods", "cdi-upload-b")


def test_wait_for_first_consumer_without_force_bind_waits_and_with_it_becomes_ready(
    kube: Kube, namespace: str, product: Product
) -> None:
    later = datavolume("later", {"upload": {}}, size="16Mi", storage_class="testkit-fs-wffc")
    kube.create(dv_path(namespace), later)
    wait_phase(kube, namespace, "later", ("WaitForFirstConsumer",), 30)
    time.sleep(2)  # nothing forces the binding: no upload server appears
    assert gone(kube, namespace, "pods", "cdi-upload-later")
    assert kube.get(dv_path(namespace, "later"))["status"]["phase"] == "WaitForFirstConsumer"
    forced = {ANN + "bind.immediate.requested": ""}
    now = datavolume(
        "now", {"upload": {}}, size="16Mi", storage_class="testkit-fs-wffc", annotations=forced
    )
    kube.create(dv_path(namespace), now)
    dv = wait_phase(kube, namespace, "now", ("UploadReady",), 120)
    assert condition(dv, "Bound")["status"] == "True"


def test_a_killed_upload_server_is_restarted_and_counted_and_still_takes_the_upload(
    kube: Kube, namespace: str, user: User, images: Images
) -> None:
    kube.create(dv_path(namespace), upload_dv("crash"))
    wait_phase(kube, namespace, "crash", ("UploadReady",), 120)
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/cdi-upload-crash")
    (status,) = pod["status"]["containerStatuses"]
    os.killpg(int(str(status["containerID"]).removeprefix("testkit://")), signal.SIGKILL)

    def restarted() -> dict[str, Any] | None:
        dv = kube.get(dv_path(namespace, "crash"))
        ready = dv["status"].get("phase") == "UploadReady"
        return dv if ready and dv["status"].get("restartCount") == 1 else None

    wait_until(restarted, "the restart counted and the server ready again", 60)
    assert annotations(kube, namespace, "crash")[ANN + "pod.restarts"] == "1"
    status_code, text = user.upload(user.token("crash"), images.path("disk.raw.gz").read_bytes())
    assert status_code == 200, text
    dv = wait_phase(kube, namespace, "crash", ("Succeeded", "Failed"), 60)
    assert (dv["status"]["phase"], dv["status"]["restartCount"]) == ("Succeeded", 1)
