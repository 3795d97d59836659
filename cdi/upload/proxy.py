"""The upload proxy's rules: CDI's ``cdi-uploadproxy`` checks, routes, headers and refusals.

``Gate.admit(authorization, path)`` runs CDI's checks in CDI's order (``uploadproxy.go``):
``Authorization`` missing or not ``Bearer <token>`` -> 400; token invalid -> 401; a valid
token that is not an upload token -> 400; then the PVC checks of ``readiness.py`` (503 with
CDI's messages); an archive PVC is sent to ``upload-archive``, another content type -> 503.
It answers where the request goes (``Admitted``: the PVC's upload server and path) or raises
the typed refusal. Refusal bodies are HTML-escaped (CDI's XSS test, ``refusal_body``).

The checks stay async: the token keys and the PVCs are read through the injected async
``UploadTargets`` and verifier, on the process's event loop. The bytes do not go through that
loop: ``proxyserver.py`` serves each connection on its own thread with a blocking TLS socket
and asks the gate on the loop (``asyncio.run_coroutine_threadsafe``), then ``relay.py`` moves
the body. HEAD and PATCH go through the same checks, so tus 1.0 core (HEAD answers
``Upload-Offset``, PATCH continues there) works through the proxy on the same token; CORS
preflights (OPTIONS) are answered by the server and every response to a request with an
``Origin`` carries ``Access-Control-Allow-Origin: *`` (CDI's ``cors.AllowAll``).
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from cdi.api.constants import ANN_CONTENT_TYPE
from cdi.upload.errors import BadUploadRequest, UploadError, UploadNotReady
from cdi.upload.readiness import PVC, UploadTargets, wait_for_upload_target
from cdi.upload.token import UploadGrant

log = logging.getLogger(__name__)

UPLOAD_PATHS = tuple(
    f"/{version}/{kind}"
    for version in ("v1beta1", "v1alpha1")
    for kind in ("upload", "upload-async", "upload-form", "upload-form-async")
)
RELAYED_METHODS = ("POST", "HEAD", "PATCH")
PREFLIGHT_METHODS = "HEAD, GET, POST, PATCH, OPTIONS"
_BEARER = r"(?i)^Bearer\s+([A-Za-z0-9\-\._~\+\/]+)$"
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "Proxy-Connection",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Content-Length",  # the relay writes the framing header itself
        "Upgrade",
        "Expect",  # answered by the proxy itself (100 Continue once the upload is admitted)
    )
)
# Not passed to the upload server: our own routing and credentials, and CDI's clone marker:
# only the cloner, talking to the upload server directly, may ask for the clone stream
# decoding; an uploader must not select it through the proxy.
NOT_FORWARDED = HOP_BY_HOP | {"host", "authorization", "x-cdi-content-type"}
CORS_EXPOSED = "Upload-Offset, Upload-Length, Tus-Resumable, Tus-Version, Location"
TokenVerifier = Callable[[str], Awaitable[UploadGrant]]


@dataclass(frozen=True)
class ProxyConfig:
    ready_timeout: float = 10.0
    ready_interval: float = 1.0
    idle_timeout: float = 300.0  # seconds without a body byte before the request is dropped
    response_timeout: float = 24 * 3600.0
    connect_timeout: float = 10.0
    dial_retry: float = 10.0  # how long a refused or reset dial of the upload server is retried
    dial_retry_interval: float = 0.5
    # Totals, not per receive (security review 3, N3): a watchdog shuts the socket.
    handshake_timeout: float = 10.0  # the TLS handshake
    head_timeout: float = 30.0  # a request head (or the next one on a kept-alive connection)
    write_timeout: float = 30.0  # each answer the proxy writes to a client that stops reading
    shutdown_grace: float = 20.0  # uploads in flight may finish this long after SIGTERM
    max_connections: int = 512  # sized to the pod's 256Mi limit: docs/security.md, N3
    max_connections_per_address: int = 32  # 0: no cap (one address for all: an ingress)


@dataclass(frozen=True)
class Admitted:
    """Where an admitted request goes: ``url`` is ``https://host:port`` of the PVC's upload
    server, ``server_hostname`` the name its certificate must carry, ``path`` the endpoint."""

    url: str
    server_hostname: str | None
    path: str


def bearer_token(header: str | None) -> str:
    if not header:
        raise BadUploadRequest("missing Authorization header")
    match = re.match(_BEARER, header)
    if match is None:
        raise BadUploadRequest("the Authorization header is not 'Bearer <token>'")
    return match.group(1)


def upload_path(pvc: PVC, name: str, path: str) -> str:
    """CDI's ``resolveUploadPath``: archive PVCs go to the archive endpoint."""
    content_type = ((pvc.get("metadata") or {}).get("annotations") or {}).get(ANN_CONTENT_TYPE)
    if not content_type or content_type == "kubevirt":
        return path
    if content_type == "archive":
        version = "v1alpha1" if path.startswith("/v1alpha1/") else "v1beta1"
        return f"/{version}/upload-archive"
    raise UploadNotReady(
        f"rejecting upload request for PVC {name} - upload content-type {content_type} is invalid"
    )


def refusal_body(err: UploadError) -> bytes:
    return html.escape(err.message).encode()


def forwarded(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The end-to-end headers of a request (to the upload server)."""
    return [(k, v) for k, v in headers if k.lower() not in NOT_FORWARDED]


def answered(headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The end-to-end headers of the upload server's answer (to the uploader)."""
    return [(k, v) for k, v in headers if k.lower() not in HOP_BY_HOP]


def cors(origin: str | None) -> list[tuple[str, str]]:
    if origin is None:
        return []
    return [
        ("Access-Control-Allow-Origin", "*"),
        ("Access-Control-Expose-Headers", CORS_EXPOSED),
    ]


class Gate:
    """CDI's checks for one upload request, on the event loop (the cluster reads are async)."""

    def __init__(self, targets: UploadTargets, verify: TokenVerifier, config: ProxyConfig) -> None:
        self.targets, self.verify, self.config = targets, verify, config

    async def admit(self, authorization: str | None, path: str) -> Admitted:
        grant = await self.verify(bearer_token(authorization))
        pvc = await wait_for_upload_target(
            self.targets,
            grant,
            limit=self.config.ready_timeout,
            interval=self.config.ready_interval,
        )
        target_path = upload_path(pvc, grant.name, path)
        pvc_name = str((pvc.get("metadata") or {}).get("name") or grant.name)
        server = await self.targets.upload_server(grant.namespace, pvc_name)
        log.info("upload to PVC %s/%s via %s", grant.namespace, grant.name, server.url)
        return Admitted(server.url, server.server_hostname, target_path)
