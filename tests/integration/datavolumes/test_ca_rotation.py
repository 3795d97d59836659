"""The CDI resource's ``certConfig.ca`` on the real API server (issue 26): the controller's
metrics CA is replaced in stages with no failed scrape in between.

``certConfig.ca: {duration: 4m, renewBefore: 2m}`` makes the deployed year-long CA longer than
asked, so a rotation starts at once; its stage is 1 minute (``cdi.pki.certs``). Both controller
replicas are scraped every second, as Prometheus does through the ServiceMonitor (bearer token,
HTTPS verified with ``cdi-controller-metrics-signer-bundle`` for the Service's name), by three
clients: one that re-reads the bundle before every scrape, one that kept the bundle it read
before the rotation (the old CA alone), and one that took the bundle while both CAs were in
it. The first and the last never fail; the old-CA client works until the new CA signs; the
new CA is in the bundle before any replica serves a certificate it signed; the old CA leaves
the bundle only after both replicas serve the new CA's certificate."""

from __future__ import annotations

import time
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
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


def ok(ips: list[str], token: str, ca: bytes) -> bool:
    return all(get(metrics_url(ip), token, ca)[0] == 200 for ip in ips)


def test_the_metrics_ca_rotates_in_stages_with_no_failed_scrape(
    kube: Kube,
    product: Product,
    cdi_resource: MakeCDI,  # noqa: F811
) -> None:
    token, before = reader_token(kube), metrics_ca(kube)
    ips = wait_until(
        lambda: (lambda p: p if len(p) == 2 else None)(controller_pods(kube)),
        "two controller pods with addresses",
        60,
    )
    wait_until(lambda: ok(ips, token, before), "both replicas answer", 60, interval=0.5)
    assert len(cas(before)) == 1
    cdi_resource(certConfig={"ca": {"duration": "4m", "renewBefore": "2m"}})
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
            for name, ca in (("fresh bundle", now_bundle), ("overlap bundle", overlap)):
                if ca is not None and (status := get(url, token, ca))[0] != 200:
                    failures.append((round(time.monotonic() - start, 1), ip, name, status))
        if new_ca is not None and "switched" not in seen and ok(ips, token, new_ca):
            seen["switched"] = time.monotonic() - start  # both serve the new CA's certificate
            assert not ok(ips, token, before)
        if new_ca is not None and in_bundle == [new_ca]:
            seen["dropped"] = time.monotonic() - start
            assert "switched" in seen, "the old CA left before both replicas switched"
            break
        time.sleep(1.0)
    assert not failures, failures
    assert {"staged", "switched", "dropped"} <= set(seen), seen
    assert seen["switched"] - seen["staged"] >= 45, seen  # the stage: 1 minute
    assert ok(ips, token, bundle(kube))
