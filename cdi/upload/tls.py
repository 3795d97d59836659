"""TLS contexts of the upload control plane, from PEM key pairs our code generated.

- ``serving_context``: what the proxy and the token API serve with (TLS 1.2 or newer); with
  ``client_ca`` it also asks for client certificates and verifies them if given (the token
  API: the front proxy's certificate; a request without one is treated as unauthenticated).
- ``upstream_context``: the proxy's side of mutual TLS to upload servers: it trusts only the
  upload servers' CA and presents our client certificate (``certs.issue_client``).

``load_pair`` re-loads a rotated key pair into a live context: new handshakes use it.
"""

from __future__ import annotations

import ssl

from cdi.admission import TLSFiles
from cdi.webhooks.certs import KeyPair

UPLOAD_CLIENT_NAME = "client.upload-server.cdi.kubevirt.io"  # CDI's CLIENT_NAME


def load_pair(ctx: ssl.SSLContext, pair: KeyPair) -> None:
    files = TLSFiles()
    try:
        files.load(ctx, pair)
    finally:
        files.close()


def serving_context(pair: KeyPair, client_ca: bytes = b"") -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pair(ctx, pair)
    if client_ca:
        ctx.load_verify_locations(cadata=client_ca.decode())
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def upstream_context(server_ca: bytes, client: KeyPair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=server_ca.decode())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pair(ctx, client)
    return ctx
