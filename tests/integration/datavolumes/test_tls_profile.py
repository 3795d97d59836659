"""CDIConfig's ``tlsSecurityProfile`` on the installed product (CDI's scenario 9063): under
``Modern`` a TLS 1.2 client is refused with a protocol-version alert by the webhook, the token
API, the upload proxy and an upload server started then, while TLS 1.3 is served; back to the
default (Intermediate), TLS 1.2 is served again, without restarting anything."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import dv_path, wait_phase
from tests.integration.datavolumes.test_upload import upload_dv

pytestmark = pytest.mark.integration
CONFIG = "/apis/cdi.kubevirt.io/v1beta1/cdiconfigs/config"
SERVERS = ("cdi-webhook", "cdi-api", "cdi-uploadproxy")  # Services in cdi, port 443
TLS12, TLS13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3


def service_ip(kube: Kube, namespace: str, name: str) -> str:
    return str(kube.get(f"/api/v1/namespaces/{namespace}/services/{name}")["spec"]["clusterIP"])


def version_refused(ip: str, maximum: ssl.TLSVersion, port: int = 443) -> bool:
    """Whether a client offering TLS up to ``maximum`` is refused at its ClientHello: a
    protocol-version alert, or (asyncio's servers send no alert) a close or reset before any
    answer.
    A server that answers with its hello took the version, whatever fails later (the webhook
    then demands a client certificate this client does not have)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the profile, not the server's identity, is checked
    ctx.maximum_version = maximum
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing)
    with socket.create_connection((ip, port), timeout=10) as raw:
        with contextlib.suppress(ssl.SSLWantReadError):
            tls.do_handshake()
        try:
            raw.sendall(outgoing.read())
            answer = raw.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError):
            return True  # a reset before any answer: refused (the upload server's front)
    if not answer:
        return True
    incoming.write(answer)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        return False  # the server's hello, and more to come
    except ssl.SSLError as exc:
        return "PROTOCOL_VERSION" in str(exc.reason or exc)
    return False


def every_time(check: Any, times: int = 4) -> bool:
    """``check()`` held on ``times`` fresh connections (a Service spreads them over replicas)."""
    return all(check() for _ in range(times))


def set_profile(kube: Kube, profile: dict[str, Any] | None) -> None:
    kube.patch(CONFIG, {"spec": {"tlsSecurityProfile": profile}})


@pytest.fixture
def modern(kube: Kube, product: Product) -> Iterator[list[str]]:
    ips = [service_ip(kube, "cdi", name) for name in SERVERS]
    set_profile(kube, {"type": "Modern", "modern": {}})
    try:
        yield ips
    finally:
        set_profile(kube, None)
        wait_until(
            lambda: every_time(lambda: not any(version_refused(ip, TLS12) for ip in ips)),
            "TLS 1.2 served again by the webhook, the token API and the upload proxy",
            60,
        )


def test_modern_refuses_tls12_on_every_server_and_intermediate_serves_it_again(
    kube: Kube, namespace: str, modern: list[str]
) -> None:
    for ip, name in zip(modern, SERVERS, strict=True):
        wait_until(
            lambda ip=ip: every_time(lambda: version_refused(ip, TLS12)),
            f"{name} refuses a TLS 1.2 client under Modern",
            60,
        )
        assert not version_refused(ip, TLS13), name

    kube.create(dv_path(namespace), upload_dv("tls"))
    wait_phase(kube, namespace, "tls", ("UploadReady",), 120)
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/cdi-upload-tls")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["TLS_MIN_VERSION"] == "VersionTLS13"
    upload_server = service_ip(kube, namespace, "cdi-upload-tls")
    wait_until(  # UploadReady comes with the pod; the server listens a moment later
        lambda: not version_refused(upload_server, TLS13, 8443),
        "the upload server serves TLS 1.3",
        60,
    )
    assert version_refused(upload_server, TLS12, 8443)
