"""Who may call the admission webhook: the API server, proven by its client certificate.

An AdmissionReview carries who asked (``userInfo``) and where (``namespace``), and the webhook
acts on both: it looks up objects as that user may see them, answers clone rights for them and
signs them as the requester (``cdi.api.requester``). That is only sound when the review comes
from the API server. Anyone else who reaches the webhook's Service could name any user,
``system:masters`` included (security review finding N2). So the webhook requires a client
certificate at the TLS layer (``cdi.admission``: ``CERT_REQUIRED`` against the CA it was given)
and ``ApiServerCaller`` then checks that the certificate's common name is one of the names
configured for the API server: a certificate from the same CA made out to someone else is
refused with 403 before the review is read.

The API server presents that certificate when its ``--admission-control-config-file`` gives a
``WebhookAdmissionConfiguration`` kubeconfig with a client certificate for the webhook's
Service host (``cdi-webhook.cdi.svc``); ``docs/security.md`` says how to set it up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from aiohttp import web


def common_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The subject CN of a verified peer certificate (``SSLObject.getpeercert()``)."""
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class ApiServerCaller:
    """The check every request passes: a client certificate the TLS layer verified, made out
    to one of ``allowed_names`` (empty: any certificate the configured CA signed, as the
    kube-apiserver treats an empty ``--requestheader-allowed-names``). The names may be
    replaced while serving (``update``), as the CA's published settings change."""

    def __init__(self, allowed_names: Iterable[str] = ()) -> None:
        self.allowed_names = tuple(allowed_names)

    def update(self, allowed_names: Iterable[str]) -> None:
        self.allowed_names = tuple(allowed_names)

    def admits(self, peercert: Mapping[str, Any] | None) -> bool:
        name = common_name(peercert)
        if name is None:
            return False
        return not self.allowed_names or name in self.allowed_names

    def __call__(self, request: web.Request) -> bool:
        transport = request.transport
        return self.admits(transport.get_extra_info("peercert") if transport else None)
