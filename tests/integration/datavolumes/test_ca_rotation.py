"""The CDI resource's ``certConfig.ca`` on the real API server (issue 26): the controller's
metrics CA and the admission webhook's CA are replaced in stages with no failed scrape and no
failed admission in between.

``certConfig.ca: {duration: 10m, renewBefore: 2m}`` makes the deployed year-long CA longer than
asked, so a rotation starts at once; its stage is 1 minute (``cdi.pki.certs``). Both controller
replicas are scraped every second, as Prometheus does through the ServiceMonitor (bearer token,
HTTPS verified with ``cdi-controller-metrics-signer-bundle`` for the Service's name), by three
clients: one that re-reads the bundle before every scrape, one that kept the bundle it read
before the rotation (the old CA alone), and one that took the bundle while both CAs were in
it. The first and the last never fail; the old-CA client works until the new CA signs; the
new CA is in the bundle before any replica serves a certificate it signed; the old CA leaves
the bundle only after both replicas serve the new CA's certificate. Meanwhile a DataVolume is
created every second with ``dryRun=All``, so the API server calls the webhook (failurePolicy
Fail) through the ``caBundle`` the webhook publishes in its configuration: every one admitted,
and that bundle too holds both CAs for a while and then only the new one.

The upload plane rotates in the same run (``certConfig.server: 2m/30s`` so that the old
upload server CA, trusted until the last certificate it signed has ended, leaves within the
test): all the while a tenant uploads through the deployed proxy, one new DataVolume after
another, with a token from the token API (through the API server's aggregation, which trusts
the ``caBundle`` the token API publishes in its APIService) and the proxy's serving CA from the
bundle it publishes, as ``cdi upload`` does. The upload server CA is staged in
``cdi-uploadserver-signer-bundle``, signs a stage later, and the old one leaves it; the client
CA's switch waits for an upload pod made before the rotation (which trusts the old client CA
alone), and that pod still takes its upload after the server CA switched. No upload fails."""

from __future__ import annotations

import base64
import os
import secrets
import threading
import time
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import datavolume, dv_path, wait_phase
from tests.integration.datavolumes.metrics_env import (
    CA_CONFIG_MAP,
    get,
    metrics_ca,
    metrics_url,
    reader_token,
)
from tests.integration.datavolumes.test_alerts import controller_pods
from tests.integration.datavolumes.test_cdi_resource import (  # noqa: F401
    MakeCDI,
    cdi_resource,
    config_status_has,
)
from tests.integration.datavolumes.test_upload import User, upload_dv

pytestmark = pytest.mark.integration


def bundle(kube: Kube) -> bytes:
    data = (kube.get(CA_CONFIG_MAP).get("data") or {}).get("ca-bundle.crt") or ""
    return str(data).encode()


def cas(pem: bytes) -> list[bytes]:
    return [c.public_bytes(Encoding.PEM) for c in x509.load_pem_x509_certificates(pem)]


VALIDATOR = (
    "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/cdi-datavolume-validator"
)


def webhook_cas(kube: Kube) -> list[bytes]:
    hooks = kube.get(VALIDATOR)["webhooks"]
    return cas(base64.b64decode(hooks[0]["clientConfig"]["caBundle"]))


def admitted(kube: Kube, namespace: str) -> str:
    """'' when a dry-run DataVolume create passes the webhook, else the refusal."""
    body = datavolume(f"dry-{secrets.token_hex(3)}", {"blank": {}})
    try:
        kube.request("POST", dv_path(namespace), body, query={"dryRun": "All"})
    except ApiError as e:
        return str(e)
    return ""


def ok(ips: list[str], token: str, ca: bytes) -> bool:
    return all(get(metrics_url(ip), token, ca)[0] == 200 for ip in ips)


def signer(kube: Kube, secret: str) -> bytes:
    """The certificate that signs now (``tls.crt``) of an upload CA's Secret."""
    data = kube.get(f"/api/v1/namespaces/cdi/secrets/{secret}")["data"]
    return base64.b64decode(data["tls.crt"])


API_SERVICE = "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.upload.cdi.kubevirt.io"


def token_api_cas(kube: Kube) -> list[bytes]:
    """The CAs the API server trusts the token API by (its APIService's ``caBundle``)."""
    return cas(base64.b64decode(kube.get(API_SERVICE)["spec"]["caBundle"]))


def proxy_cas(kube: Kube) -> list[bytes]:
    """The CAs ``cdi upload`` trusts the upload proxy by (``cdi-uploadproxy-signer-bundle``)."""
    path = "/api/v1/namespaces/cdi/configmaps/cdi-uploadproxy-signer-bundle"
    return cas(str(kube.get(path)["data"]["ca-bundle.crt"]).encode())


def upload_bundle(kube: Kube) -> list[bytes]:
    path = "/api/v1/namespaces/cdi/configmaps/cdi-uploadserver-signer-bundle"
    return cas(str(kube.get(path)["data"]["ca-bundle.crt"]).encode())


class Uploads(threading.Thread):
    """A tenant uploading 1 MiB through the deployed proxy into one new DataVolume after
    another until stopped; every outcome kept."""

    def __init__(self, kube: Kube, user: User, namespace: str) -> None:
        super().__init__(daemon=True)
        self.kube, self.user, self.namespace = kube, user, namespace
        self.stop, self.done = threading.Event(), 0
        self.failures: list[Any] = []
        self.start_at = time.monotonic()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            name, n = f"rot-{n}", n + 1
            try:
                self.kube.create(dv_path(self.namespace), upload_dv(name))
                wait_phase(self.kube, self.namespace, name, ("UploadReady",), 120)
                status, text = self.user.upload(self.user.token(name), os.urandom(1 << 20))
                if status != 200:
                    raise AssertionError(f"{status} {text}")
                dv = wait_phase(self.kube, self.namespace, name, ("Succeeded", "Failed"), 60)
                conditions = [
                    (c["type"], c.get("reason"), c.get("message"))
                    for c in dv["status"].get("conditions") or []
                ]
                assert dv["status"]["phase"] == "Succeeded", conditions
                self.done += 1
                self.kube.delete(dv_path(self.namespace, name))
            except Exception as exc:
                self.failures.append((round(time.monotonic() - self.start_at, 1), name, exc))


def test_the_cas_rotate_in_stages_with_no_failed_scrape_admission_or_upload(
    kube: Kube,
    product: Product,
    cluster: Cluster,
    namespace: str,
    cdi_resource: MakeCDI,  # noqa: F811
) -> None:
    user = User(cluster, kube, namespace)
    kube.create(dv_path(namespace), upload_dv("early"))  # its pod trusts the old client CA alone
    wait_phase(kube, namespace, "early", ("UploadReady",), 120)
    upload_before, client_before = upload_bundle(kube), signer(kube, "cdi-uploadserver-client-ca")
    planes_before = {"token api": token_api_cas(kube), "proxy": proxy_cas(kube)}
    assert len(upload_before) == 1 and all(len(b) == 1 for b in planes_before.values())
    token, before = reader_token(kube), metrics_ca(kube)
    webhook_before = webhook_cas(kube)
    assert len(webhook_before) == 1 and admitted(kube, namespace) == ""
    ips = wait_until(
        lambda: (lambda p: p if len(p) == 2 else None)(controller_pods(kube)),
        "two controller pods with addresses",
        60,
    )
    wait_until(lambda: ok(ips, token, before), "both replicas answer", 60, interval=0.5)
    assert len(cas(before)) == 1
    cdi_resource(
        certConfig={
            "ca": {"duration": "10m", "renewBefore": "2m"},
            "server": {"duration": "2m", "renewBefore": "30s"},
        }
    )
    wait_until(config_status_has(kube, "certConfig"), "the certConfig in CDIConfig", 30)
    uploads = Uploads(kube, user, namespace)
    uploads.start()

    overlap: bytes | None = None  # the bundle a client took while both CAs were in it
    new_ca: bytes | None = None
    seen: dict[str, float] = {}
    failures: list[Any] = []
    start = time.monotonic()
    while time.monotonic() - start < 360:
        now_bundle = bundle(kube)
        in_bundle = cas(now_bundle)
        if len(in_bundle) == 2 and overlap is None:
            overlap, new_ca = now_bundle, in_bundle[0]
            seen["staged"] = time.monotonic() - start
            # staged: the new CA signs nothing yet, every replica still serves the old one's
            assert ok(ips, token, before), "the old CA's certificate is served while staged"
        for ip in ips:
            url = metrics_url(ip)
            # the overlap bundle is promised its own rotation, not a next one
            kept = overlap if "dropped" not in seen else None
            for name, ca in (("fresh bundle", now_bundle), ("overlap bundle", kept)):
                if ca is not None and (status := get(url, token, ca))[0] != 200:
                    failures.append((round(time.monotonic() - start, 1), ip, name, status))
        if new_ca is not None and "switched" not in seen and ok(ips, token, new_ca):
            seen["switched"] = time.monotonic() - start  # both serve the new CA's certificate
            assert not ok(ips, token, before)
        if new_ca is not None and in_bundle == [new_ca] and "dropped" not in seen:
            seen["dropped"] = time.monotonic() - start
            assert "switched" in seen, "the old CA left before both replicas switched"
        if refused := admitted(kube, namespace):
            failures.append((round(time.monotonic() - start, 1), "admission", refused))
        hook = webhook_cas(kube)
        if len(hook) == 2:
            seen.setdefault("webhook staged", time.monotonic() - start)
        elif hook != webhook_before and "webhook staged" in seen:
            seen.setdefault("webhook dropped", time.monotonic() - start)
        at = time.monotonic() - start
        upload_cas = upload_bundle(kube)
        if len(upload_cas) == 2:
            seen.setdefault("upload staged", at)
        if "upload staged" in seen and "upload switched" not in seen:
            if signer(kube, "cdi-uploadserver-ca") != upload_before[0]:
                seen["upload switched"] = at
                # an upload server made before the rotation takes its upload after the switch
                status, text = user.upload(user.token("early"), os.urandom(1 << 20))
                if status != 200:
                    failures.append((round(at, 1), "early upload", status, text))
                seen["early uploaded"] = time.monotonic() - start
        if "upload switched" in seen and upload_cas != upload_before and len(upload_cas) == 1:
            seen.setdefault("upload dropped", at)
        if signer(kube, "cdi-uploadserver-client-ca") != client_before:
            seen.setdefault("client switched", at)
            assert "early uploaded" in seen, "the client CA switched while a pod trusted it alone"
        for plane, read in (("token api", token_api_cas), ("proxy", proxy_cas)):
            now_cas = read(kube)
            if len(now_cas) == 2:
                seen.setdefault(f"{plane} staged", at)
            elif now_cas != planes_before[plane] and f"{plane} staged" in seen:
                seen.setdefault(f"{plane} dropped", at)
        wanted = (
            "dropped",
            "webhook dropped",
            "upload dropped",
            "client switched",
            "token api dropped",
            "proxy dropped",
        )
        if all(w in seen for w in wanted):
            break
        time.sleep(1.0)
    uploads.stop.set()
    uploads.join(150)
    print("rotation timeline (s):", seen, "uploads:", uploads.done)
    assert not failures, (failures, seen)
    failed = [f"{at} s {name}: {exc!s}" for at, name, exc in uploads.failures]
    assert not failed, "\n".join([*failed, str(seen), product.log()[-4000:]])
    assert uploads.done >= 10, (uploads.done, seen)  # uploads ran all through the rotations
    assert {"staged", "switched", "dropped", "webhook staged", "webhook dropped"} <= set(seen), seen
    assert {"upload staged", "upload switched", "upload dropped", "client switched"} <= set(seen)
    # the token API's and the proxy's serving CAs went through a whole rotation under the uploads
    for plane in ("token api", "proxy"):
        assert seen[f"{plane} dropped"] - seen[f"{plane} staged"] >= 90, seen  # two stages
    assert seen["upload switched"] - seen["upload staged"] >= 45, seen  # a stage: 1 minute
    # the old upload server CA is trusted until the last certificate it signed ends (2m)
    assert seen["upload dropped"] - seen["upload switched"] >= 100, seen
    assert seen["webhook dropped"] - seen["webhook staged"] >= 90, seen  # two stages
    assert seen["switched"] - seen["staged"] >= 45, seen  # the stage: 1 minute
    assert ok(ips, token, bundle(kube))
