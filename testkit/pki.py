"""Certificates and keys for the test control plane and for test webhook servers.

Everything is generated with the ``cryptography`` package at start-up, so a cluster needs no
checked-in secrets: one CA (made as the product makes its CAs, ``cdi.pki.certs``) signs the
API server's serving certificate and any serving certificate a test asks for (webhooks); an
RSA key pair signs service-account tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cdi.pki import certs

_VALIDITY = dt.timedelta(days=2)


def _new_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _key_pem(key: rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


class KeyPair(certs.KeyPair):
    """A PEM certificate (or public key) and its PEM private key, written as files."""

    def write(self, cert_path: Path, key_path: Path) -> tuple[Path, Path]:
        cert_path.write_bytes(self.cert_pem)
        key_path.write_bytes(self.key_pem)
        key_path.chmod(0o600)
        return cert_path, key_path


class CertificateAuthority:
    """A self-signed CA (the product's, ``cdi.pki.certs.new_ca``) that issues serving and client
    certificates with RSA keys (the registry's token signer signs RS256 with its key)."""

    def __init__(self, common_name: str = "testkit-ca") -> None:
        ca = certs.new_ca(common_name, dt.datetime.now(dt.UTC), _VALIDITY)
        key = serialization.load_pem_private_key(ca.key_pem, None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        self._key = key
        self._cert = ca.cert
        self._name = self._cert.subject

    @property
    def cert_pem(self) -> bytes:
        return self._cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        dns_names: tuple[str, ...] = (),
        ips: tuple[str, ...] = (),
        organizations: tuple[str, ...] = (),
        client: bool = False,
    ) -> KeyPair:
        """A leaf certificate for a server (SANs) or, with ``client=True``, a client."""
        key = _new_key()
        now = dt.datetime.now(dt.UTC)
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
        usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attrs))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + _VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def signing_key_pair() -> KeyPair:
    """An RSA key pair for service-account tokens: ``cert_pem`` holds the public key."""
    key = _new_key()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return KeyPair(public, _key_pem(key))
