"""Scraping the installed controller's ``/metrics`` as Prometheus does since CDI's #4121: over
HTTPS verified with the controller's metrics CA for the Service's name, with a bearer token
(``cdi.controller.metrics_auth``). The token is the one the ServiceMonitor in
``deploy/optional/monitoring.yaml`` sends: Secret ``cdi-metrics-reader-token`` of the
ServiceAccount ``cdi-metrics-reader`` (``deploy/17-rbac-metrics.yaml``), filled in by the
cluster's token controller; or a short-lived one from a TokenRequest."""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from testkit.kubeclient import Kube
from testkit.waiting import wait_until

READER_SECRET = "/api/v1/namespaces/cdi/secrets/cdi-metrics-reader-token"
CA_CONFIG_MAP = "/api/v1/namespaces/cdi/configmaps/cdi-controller-metrics-signer-bundle"
SERVER_NAME = "cdi-controller-metrics.cdi.svc"  # the ServiceMonitor's tlsConfig.serverName


def reader_token(kube: Kube) -> str:
    """The deployed metrics reader's token, once the token controller has written it."""

    def token() -> str | None:
        data = (kube.get_or_none(READER_SECRET) or {}).get("data") or {}
        return base64.b64decode(data["token"]).decode() if data.get("token") else None

    return wait_until(token, "the token of cdi-metrics-reader-token", 30, interval=0.5)


def service_account_token(kube: Kube, namespace: str, name: str) -> str:
    """A real ServiceAccount token from the API server (TokenRequest), 10 minutes long."""
    body: dict[str, Any] = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 600},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    return str(kube.create(path, body)["status"]["token"])


def metrics_ca(kube: Kube) -> bytes:
    """The CA of the controller's metrics certificate, as the ServiceMonitor's tlsConfig reads
    it (``ca-bundle.crt`` of the ConfigMap the controller publishes)."""

    def ca() -> bytes | None:
        data = (kube.get_or_none(CA_CONFIG_MAP) or {}).get("data") or {}
        return str(data["ca-bundle.crt"]).encode() if data.get("ca-bundle.crt") else None

    return wait_until(ca, "the controller's metrics certificate", 60, interval=0.5)


class _Verified(http.client.HTTPSConnection):
    """HTTPS to an address, the certificate verified for a name (Prometheus' ``serverName``)."""

    def __init__(self, host: str, port: int, ctx: ssl.SSLContext, server_name: str) -> None:
        super().__init__(host, port, timeout=5, context=ctx)
        self.ctx, self.server_name = ctx, server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self.ctx.wrap_socket(self.sock, server_hostname=self.server_name)


def get(url: str, token: str | None, ca: bytes | None = None) -> tuple[int, str]:
    """(status, body) of a GET, with ``Authorization: Bearer <token>`` when a token is given;
    ``https://`` verified with ``ca`` for the metrics Service's name; (0, reason) when nothing
    answered."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    parts = urllib.parse.urlsplit(url)
    try:
        if parts.scheme == "https":
            ctx = ssl.create_default_context(cadata=(ca or b"").decode() or None)
            conn = _Verified(parts.hostname or "", parts.port or 443, ctx, SERVER_NAME)
            try:
                conn.request("GET", parts.path, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read().decode(errors="replace")
            finally:
                conn.close()
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (OSError, http.client.HTTPException) as e:  # ssl.SSLError; a TLS alert as a head
        return 0, str(e)


def metrics_url(ip: str, port: int = 8080) -> str:
    return f"https://{ip}:{port}/metrics"


def scrape(ip: str, token: str, ca: bytes) -> str | None:
    """A controller replica's exposition at its pod address (HTTPS, as deployed); None unless
    it answered 200."""
    status, body = get(metrics_url(ip), token, ca)
    return body if status == 200 else None
