"""CDIConfig ``importProxy.trustedCAProxy`` end to end (CDI ``tests/import_proxy_test.go``, "global
trustedCAProxy"): an https image server with its own CA (the DataVolume's ``certConfigMap``)
reached only through an HTTPS proxy on loopback, a CONNECT proxy whose listening TLS a second,
private CA signed. The operator keeps that CA in a ConfigMap of the CDI namespace and names it
in ``importProxy.trustedCAProxy``; the controller copies it beside the import as
``import-proxy-cm-<claim>`` and the importer trusts it for the proxy (TLS in TLS through the
tunnel). Without the setting the import fails at once with a reason that names it, and neither
the proxy nor the image server is asked for anything.

The same proxy demanding credentials (``HTTPSProxy: https://user:password@proxy``, as CDI
accepts it): the deployed import proxy relay holds them and speaks TLS to the proxy, trusting
the same ConfigMap; the tenant's namespace (pod spec, Secrets, ConfigMaps, events, the
DataVolume) holds only a ticket; a wrong password fails the import at once with
``ProxyAuthenticationFailed``."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest

from testkit.kubeclient import Kube
from testkit.pki import CertificateAuthority
from testkit.product import Product
from testkit.registry import Tls
from testkit.tlsproxy import TlsForwardProxy
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    CDI_NAMESPACE,
    DV_API,
    Images,
    condition,
    datavolume,
    dv_path,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)

pytestmark = pytest.mark.integration
PROXY_CA_MAP = "import-proxy-ca"
CONFIG = f"{DV_API}/cdiconfigs/config"


@dataclass
class HttpsImages:
    """The session's images over https, with a certificate of the ``target`` CA."""

    root: Path
    tls: Tls
    requests: list[str] = field(default_factory=list)
    port: int = 0
    _server: http.server.ThreadingHTTPServer | None = None

    def url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.port}/{name}"

    def start(self) -> HttpsImages:
        seen = self.requests

        class Handler(http.server.SimpleHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                seen.append(self.requestline)

        server = http.server.ThreadingHTTPServer(
            ("127.0.0.1", 0), partial(Handler, directory=str(self.root))
        )
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.tls.cert, self.tls.key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self.port = int(server.server_address[1])
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


@pytest.fixture(scope="module")
def https_images(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpsImages]:
    tls = Tls.make(tmp_path_factory.mktemp("target-tls"), CertificateAuthority("images-ca"))
    server = HttpsImages(images.root, tls).start()
    yield server
    server.stop()


@pytest.fixture
def tls_proxy(tmp_path: Path) -> Iterator[TlsForwardProxy]:
    tls = Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))
    proxy = TlsForwardProxy(tls).start()
    yield proxy
    proxy.stop()


def _configure(kube: Kube, import_proxy: dict[str, str] | None) -> None:
    """CDIConfig ``importProxy``, and wait until its status (what the controller reads) says so."""
    kube.patch(CONFIG, {"spec": {"importProxy": import_proxy}})

    def applied() -> bool:
        status = (kube.get(CONFIG).get("status") or {}).get("importProxy")
        return (status or None) == import_proxy

    wait_until(applied, "CDIConfig status.importProxy", 30)


@pytest.fixture
def proxy_config(kube: Kube) -> Iterator[None]:
    yield
    _configure(kube, None)
    with contextlib.suppress(Exception):
        kube.delete(f"/api/v1/namespaces/{CDI_NAMESPACE}/configmaps/{PROXY_CA_MAP}")


def _target_ca(kube: Kube, namespace: str, https_images: HttpsImages) -> dict[str, object]:
    """The image server's CA as the tenant's certConfigMap; the DataVolume's source."""
    ca = https_images.tls.ca_pem.read_text()
    kube.create(
        f"/api/v1/namespaces/{namespace}/configmaps",
        {"metadata": {"name": "images-ca"}, "data": {"ca.crt": ca}},
    )
    return {"http": {"url": https_images.url("disk.qcow2"), "certConfigMap": "images-ca"}}


def test_https_through_a_proxy_with_a_private_ca_imports_with_trusted_ca_proxy(
    kube: Kube,
    namespace: str,
    controller: Product,
    images: Images,
    https_images: HttpsImages,
    tls_proxy: TlsForwardProxy,
    proxy_config: None,
) -> None:
    ca = tls_proxy.ca_pem.read_text()
    kube.create(
        f"/api/v1/namespaces/{CDI_NAMESPACE}/configmaps",
        {"metadata": {"name": PROXY_CA_MAP}, "data": {"ca.pem": ca}},
    )
    _configure(kube, {"HTTPSProxy": tls_proxy.url, "trustedCAProxy": PROXY_CA_MAP})
    source = _target_ca(kube, namespace, https_images)
    kube.create(dv_path(namespace), datavolume("behind-proxy", source, size="64Mi"))

    dv = wait_phase(kube, namespace, "behind-proxy", ("Succeeded", "Failed"), 180)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["restartCount"] == 0
    assert tls_proxy.tunnels and set(tls_proxy.tunnels) == {f"127.0.0.1:{https_images.port}"}
    assert any("GET /disk.qcow2" in r for r in https_images.requests)
    disk = Path(pv_of(kube, namespace, "behind-proxy")["spec"]["local"]["path"]) / "disk.img"
    same_prefix_then_zeros(disk, images.reference)
    # CDI's copy of the bundle, beside the import, owned by the DataVolume
    copy = kube.get(f"/api/v1/namespaces/{namespace}/configmaps/import-proxy-cm-behind-proxy")
    assert copy["data"] == {"ca.pem": ca}
    owner = copy["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("DataVolume", "behind-proxy")


def test_without_trusted_ca_proxy_the_import_fails_at_once_naming_it(
    kube: Kube,
    namespace: str,
    controller: Product,
    https_images: HttpsImages,
    tls_proxy: TlsForwardProxy,
    proxy_config: None,
) -> None:
    _configure(kube, {"HTTPSProxy": tls_proxy.url})
    source = _target_ca(kube, namespace, https_images)
    asked_before = list(https_images.requests)
    kube.create(dv_path(namespace), datavolume("untrusted-proxy", source, size="64Mi"))

    dv = wait_phase(kube, namespace, "untrusted-proxy", ("Succeeded", "Failed"), 180)
    ready = condition(dv, "Ready")
    assert dv["status"]["phase"] == "Failed", dv["status"]
    assert ready["reason"] == "SourceUnavailable", ready
    assert "import proxy" in ready["message"] and "trustedCAProxy" in ready["message"], ready
    assert dv["status"]["restartCount"] == 0  # permanent: no retry loop
    assert tls_proxy.tunnels == [] and https_images.requests == asked_before
    configmaps = kube.get(f"/api/v1/namespaces/{namespace}/configmaps")["items"]
    assert not [c for c in configmaps if c["metadata"]["name"].startswith("import-proxy-cm-")]


def test_a_trusted_ca_proxy_that_names_no_configmap_waits_and_says_so(
    kube: Kube,
    namespace: str,
    controller: Product,
    https_images: HttpsImages,
    tls_proxy: TlsForwardProxy,
    proxy_config: None,
) -> None:
    """The operator named a ConfigMap that is not there (yet): no importer runs without the
    trust asked for; the DataVolume says why, and imports once the ConfigMap exists."""
    _configure(kube, {"HTTPSProxy": tls_proxy.url, "trustedCAProxy": PROXY_CA_MAP})
    source = _target_ca(kube, namespace, https_images)
    kube.create(dv_path(namespace), datavolume("waits-for-ca", source, size="64Mi"))

    def reason() -> str | None:
        status = kube.get(dv_path(namespace, "waits-for-ca")).get("status") or {}
        bound = next((c for c in status.get("conditions") or [] if c["type"] == "Bound"), {})
        return bound.get("reason") if bound.get("reason") == "ImportProxyCAMissing" else None

    wait_until(reason, "the missing trustedCAProxy ConfigMap named", 60)
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    assert not [p for p in pods if p["metadata"]["name"].startswith("importer-")]
    kube.create(
        f"/api/v1/namespaces/{CDI_NAMESPACE}/configmaps",
        {"metadata": {"name": PROXY_CA_MAP}, "data": {"ca.pem": tls_proxy.ca_pem.read_text()}},
    )
    dv = wait_phase(kube, namespace, "waits-for-ca", ("Succeeded", "Failed"), 180)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]


CREDENTIALS = "al@ice:pw-SECRET"


@pytest.fixture
def auth_proxy(tmp_path: Path) -> Iterator[TlsForwardProxy]:
    tls = Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))
    proxy = TlsForwardProxy(tls, credentials=CREDENTIALS).start()
    yield proxy
    proxy.stop()


def _credentialed(kube: Kube, proxy: TlsForwardProxy, userinfo: str) -> None:
    kube.create(
        f"/api/v1/namespaces/{CDI_NAMESPACE}/configmaps",
        {"metadata": {"name": PROXY_CA_MAP}, "data": {"ca.pem": proxy.ca_pem.read_text()}},
    )
    _configure(kube, {"HTTPSProxy": proxy.url_with(userinfo), "trustedCAProxy": PROXY_CA_MAP})
    time.sleep(6)  # the relay reads CDIConfig again every 5 s (an earlier test's proxy)


def _namespace_holds(kube: Kube, namespace: str) -> str:
    """Everything a tenant reads in the namespace, Secret values decoded, and the DataVolumes."""
    seen = []
    for kind in ("secrets", "pods", "configmaps", "events", "persistentvolumeclaims"):
        items = kube.get(f"/api/v1/namespaces/{namespace}/{kind}")["items"]
        seen.append(json.dumps(items))
        if kind == "secrets":
            seen += [base64.b64decode(v).decode(errors="replace") for s in items
                     for v in (s.get("data") or {}).values()]  # fmt: skip
    seen.append(json.dumps(kube.get(dv_path(namespace))["items"]))
    return "\n".join(seen)


def test_an_https_proxy_with_credentials_is_reached_through_the_relay_with_them(
    kube: Kube,
    namespace: str,
    controller: Product,
    images: Images,
    https_images: HttpsImages,
    auth_proxy: TlsForwardProxy,
    proxy_config: None,
) -> None:
    _credentialed(kube, auth_proxy, "al%40ice:pw-SECRET")
    source = _target_ca(kube, namespace, https_images)
    kube.create(dv_path(namespace), datavolume("auth-proxy", source, size="64Mi"))

    dv = wait_phase(kube, namespace, "auth-proxy", ("Succeeded", "Failed"), 180)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"]["restartCount"] == 0
    expected = "Basic " + base64.b64encode(CREDENTIALS.encode()).decode()
    assert auth_proxy.authorizations and set(auth_proxy.authorizations) == {expected}
    assert set(auth_proxy.tunnels) == {f"127.0.0.1:{https_images.port}"}
    disk = Path(pv_of(kube, namespace, "auth-proxy")["spec"]["local"]["path"]) / "disk.img"
    same_prefix_then_zeros(disk, images.reference)
    # the tenant's namespace: a ticket for the relay, never the password (CDI would have put
    # the whole URL into the importer's env); the pod dials the relay, not the proxy
    seen = _namespace_holds(kube, namespace)
    assert "import-proxy-auth-" in seen and f"{namespace}~auth-proxy~" in seen
    assert "pw-SECRET" not in seen and "al%40ice" not in seen and "al@ice" not in seen
    assert base64.b64encode(CREDENTIALS.encode()).decode() not in seen
    assert f"127.0.0.1:{auth_proxy.port}" not in seen


def test_a_wrong_https_proxy_password_fails_at_once_with_proxy_authentication_failed(
    kube: Kube,
    namespace: str,
    controller: Product,
    https_images: HttpsImages,
    auth_proxy: TlsForwardProxy,
    proxy_config: None,
) -> None:
    _credentialed(kube, auth_proxy, "al%40ice:wrong-SECRET")
    source = _target_ca(kube, namespace, https_images)
    asked_before = list(https_images.requests)
    kube.create(dv_path(namespace), datavolume("wrong-proxy-pw", source, size="64Mi"))

    dv = wait_phase(kube, namespace, "wrong-proxy-pw", ("Succeeded", "Failed"), 180)
    ready = condition(dv, "Ready")
    assert dv["status"]["phase"] == "Failed", dv["status"]
    assert ready["reason"] == "ProxyAuthenticationFailed", ready
    assert "407" in ready["message"], ready
    assert dv["status"]["restartCount"] == 0  # permanent: no retry loop
    assert auth_proxy.refused >= 1 and auth_proxy.tunnels == []
    assert https_images.requests == asked_before
    seen = _namespace_holds(kube, namespace)
    assert "SECRET" not in seen and "al@ice" not in seen
