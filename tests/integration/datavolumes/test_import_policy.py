"""The import network policy and proxy credentials end to end: the session's CDIConfig allows
only the image server (127.0.0.1/32) and the controller knows the cluster's pod and service
ranges (``cdi_env``); everything here stays on 127.0.0.0/8."""

from __future__ import annotations

import base64
import ipaddress
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    ControllerProcess,
    ImageServer,
    condition,
    datavolume,
    dv_path,
    wait_phase,
)
from tests.integration.datavolumes.test_upload import User

pytestmark = pytest.mark.integration


def test_import_from_a_cluster_address_is_forbidden_and_sends_nothing(
    kube: Kube, namespace: str, cluster: Cluster, controller: ControllerProcess
) -> None:
    """A URL into the cluster's pod range (127.N.0.0/16 here, so the check is safe to run on
    the host) fails at once with SourceForbidden; a canary listening there sees no connection,
    and the secret query string is not in the condition."""
    address = str(ipaddress.IPv4Network(cluster.pod_cidr)[-2])
    with socket.create_server((address, 0)) as canary:
        canary.setblocking(False)
        url = f"http://{address}:{canary.getsockname()[1]}/disk.img?token=tok-SECRET"
        kube.create(dv_path(namespace), datavolume("inside", {"http": {"url": url}}))
        dv = wait_phase(kube, namespace, "inside", ("Succeeded", "Failed"), 90)
        cond = condition(dv, "Ready")
        assert dv["status"]["phase"] == "Failed" and cond["reason"] == "SourceForbidden", dv
        assert "tok-SECRET" not in cond["message"]
        assert dv["status"]["restartCount"] == 0
        with pytest.raises(BlockingIOError):
            canary.accept()


class _Proxy(BaseHTTPRequestHandler):
    """A forward proxy for plain http that demands ``Proxy-Authorization``."""

    expected = ""
    seen: list[str | None] = []

    def do_GET(self) -> None:
        self.seen.append(self.headers.get("Proxy-Authorization"))
        if self.headers.get("Proxy-Authorization") != self.expected:
            self.send_response(407)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(self.path) as upstream:
            body = upstream.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def auth_proxy() -> Iterator[str]:
    _Proxy.expected = "Basic " + base64.b64encode(b"al@ice:pw-SECRET").decode()
    _Proxy.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Proxy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://al%40ice:pw-SECRET@127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _import_through(kube: Kube, namespace: str, image_server: ImageServer, proxy: str) -> None:
    """An import through the authenticating proxy succeeds, the proxy seeing its credentials."""
    config = f"{DV_API}/cdiconfigs/config"
    kube.patch(config, {"spec": {"importProxy": {"HTTPProxy": proxy}}})
    time.sleep(2)  # the controller reads CDIConfig from its informer cache
    try:
        source = {"http": {"url": image_server.url("ok", "disk.raw.gz")}}
        kube.create(dv_path(namespace), datavolume("viaproxy", source, size="32Mi"))
        dv = wait_phase(kube, namespace, "viaproxy", ("Succeeded", "Failed"), 120)
    finally:
        kube.patch(config, {"spec": {"importProxy": None}})
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert _Proxy.seen and all(seen == _Proxy.expected for seen in _Proxy.seen)


def test_proxy_credentials_reach_the_proxy_through_the_relay_not_the_pod_spec(
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    image_server: ImageServer,
    auth_proxy: str,
) -> None:
    _import_through(kube, namespace, image_server, auth_proxy)
    secrets = kube.get(f"/api/v1/namespaces/{namespace}/secrets")["items"]
    ours = [s for s in secrets if s["metadata"]["name"].startswith("import-proxy-auth-")]
    assert len(ours) == 1 and ours[0]["metadata"]["ownerReferences"][0]["kind"] == "DataVolume"
    ticket = base64.b64decode(ours[0]["data"]["http"]).decode()
    assert ticket.startswith(f"{namespace}~viaproxy~"), "a relay ticket, not the credentials"
    # the proxy saw its credentials, which only the relay holds: the ticket went to the relay


def _everything_readable(tenant: Kube, admin: Kube, namespace: str) -> str:
    """All a tenant with ``edit`` reads in the namespace, Secret values decoded, and the
    DataVolumes (CDI's aggregated roles let ``view`` read them; not installed here)."""
    seen = []
    for kind in ("secrets", "pods", "configmaps", "events", "persistentvolumeclaims"):
        items = tenant.get(f"/api/v1/namespaces/{namespace}/{kind}")["items"]
        seen.append(json.dumps(items))
        if kind == "secrets":
            seen += [base64.b64decode(v).decode(errors="replace") for s in items
                     for v in (s.get("data") or {}).values()]  # fmt: skip
    seen.append(json.dumps(admin.get(dv_path(namespace))["items"]))
    return "\n".join(seen)


def test_a_tenant_with_edit_cannot_read_the_proxy_password_after_an_import_through_it(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    controller: ControllerProcess,
    image_server: ImageServer,
    auth_proxy: str,
) -> None:
    """S4: the cluster's importProxy password was copied into a Secret in every namespace that
    imports, which ``edit`` reads. Now the tenant finds only a ticket for the relay."""
    alice = User(cluster, kube, namespace)  # bound to the built-in edit role here
    _import_through(kube, namespace, image_server, auth_proxy)
    seen = _everything_readable(alice.kube, kube, namespace)
    assert "import-proxy-auth-" in seen  # she does read the Secret the importer mounted
    assert "pw-SECRET" not in seen and "al%40ice" not in seen and "al@ice" not in seen
    assert base64.b64encode(b"al@ice:pw-SECRET").decode() not in seen
