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
and that bundle too holds both CAs for a while and then only the new one."""

from __future__ import annotations

import base64
import secrets
import time
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import datavolume, dv_path
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


def test_the_cas_rotate_in_stages_with_no_failed_scrape_or_admission(
    kube: Kube,
    product: Product,
    namespace: str,
    cdi_resource: MakeCDI,  # noqa: F811
) -> None:
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
    cdi_resource(certConfig={"ca": {"duration": "10m", "renewBefore": "2m"}})
    wait_until(config_status_has(kube, "certConfig"), "the certConfig in CDIConfig", 30)

    overlap: bytes | None = None  # the bundle a client took while both CAs were in it
    new_ca: bytes | None = None
    seen: dict[str, float] = {}
    failures: list[Any] = []
    start = time.monotonic()
    while time.monotonic() - start < 300:
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
        if "dropped" in seen and "webhook dropped" in seen:
            break
        time.sleep(1.0)
    assert not failures, (failures, seen)
    assert {"staged", "switched", "dropped", "webhook staged", "webhook dropped"} <= set(seen), seen
    assert seen["webhook dropped"] - seen["webhook staged"] >= 90, seen  # two stages
    assert seen["switched"] - seen["staged"] >= 45, seen  # the stage: 1 minute
    assert ok(ips, token, bundle(kube))
