"""Scraping the installed controller's ``/metrics`` as Prometheus does since CDI's #4121: with a
bearer token (``cdi.controller.metrics_auth``). The token is the one the ServiceMonitor in
``deploy/optional/monitoring.yaml`` sends: Secret ``cdi-metrics-reader-token`` of the
ServiceAccount ``cdi-metrics-reader`` (``deploy/17-rbac-metrics.yaml``), filled in by the
cluster's token controller; or a short-lived one from a TokenRequest."""

from __future__ import annotations

import base64
import urllib.error
import urllib.request
from typing import Any

from testkit.kubeclient import Kube
from testkit.waiting import wait_until

READER_SECRET = "/api/v1/namespaces/cdi/secrets/cdi-metrics-reader-token"


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


def get(url: str, token: str | None) -> tuple[int, str]:
    """(status, body) of a GET, with ``Authorization: Bearer <token>`` when a token is given;
    (0, reason) when nothing answered."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return 0, str(e)


def scrape(ip: str, token: str, port: int = 8080) -> str | None:
    """A controller replica's exposition at its pod address; None unless it answered 200."""
    status, body = get(f"http://{ip}:{port}/metrics", token)
    return body if status == 200 else None
