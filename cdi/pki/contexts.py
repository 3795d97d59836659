"""TLS contexts of the control plane's servers, from PEM key pairs our code generated.

Each serving context takes the TLS profile in force (CDIConfig's, ``cdi.pki.profile``; by
default Intermediate: TLS 1.2 or newer).

- ``serving_context``: what the upload proxy and the token API serve with;
  with ``client_ca`` it also asks for client certificates and verifies them if given (the token
  API: the front proxy's certificate; a request without one is treated as unauthenticated).
- ``required_client_context``: the admission webhook's: with ``client_ca``, no handshake
  completes without a client certificate that CA signed; its ``TLSFiles`` stay open so a
  rotated pair is loaded into the live context.
- ``upstream_context``: the proxy's side of mutual TLS to upload servers: it trusts only the
  upload servers' CA and presents our client certificate (``certs.issue_client``).

``load_pair`` re-loads a rotated key pair into a live context: new handshakes use it.
"""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path

from cdi.api.tlsprofile import INTERMEDIATE, TLSProfile
from cdi.api.tlsprofile import apply as apply_profile
from cdi.pki.certs import KeyPair

UPLOAD_CLIENT_NAME = "client.upload-server.cdi.kubevirt.io"  # CDI's CLIENT_NAME


class TLSFiles:
    """The serving key pair as files for ``SSLContext.load_cert_chain`` (private temp dir)."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="cdi-webhook-")
        self.cert = Path(self._dir.name) / "tls.crt"
        self.key = Path(self._dir.name) / "tls.key"

    def load(self, ctx: ssl.SSLContext, pair: KeyPair) -> None:
        self.cert.write_bytes(pair.cert_pem)
        self.key.touch(mode=0o600)
        self.key.write_bytes(pair.key_pem)
        ctx.load_cert_chain(str(self.cert), str(self.key))

    def close(self) -> None:
        self._dir.cleanup()


def load_pair(ctx: ssl.SSLContext, pair: KeyPair) -> None:
    files = TLSFiles()
    try:
        files.load(ctx, pair)
    finally:
        files.close()


def serving_context(
    pair: KeyPair, client_ca: bytes = b"", profile: TLSProfile = INTERMEDIATE
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    apply_profile(ctx, profile)
    load_pair(ctx, pair)
    if client_ca:
        ctx.load_verify_locations(cadata=client_ca.decode())
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


def required_client_context(
    pair: KeyPair, files: TLSFiles, client_ca: bytes | None, profile: TLSProfile = INTERMEDIATE
) -> ssl.SSLContext:
    """``profile`` with our serving certificate; with ``client_ca``, no handshake completes
    without a client certificate that CA signed."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    apply_profile(ctx, profile)
    files.load(ctx, pair)
    if client_ca is not None:
        ctx.load_verify_locations(cadata=client_ca.decode())
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def upstream_context(server_ca: bytes, client: KeyPair) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cadata=server_ca.decode())
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_pair(ctx, client)
    return ctx
