"""TLS security profiles (CDIConfig ``spec.tlsSecurityProfile``), as CDI takes them.

CDI's field is OpenShift's ``TLSSecurityProfile``: ``type`` ``Old`` | ``Intermediate`` |
``Modern`` | ``Custom``, and for ``Custom`` a ``custom`` object with ``ciphers`` (OpenSSL names)
and ``minTLSVersion`` (``VersionTLS10`` ... ``VersionTLS13``). CDI's rule
(``SelectCipherSuitesAndMinTLSVersion``): no profile is ``Intermediate``; a ``custom`` object wins
whatever the type says; otherwise the named profile's table below (OpenShift's
``config/v1.TLSProfiles``). Every TLS server of the product applies the result: the webhook, the
token API, the upload proxy (``cdi.pki.profile`` follows CDIConfig) and the upload servers (the
controller renders ``TLS_CIPHERS`` and ``TLS_MIN_VERSION`` into their pods, CDI's variables).

Two limits of OpenSSL through Python's ``ssl``, which decide how a profile is applied (``apply``):
- TLS 1.3 suites (the ``TLS_*`` names) cannot be chosen: OpenSSL's three are always offered, which
  is exactly the TLS 1.3 list of every named profile. A ``Custom`` list is applied to TLS 1.2 and
  older only; a custom list with no TLS 1.2 cipher raises the minimum to TLS 1.3.
- OpenSSL's security level (2 on Debian) still refuses TLS 1.0 and 1.1 handshakes, so ``Old``
  gets its cipher list but in practice TLS 1.2 at least. The security level is not lowered for
  it: that would also admit weak keys and SHA-1 signatures. ``docs/security.md`` says so.
An unknown type or version (the CRD's enum should prevent both) falls back to ``Intermediate``,
never to something weaker, and ``select`` says why in ``TLSProfile.note``.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

ENV_CIPHERS: Final = "TLS_CIPHERS"  # CDI's upload server variables: comma-separated names
ENV_MIN_VERSION: Final = "TLS_MIN_VERSION"  # VersionTLS12 ...

_TLS13: Final = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
_INTERMEDIATE12: Final = (
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
    "DHE-RSA-AES128-GCM-SHA256",
    "DHE-RSA-AES256-GCM-SHA384",
)
_OLD_EXTRA: Final = (
    "DHE-RSA-CHACHA20-POLY1305",
    "ECDHE-ECDSA-AES128-SHA256",
    "ECDHE-RSA-AES128-SHA256",
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA384",
    "ECDHE-RSA-AES256-SHA384",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
    "DHE-RSA-AES128-SHA256",
    "DHE-RSA-AES256-SHA256",
    "AES128-GCM-SHA256",
    "AES256-GCM-SHA384",
    "AES128-SHA256",
    "AES256-SHA256",
    "AES128-SHA",
    "AES256-SHA",
    "DES-CBC3-SHA",
)

VERSIONS: Final = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}


@dataclass(frozen=True)
class TLSProfile:
    """What a server applies: the minimum version (CDI's spelling) and the cipher names."""

    min_version: str
    ciphers: tuple[str, ...]
    note: str = ""  # why a given profile was not taken as written ("" when it was)

    def env(self) -> dict[str, str]:
        """CDI's upload-server variables for this profile."""
        return {ENV_CIPHERS: ",".join(self.ciphers), ENV_MIN_VERSION: self.min_version}


PROFILES: Final = {
    "Old": TLSProfile("VersionTLS10", _TLS13 + _INTERMEDIATE12 + _OLD_EXTRA),
    "Intermediate": TLSProfile("VersionTLS12", _TLS13 + _INTERMEDIATE12),
    "Modern": TLSProfile("VersionTLS13", _TLS13),
}
INTERMEDIATE: Final = PROFILES["Intermediate"]


def select(spec: Mapping[str, Any] | None) -> TLSProfile:
    """CDI's choice for a ``tlsSecurityProfile`` object (None or empty: Intermediate)."""
    if not spec:
        return INTERMEDIATE
    custom = spec.get("custom")
    if isinstance(custom, Mapping):
        version = str(custom.get("minTLSVersion") or "")
        ciphers = tuple(str(c) for c in custom.get("ciphers") or () if str(c).strip())
        if version not in VERSIONS:
            return _fallback(f"custom minTLSVersion {version!r} is not one of {sorted(VERSIONS)}")
        if not ciphers:
            return _fallback("a custom profile lists no ciphers")
        return TLSProfile(version, ciphers)
    kind = str(spec.get("type") or "")
    if kind in PROFILES:
        return PROFILES[kind]
    return _fallback(f"profile type {kind!r} is not Old, Intermediate, Modern or Custom")


def _fallback(why: str) -> TLSProfile:
    return TLSProfile(INTERMEDIATE.min_version, INTERMEDIATE.ciphers, note=f"{why}; Intermediate")


def from_env(env: Mapping[str, str]) -> TLSProfile:
    """The profile an upload server's pod was rendered with (neither variable: Intermediate)."""
    version = env.get(ENV_MIN_VERSION, "")
    names = tuple(n for n in env.get(ENV_CIPHERS, "").split(",") if n.strip())
    if not version and not names:
        return INTERMEDIATE
    return select({"custom": {"minTLSVersion": version, "ciphers": list(names)}})


def apply(ctx: ssl.SSLContext, profile: TLSProfile) -> None:
    """Set ``ctx``'s minimum version and its TLS 1.2-and-older ciphers to ``profile``'s (see the
    module docstring for TLS 1.3 suites). Affects handshakes that start afterwards."""
    minimum = VERSIONS.get(profile.min_version, ssl.TLSVersion.TLSv1_2)
    legacy = [c for c in profile.ciphers if not c.startswith("TLS_")]
    usable = [c for c in legacy if _known(c)]
    if minimum < ssl.TLSVersion.TLSv1_3 and not usable:
        minimum = ssl.TLSVersion.TLSv1_3  # nothing to negotiate below 1.3 with
    if usable:
        ctx.set_ciphers(":".join(usable))
    ctx.minimum_version = minimum


def _known(name: str) -> bool:
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        probe.set_ciphers(name)
    except ssl.SSLError:
        return False  # a name this OpenSSL does not have (CDI ignores those too)
    return True
