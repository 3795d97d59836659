"""CDIConfig's tlsSecurityProfile: CDI's choice of profile, and real handshakes in memory against a
context it was applied to (TLS versions and TLS 1.2 ciphers refused or taken)."""

from __future__ import annotations

import datetime as dt
import ssl

import pytest

from cdi.api import tlsprofile
from cdi.api.config import CDIConfig
from cdi.api.tlsprofile import INTERMEDIATE, PROFILES, TLSProfile, apply, from_env, select
from cdi.pki.certs import KeyPair, issue_serving, new_ca
from cdi.pki.contexts import serving_context

NOW = dt.datetime.now(dt.UTC)
CA = new_ca("test-ca", NOW)
PAIR: KeyPair = issue_serving(CA, ("server.test",), NOW)


def handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """Run a TLS handshake through memory BIOs; the negotiated cipher, or the error's text."""
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_hostname="server.test")
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, end in (("c", cli), ("s", srv)):
            if done[name]:
                continue
            try:
                end.do_handshake()
                done[name] = True
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                pass
            except ssl.SSLError as exc:
                return f"error: {exc.reason or exc}"
        if c_out.pending:
            s_in.write(c_out.read())
        if s_out.pending:
            c_in.write(s_out.read())
        if all(done.values()):
            return str(cli.cipher()[0])
    return "error: no progress"


def client(maximum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3, ciphers: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cadata=CA.cert_pem.decode())
    ctx.maximum_version = maximum
    if ciphers:
        ctx.set_ciphers(ciphers)
    return ctx


def test_no_profile_is_intermediate_as_in_cdi() -> None:
    assert select(None) == INTERMEDIATE
    assert select({}) == INTERMEDIATE
    assert CDIConfig().tls_profile == INTERMEDIATE


@pytest.mark.parametrize("kind", ["Old", "Intermediate", "Modern"])
def test_a_named_profile_is_openshifts_table(kind: str) -> None:
    assert select({"type": kind, kind.lower(): {}}) == PROFILES[kind]


def test_a_custom_object_wins_whatever_the_type_says() -> None:
    chosen = select(
        {
            "type": "Modern",
            "custom": {
                "ciphers": ["ECDHE-ECDSA-AES128-GCM-SHA256"],
                "minTLSVersion": "VersionTLS12",
            },
        }
    )
    assert chosen == TLSProfile("VersionTLS12", ("ECDHE-ECDSA-AES128-GCM-SHA256",))


@pytest.mark.parametrize(
    "spec, why",
    [
        ({"type": "Lenient"}, "'Lenient' is not Old"),
        ({"type": "Custom", "custom": {"ciphers": ["X"], "minTLSVersion": "SSLv3"}}, "'SSLv3'"),
        ({"type": "Custom", "custom": {"ciphers": [], "minTLSVersion": "VersionTLS12"}}, "no ciph"),
    ],
)
def test_a_profile_that_makes_no_sense_falls_back_to_intermediate_and_says_why(
    spec: dict[str, object], why: str
) -> None:
    chosen = select(spec)
    assert (chosen.min_version, chosen.ciphers) == (INTERMEDIATE.min_version, INTERMEDIATE.ciphers)
    assert why in chosen.note


@pytest.mark.parametrize(
    "profile",
    [
        PROFILES["Modern"],
        select(
            {
                "custom": {
                    "ciphers": ["ECDHE-RSA-AES128-GCM-SHA256"],
                    "minTLSVersion": "VersionTLS11",
                }
            }
        ),
    ],
)
def test_the_upload_server_variables_carry_the_profile(profile: TLSProfile) -> None:
    assert from_env(profile.env()) == profile
    assert from_env({}) == INTERMEDIATE


def test_modern_refuses_a_tls12_client_and_takes_a_tls13_one() -> None:
    server = serving_context(PAIR, profile=PROFILES["Modern"])
    assert handshake(server, client(ssl.TLSVersion.TLSv1_2)) == "error: UNSUPPORTED_PROTOCOL"
    assert handshake(server, client()).startswith("TLS_")


def test_intermediate_takes_a_tls12_client_with_an_aead_cipher_and_refuses_cbc() -> None:
    server = serving_context(PAIR)
    assert handshake(server, client(ssl.TLSVersion.TLSv1_2)) == "ECDHE-ECDSA-AES128-GCM-SHA256"
    refused = handshake(server, client(ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES128-SHA256"))
    assert refused.startswith("error")


def test_a_custom_cipher_list_is_the_only_tls12_cipher_served() -> None:
    only = "ECDHE-ECDSA-AES128-GCM-SHA256"
    server = serving_context(
        PAIR, profile=select({"custom": {"ciphers": [only], "minTLSVersion": "VersionTLS12"}})
    )
    assert handshake(server, client(ssl.TLSVersion.TLSv1_2)) == only
    other = handshake(server, client(ssl.TLSVersion.TLSv1_2, "ECDHE-ECDSA-AES256-GCM-SHA384"))
    assert other.startswith("error")


def test_a_custom_list_of_tls13_suites_only_raises_the_minimum_to_tls13() -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    apply(ctx, TLSProfile("VersionTLS12", ("TLS_AES_128_GCM_SHA256",)))
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_3


def test_names_this_openssl_lacks_are_ignored_like_cdi_does() -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    apply(ctx, TLSProfile("VersionTLS12", ("NO-SUCH-CIPHER", "ECDHE-RSA-AES128-GCM-SHA256")))
    names = {c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert names == {"ECDHE-RSA-AES128-GCM-SHA256"}
    assert tlsprofile._known("ECDHE-RSA-AES128-GCM-SHA256")
