"""Webhook TLS: a private CA and a serving certificate, generated and rotated by our code.

Pure functions over ``cryptography`` (time is a parameter), so rotation rules are unit-tested
without a cluster or a clock:

- ``new_ca`` / ``issue_serving``: ECDSA P-256 keys, a CA valid for ``ca_validity`` and a serving
  certificate (SANs: the Service DNS names plus any extra names/IPs) valid for ``validity``;
  ``issue_client`` the same for a client certificate (the upload proxy's mutual TLS);
- ``plan_rotation`` decides, from what is stored and the CA's ``Lifetime`` (the CDI resource's
  ``certConfig.ca``: ``duration`` and ``renewBefore``), the one step to take now; ``rotate``
  takes it. A CA is replaced in stages, so no client ever meets a certificate its bundle does
  not trust:

  1. ``STAGE``: the CA is due (``renewBefore`` before its end) or lives longer than
     ``certConfig.ca.duration`` asks: a new CA becomes the signer *and enters the published
     bundle beside the old one*, but signs nothing yet; the serving certificate stays the old
     CA's. Clients that take the bundle from now on trust both.
  2. ``SERVING``: once the new CA has been in the bundle for ``stage`` (half its
     ``renewBefore``), the serving certificate is re-issued by it. A client that took the
     bundle at any time since step 1 trusts it. (Sooner only when the old CA's certificate
     is itself near its end: the old CA's key is not kept, and an expiring certificate would
     fail every client anyway.)
  3. ``DROP``: the old CA leaves the bundle when it has expired, or when the certificate it
     signed has been replaced for ``stage`` (every replica re-reads the Secret well within
     that: ``check_interval``), so nothing it signed is still presented.

  ``CA`` (a new CA and serving certificate at once) only when there is nothing to overlap
  with: no bundle yet, an unreadable one, or a CA already expired.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cdi.api.cdiresource import DEFAULT_CA, Lifetime

CA_VALIDITY = dt.timedelta(days=365)
ISSUED_EARLY = dt.timedelta(minutes=5)  # every certificate is valid from 5 minutes before issue
SERVING_VALIDITY = dt.timedelta(days=30)
RENEW_BEFORE = 0.2  # renew when less than this share of the lifetime is left


@dataclass(frozen=True)
class KeyPair:
    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True)
class Bundle:
    """What the certificate Secret holds."""

    ca: KeyPair
    serving: KeyPair
    previous_ca_pem: bytes = b""  # kept in the published bundle while a new CA takes over

    @property
    def ca_bundle(self) -> bytes:
        return self.ca.cert_pem + self.previous_ca_pem


class Rotation(StrEnum):
    KEEP = "Keep"
    SERVING = "Serving"  # new serving certificate from the current CA
    CA = "CA"  # new CA and serving certificate (nothing to overlap with)
    STAGE = "Stage"  # new CA into the bundle, beside the old one; it signs nothing yet
    DROP = "Drop"  # the previous CA out of the bundle


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def new_ca(name: str, now: dt.datetime, validity: dt.timedelta = CA_VALIDITY) -> KeyPair:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - ISSUED_EARLY)
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def _san(names: tuple[str, ...]) -> x509.SubjectAlternativeName:
    entries: list[x509.GeneralName] = []
    for name in names:
        try:
            entries.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            entries.append(x509.DNSName(name))
    return x509.SubjectAlternativeName(entries)


def _issue(
    ca: KeyPair,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    now: dt.datetime,
    validity: dt.timedelta,
) -> tuple[x509.CertificateBuilder, ec.EllipticCurvePrivateKey, ec.EllipticCurvePrivateKey]:
    """A leaf builder signed by ``ca`` (not yet signed), its new key and the CA key."""
    ca_cert = ca.cert
    ca_key = serialization.load_pem_private_key(ca.key_pem, None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = _key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - ISSUED_EARLY)
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), False)
        # which CA signed it: a new CA has the old one's name, and while both are trusted
        # a verifier picks the issuer by this (OpenSSL would try the first of the name)
        .add_extension(_authority_key_id(ca_cert), False)
    )
    return builder, key, ca_key


def _authority_key_id(ca: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        public = ca.public_key()
        assert isinstance(public, ec.EllipticCurvePublicKey)
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(public)
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)


def issue_serving(
    ca: KeyPair,
    names: tuple[str, ...],
    now: dt.datetime,
    validity: dt.timedelta = SERVING_VALIDITY,
) -> KeyPair:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    builder, key, ca_key = _issue(ca, subject, ExtendedKeyUsageOID.SERVER_AUTH, now, validity)
    cert = builder.add_extension(_san(names), critical=False).sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def issue_client(
    ca: KeyPair,
    common_name: str,
    now: dt.datetime,
    validity: dt.timedelta = SERVING_VALIDITY,
) -> KeyPair:
    """A client certificate (for mutual TLS, e.g. upload proxy -> upload server)."""
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder, key, ca_key = _issue(ca, subject, ExtendedKeyUsageOID.CLIENT_AUTH, now, validity)
    cert = builder.sign(ca_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _pem(key))


def service_names(service: str, namespace: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    base = (
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
        service,
    )
    return base + tuple(n for n in extra if n not in base)


def _near_expiry(cert: x509.Certificate, now: dt.datetime, share: float = RENEW_BEFORE) -> bool:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return now >= end - (end - start) * share


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n) for n in san.get_values_for_type(x509.DNSName)} | {
        str(ip) for ip in san.get_values_for_type(x509.IPAddress)
    }


def stage_of(ca: Lifetime) -> dt.timedelta:
    """How long a new CA is in the bundle before it signs, and an old one stays after the
    certificate it signed was replaced: half the CA's ``renewBefore``."""
    return ca.renew_before / 2


def _issued_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """``cert`` carries ``ca``'s signature (a new CA has the old one's name: names do not tell)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _age(cert: x509.Certificate, now: dt.datetime) -> dt.timedelta:
    return now - (cert.not_valid_before_utc + ISSUED_EARLY)


def _ca_due(ca: x509.Certificate, life: Lifetime, now: dt.datetime) -> bool:
    """Due by ``life``, or longer-lived than ``life`` asks (``certConfig.ca`` shortened)."""
    start, end = ca.not_valid_before_utc, ca.not_valid_after_utc
    longer = end - start - ISSUED_EARLY > life.duration + dt.timedelta(seconds=1)
    return longer or life.due(start, end, now)


def plan_rotation(
    bundle: Bundle | None, names: tuple[str, ...], now: dt.datetime, ca_life: Lifetime = DEFAULT_CA
) -> Rotation:
    if bundle is None:
        return Rotation.CA
    try:
        ca, serving = bundle.ca.cert, bundle.serving.cert
    except ValueError:
        return Rotation.CA
    if now >= ca.not_valid_after_utc:
        return Rotation.CA  # nothing left to overlap with
    stage = stage_of(ca_life)
    previous = _previous(bundle, now)
    by_ca = _issued_by(serving, ca)
    if not by_ca and previous is not None and _issued_by(serving, previous):
        # staged: the new CA is in the bundle; it signs once every client could have it
        if _age(ca, now) >= stage or _near_expiry(serving, now) or _names(serving) != set(names):
            return Rotation.SERVING
        return Rotation.KEEP
    expired = now >= serving.not_valid_after_utc
    if not by_ca or expired or _names(serving) != set(names):
        return Rotation.SERVING
    if bundle.previous_ca_pem and (previous is None or _age(serving, now) >= stage):
        return Rotation.DROP
    if previous is None and _ca_due(ca, ca_life, now):
        return Rotation.STAGE  # first: a serving certificate near the CA's end needs a new CA
    if _near_expiry(serving, now):
        return Rotation.SERVING
    return Rotation.KEEP


def _previous(bundle: Bundle, now: dt.datetime) -> x509.Certificate | None:
    """The previous CA while it is still valid."""
    if not _valid_pem(bundle.previous_ca_pem, now):
        return None
    return x509.load_pem_x509_certificate(bundle.previous_ca_pem)


def rotate(
    bundle: Bundle | None,
    names: tuple[str, ...],
    now: dt.datetime,
    ca_name: str = "cdi-webhook-ca",
    ca_life: Lifetime = DEFAULT_CA,
) -> Bundle | None:
    """The bundle to store after this step of rotation, or None when nothing needs to change."""
    plan = plan_rotation(bundle, names, now, ca_life)
    if plan == Rotation.KEEP:
        return None
    if plan == Rotation.CA or bundle is None:
        ca = new_ca(ca_name, now, ca_life.duration)
        return Bundle(ca, issue_serving(ca, names, now), b"")
    if plan == Rotation.STAGE:
        return Bundle(new_ca(ca_name, now, ca_life.duration), bundle.serving, bundle.ca.cert_pem)
    if plan == Rotation.DROP:
        return Bundle(bundle.ca, bundle.serving, b"")
    previous = bundle.previous_ca_pem if _valid_pem(bundle.previous_ca_pem, now) else b""
    return Bundle(bundle.ca, issue_serving(bundle.ca, names, now), previous)


def _valid_pem(pem: bytes, now: dt.datetime) -> bool:
    if not pem:
        return False
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc > now
    except ValueError:
        return False
