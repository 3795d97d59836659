"""The import network policy as a pure function: every spelling of an address is judged as the
address it names, metadata and link-local can never be allowed, restricted ranges only when an
allowed CIDR covers them."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi.api.netpolicy import LOOPBACK, PRIVATE, NetPolicy, forms, parse_address, parse_cidrs

ALLOW_ALL = NetPolicy.parse(["0.0.0.0/0", "::/0"])
STRICT = NetPolicy()
v4 = st.integers(0, 2**32 - 1).map(ipaddress.IPv4Address)


def _in(cidr: str) -> st.SearchStrategy[ipaddress.IPv4Address]:
    net = ipaddress.IPv4Network(cidr)
    return st.integers(int(net.network_address), int(net.broadcast_address)).map(
        ipaddress.IPv4Address
    )


def _spellings(address: ipaddress.IPv4Address) -> list[str]:
    """What inet_aton (and so getaddrinfo) accepts for ``address``, and the IPv6 embeddings."""
    n = int(address)
    a, b, c, d = address.packed
    return [
        str(n),
        hex(n),
        f"0{n:o}",
        ".".join(f"0{x:o}" for x in (a, b, c, d)),
        ".".join(hex(x) for x in (a, b, c, d)),
        f"{a}.{n & 0xFFFFFF}",
        f"{a}.{b}.{n & 0xFFFF}",
        f"::ffff:{address}",
        f"[::ffff:{n >> 16:x}:{n & 0xFFFF:x}]",
    ]


@given(v4)
def test_every_inet_aton_spelling_parses_to_the_same_address(
    address: ipaddress.IPv4Address,
) -> None:
    for text in _spellings(address)[:7]:
        assert parse_address(text) == address, text


@given(_in("169.254.0.0/16"))
def test_link_local_is_refused_in_every_form_even_when_everything_is_allowed(
    address: ipaddress.IPv4Address,
) -> None:
    n = int(address)
    embedded = [
        f"2002:{n >> 16:x}:{n & 0xFFFF:x}::1",  # 6to4
        f"64:ff9b::{address}",  # NAT64 well-known prefix
        f"::{n >> 16:x}:{n & 0xFFFF:x}",  # IPv4-compatible
    ]
    for text in [*_spellings(address), *embedded]:
        assert ALLOW_ALL.refusal(text) == "metadata or link-local address", text


@pytest.mark.parametrize(
    "text",
    [
        "169.254.169.254",
        "2852039166",
        "0251.0376.0251.0376",
        "0xa9fea9fe",
        "0xA9.0xFE.0xA9.0xFE",
        "169.254.43518",
        "::ffff:a9fe:a9fe",
        "::ffff:169.254.169.254",
        "fd00:ec2::254",
        "[fd00:ec2::254]",
        "fe80::1%eth0",
        "100.100.100.200",
        "0.0.0.0",
        "0",
        "::",
        "2001:0:4136:e378:8000:63bf:5601:5601",  # Teredo, client 169.254.169.254 obfuscated
    ],
)
def test_metadata_addresses_are_refused_whatever_is_allowed(text: str) -> None:
    assert ALLOW_ALL.refusal(text) == "metadata or link-local address"


@given(st.sampled_from(["127.0.0.0/8", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"]), st.data())
def test_private_ranges_are_refused_by_default_and_allowed_when_listed(
    cidr: str, data: st.DataObject
) -> None:
    address = data.draw(_in(cidr))
    for text in _spellings(address):
        assert STRICT.refusal(text) == "restricted address outside the allowed source CIDRs", text
        assert NetPolicy.parse([cidr]).allows(text), text
        assert NetPolicy.parse(PRIVATE).allows(text), text


@pytest.mark.parametrize(
    "text",
    ["100.64.0.1", "fc00::1", "fd12:3456::1", "224.0.0.1", "239.1.2.3", "ff02::1", "::1",
     "240.0.0.1", "192.0.2.1", "64:ff9b::a00:1", "2002:a00:1::1", "127.1", "0x7f000001"],
)  # fmt: skip
def test_restricted_ranges_and_their_embeddings_are_refused_by_default(text: str) -> None:
    assert STRICT.refusal(text) == "restricted address outside the allowed source CIDRs"


@pytest.mark.parametrize(
    "text", ["8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808", "134744072"]
)
def test_public_addresses_are_allowed(text: str) -> None:
    assert STRICT.allows(text)


def test_cluster_ranges_are_refused_even_when_public_unless_allowed() -> None:
    policy = NetPolicy.parse(cluster=["203.0.113.0/24", "198.51.100.7"])
    assert not policy.allows("203.0.113.9")
    assert not policy.allows("::ffff:203.0.113.9")
    assert not policy.allows("198.51.100.7")
    assert NetPolicy.parse(["203.0.113.0/25"], ["203.0.113.0/24"]).allows("203.0.113.9")


def test_loopback_allowance_covers_both_families_and_nothing_else() -> None:
    policy = NetPolicy.parse(LOOPBACK)
    assert policy.allows("127.0.0.2") and policy.allows("::1") and policy.allows("127.1")
    assert not policy.allows("10.0.0.1") and not policy.allows("169.254.169.254")


@pytest.mark.parametrize(
    "text",
    ["example.com", "1.2.3.4.5", "256.1.1.1", "08.1.1.1", "1..2", "0x1_0", "+1", "", "\u0661"],
)
def test_names_and_malformed_literals_are_not_addresses(text: str) -> None:
    assert parse_address(text) is None
    assert STRICT.refusal(text) == "not an address"


def test_embedded_forms_are_all_reported() -> None:
    teredo = ipaddress.IPv6Address("2001:0:4136:e378:8000:63bf:3fff:fdd2")
    assert {str(a) for a in forms(teredo)} == {str(teredo), "65.54.227.120", "192.0.2.45"}
    assert forms(ipaddress.IPv6Address("::ffff:1.2.3.4")) == (ipaddress.IPv4Address("1.2.3.4"),)


def test_bad_cidrs_are_named_in_the_error() -> None:
    assert parse_cidrs(["10.0.0.1/8", " ", "fd00::/8"]) == (
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("fd00::/8"),
    )
    with pytest.raises(ValueError, match=r"'10\.0\.0\.0/33' is not a CIDR"):
        parse_cidrs(["10.0.0.0/33"])


def test_env_round_trip() -> None:
    policy = NetPolicy.parse(["127.0.0.0/8", "fd00::/8"], ["10.96.0.0/12"])
    allowed, cluster = policy.to_env()
    assert NetPolicy.parse(allowed.split(","), cluster.split(",")) == policy
