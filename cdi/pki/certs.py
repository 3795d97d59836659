"""Webhook TLS: a private CA and a serving certificate, generated and rotated by our code.

Pure functions over ``cryptography`` (time is a parameter), so rotation rules are unit-tested
without a cluster or a clock:

- ``new_ca`` / ``issue_serving``: ECDSA P-256 keys, a CA valid for ``ca_validity`` and a serving
  certificate (SANs: the Service DNS names plus any extra names/IPs) valid for ``validity``;
  ``issue_client`` the same for a client certificate (the upload proxy's mutual TLS);
- ``plan_rotation`` decides, from what is stored, whether to keep everything, re-issue the
  serving certificate (near expiry, or SANs changed) or start a new CA (near expiry);
- while a CA is replaced, the published bundle holds both the new and the old CA, so an API
  server that still has the old bundle keeps trusting the old serving certificate and one with
  the new bundle trusts the new one: rotation without a window of failed admissions.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from enum import StrEnum

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALIDITY = dt.timedelta(days=365)
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
    SERVING = "Serving"  # new serving certificate from the same CA
    CA = "CA"  # new CA and serving certificate


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
        .not_valid_before(now - dt.timedelta(minutes=5))
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
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), False)
    )
    return builder, key, ca_key


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


def plan_rotation(bundle: Bundle | None, names: tuple[str, ...], now: dt.datetime) -> Rotation:
    if bundle is None:
        return Rotation.CA
    try:
        ca, serving = bundle.ca.cert, bundle.serving.cert
    except ValueError:
        return Rotation.CA
    if _near_expiry(ca, now):
        return Rotation.CA
    if _near_expiry(serving, now) or _names(serving) != set(names):
        return Rotation.SERVING
    if serving.issuer != ca.subject:
        return Rotation.SERVING
    return Rotation.KEEP


def rotate(
    bundle: Bundle | None, names: tuple[str, ...], now: dt.datetime, ca_name: str = "cdi-webhook-ca"
) -> Bundle | None:
    """The bundle to store after rotation, or None when nothing needs to change."""
    plan = plan_rotation(bundle, names, now)
    if plan == Rotation.KEEP:
        return None
    if plan == Rotation.CA or bundle is None:
        ca = new_ca(ca_name, now)
        previous = b""
        if bundle is not None and _valid_pem(bundle.ca.cert_pem, now):
            previous = bundle.ca.cert_pem
        return Bundle(ca, issue_serving(ca, names, now), previous)
    previous = bundle.previous_ca_pem if _valid_pem(bundle.previous_ca_pem, now) else b""
    return Bundle(bundle.ca, issue_serving(bundle.ca, names, now), previous)


def _valid_pem(pem: bytes, now: dt.datetime) -> bool:
    if not pem:
        return False
    try:
        return x509.load_pem_x509_certificate(pem).not_valid_after_utc > now
    except ValueError:
        return False
