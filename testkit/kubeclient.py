"""A thin JSON view of the ``kubernetes`` client for the harness, the node and the provisioner.

The node agent and the provisioner read and write deeply nested pod, PV and PVC objects; plain
dicts in the API's own camelCase are easier to follow there than generated model classes. This
module sends requests through ``kubernetes.client.ApiClient`` (so TLS, tokens and kubeconfig
handling are the official client's) and maps HTTP errors to :class:`ApiError` once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kubernetes import client, config

JSON = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(Exception):
    """The API server answered with an error status."""

    def __init__(self, status: int, body: JSON | None, text: str) -> None:
        self.status = status
        self.body = body or {}
        self.reason = str(self.body.get("reason", ""))
        super().__init__(f"HTTP {status} {self.reason}: {self.body.get('message', text)}")

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409


def api_client(kubeconfig: Path, context: str | None = None) -> client.ApiClient:
    """An official ``ApiClient`` configured from a kubeconfig file."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), context=context, client_configuration=cfg)
    return client.ApiClient(cfg)


class Kube:
    """JSON requests against one API server with one identity."""

    def __init__(self, api: client.ApiClient, timeout: float = 30.0) -> None:
        self.api = api
        self.timeout = timeout

    @classmethod
    def from_kubeconfig(cls, path: Path, context: str | None = None) -> Kube:
        return cls(api_client(path, context))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        method_, url, hdrs, body_, post = self.api.param_serialize(
            method=method,
            resource_path=path,
            query_params=params or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        resp = self.api.call_api(
            method_,
            url,
            header_params=hdrs,
            body=body_,
            post_params=post,
            _request_timeout=timeout or self.timeout,
        )
        raw = resp.read() or b""
        text = raw.decode("utf-8", "replace")
        try:
            data = json.loads(text) if text else {}
        except ValueError:
            data = {"message": text}
        if resp.status >= 400:
            raise ApiError(resp.status, data if isinstance(data, dict) else None, text)
        return data if isinstance(data, dict) else {"items": data}

    def get(self, path: str, **query: Any) -> JSON:
        return self.request("GET", path, query=query)

    def create(self, path: str, body: JSON) -> JSON:
        return self.request("POST", path, body)

    def replace(self, path: str, body: JSON) -> JSON:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> JSON:
        return self.request("PATCH", path, body, content_type=content_type)

    def delete(self, path: str, body: JSON | None = None) -> JSON:
        return self.request("DELETE", path, body)

    def get_or_none(self, path: str) -> JSON | None:
        try:
            return self.get(path)
        except ApiError as e:
            if e.not_found:
                return None
            raise

    def delete_ignore_missing(self, path: str, body: JSON | None = None) -> None:
        try:
            self.delete(path, body)
        except ApiError as e:
            if not e.not_found:
                raise


def ns_path(namespace: str, resource: str, name: str = "", sub: str = "") -> str:
    """Path of a namespaced core/v1 object (``resource`` plural), optional subresource."""
    path = f"/api/v1/namespaces/{quote(namespace)}/{resource}"
    if name:
        path += f"/{quote(name)}"
    if sub:
        path += f"/{sub}"
    return path
