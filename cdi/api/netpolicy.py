"""Which network addresses an import may connect to: a pure policy, shared by the controller
(which renders it into the importer pod) and the importer (which applies it to every socket).

Why it exists: a DataVolume URL, or any redirect it leads to, is tenant input. Without a check
the importer would fetch cloud metadata (169.254.169.254 and its other spellings), node or
in-cluster services, and write the answer into the tenant's volume; differing errors would also
turn DataVolumes into a port scanner. The check is on *addresses*, after resolution, because a
name can resolve anywhere (URL allow-lists such as upstream's ``allowedSourceURLs`` proposal do
not stop a public name that resolves to 10.0.0.1).

Three classes of address:

- ``ALWAYS_REFUSED``: cloud metadata endpoints, link-local and "this network" ranges. No
  configuration can allow them.
- restricted: loopback, private (RFC 1918), CGNAT, ULA, multicast, reserved, every other range
  ``ipaddress`` does not call global, and the cluster's own pod/service/node ranges. Refused
  unless an allowed CIDR covers the address.
- everything else (the public internet): allowed.

Every spelling is normalised first: inet_aton legacy forms (``2852039166``,
``0251.0376.0251.0376``, ``0xa9fea9fe``, ``169.254.43518``), IPv4-mapped and -compatible IPv6,
and IPv4 embedded in 6to4, Teredo and NAT64 addresses. An address is allowed only if *every*
form of it is, since a NAT64 gateway or a dual stack will deliver to the embedded IPv4 address.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _nets(*cidrs: str) -> tuple[Network, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


METADATA = _nets(
    "169.254.169.254/32",  # AWS, GCP, Azure, OpenStack, DigitalOcean, ...
    "169.254.170.2/32",  # AWS ECS task credentials
    "fd00:ec2::254/128",  # AWS IMDS over IPv6
    "100.100.100.200/32",  # Alibaba Cloud
    "192.0.0.192/32",  # Oracle Cloud (legacy)
)
ALWAYS_REFUSED = METADATA + _nets(
    "169.254.0.0/16",  # link-local
    "fe80::/10",  # link-local
    "0.0.0.0/8",  # "this network": 0.0.0.0 reaches the local host
    "::/128",  # unspecified
    "255.255.255.255/32",  # limited broadcast
)
RESTRICTED = _nets(
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",  # CGNAT (also where some clouds put node networks)
    "fc00::/7",  # ULA
    "224.0.0.0/4",  # multicast
    "ff00::/8",  # multicast
    "240.0.0.0/4",  # reserved
    "fec0::/10",  # deprecated site-local
)
_NAT64 = _nets("64:ff9b::/96", "64:ff9b:1::/48")
_V4_COMPATIBLE = ipaddress.ip_network("::/96")


_HEX = re.compile(r"0[xX][0-9a-fA-F]*")
_OCTAL = re.compile(r"0[0-7]+")
_DECIMAL = re.compile(r"[1-9][0-9]*|0")


def _legacy_part(text: str) -> int:
    """One dotted part as inet_aton reads it: 0x hex, leading-0 octal, else decimal."""
    if _HEX.fullmatch(text):
        return int(text[2:] or "0", 16)
    if _OCTAL.fullmatch(text):
        return int(text, 8)
    if _DECIMAL.fullmatch(text):
        return int(text)
    raise ValueError(text)


def _legacy_ipv4(text: str) -> ipaddress.IPv4Address | None:
    """inet_aton's forms: ``a``, ``a.b``, ``a.b.c``, ``a.b.c.d``, each part in any base; the
    last part fills the remaining bytes (``127.1`` is 127.0.0.1)."""
    parts = text.split(".")
    if not 1 <= len(parts) <= 4 or any(not p for p in parts):
        return None
    try:
        values = [_legacy_part(p) for p in parts]
    except ValueError:
        return None
    *head, last = values
    if any(v > 255 for v in head) or last >= 1 << (8 * (5 - len(values))):
        return None
    number = 0
    for value in head:
        number = number << 8 | value
    number = number << (8 * (5 - len(values))) | last
    return ipaddress.IPv4Address(number)


def parse_address(text: str) -> Address | None:
    """The address a host string names, in any spelling a resolver accepts; None for a name."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host.split("%", 1)[0]  # an IPv6 zone id does not change the address
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if ":" in host:
        return None
    return _legacy_ipv4(host)


def forms(address: Address) -> tuple[Address, ...]:
    """``address`` and every IPv4 address embedded in it, which is where it may be delivered."""
    if isinstance(address, ipaddress.IPv4Address):
        return (address,)
    if address.ipv4_mapped is not None:  # only a spelling of the IPv4 address
        return (address.ipv4_mapped,)
    out: list[Address] = [address]
    if address in _V4_COMPATIBLE and int(address) > 1:
        out.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        out.append(address.sixtofour)
    if address.teredo is not None:
        out.extend(address.teredo)
    if any(address in net for net in _NAT64):
        out.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    return tuple(out)


def parse_cidrs(values: Iterable[str]) -> tuple[Network, ...]:
    """CIDRs (or single addresses) as written by an operator; ``ValueError`` names a bad one.
    Host bits are tolerated (``10.0.0.1/8`` means 10.0.0.0/8), as kubectl users write them."""
    out: list[Network] = []
    for raw in values:
        text = raw.strip()
        if not text:
            continue
        try:
            out.append(ipaddress.ip_network(text, strict=False))
        except ValueError as exc:
            raise ValueError(f"{text!r} is not a CIDR (e.g. 10.0.0.0/8, fd00::/8)") from exc
    return tuple(out)


@dataclass(frozen=True)
class NetPolicy:
    """``allowed``: restricted ranges the operator opens (never the always-refused ones).
    ``cluster``: the cluster's pod, service and node ranges, restricted even if public."""

    allowed: tuple[Network, ...] = ()
    cluster: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, allowed: Iterable[str] = (), cluster: Iterable[str] = ()) -> NetPolicy:
        return cls(parse_cidrs(allowed), parse_cidrs(cluster))

    def refusal(self, address: Address | str) -> str | None:
        """Why a connection to ``address`` is refused, or None if it is allowed. A string that
        is not an address at all is refused (the caller must resolve names first)."""
        parsed = parse_address(address) if isinstance(address, str) else address
        if parsed is None:
            return "not an address"
        every = forms(parsed)
        if any(_covered(form, ALWAYS_REFUSED) for form in every):
            return "metadata or link-local address"
        for form in every:
            if self._restricted(form) and not _covered(form, self.allowed):
                return "restricted address outside the allowed source CIDRs"
        return None

    def allows(self, address: Address | str) -> bool:
        return self.refusal(address) is None

    def _restricted(self, address: Address) -> bool:
        return (
            not address.is_global
            or address.is_multicast
            or _covered(address, RESTRICTED)
            or _covered(address, self.cluster)
        )

    def to_env(self) -> tuple[str, str]:
        """(allowed, cluster) as the comma-separated values of the importer's env vars."""
        return ",".join(map(str, self.allowed)), ",".join(map(str, self.cluster))


def _covered(address: Address, nets: Iterable[Network]) -> bool:
    return any(address.version == net.version and address in net for net in nets)


LOOPBACK = ("127.0.0.0/8", "::1/128")
PRIVATE = (*LOOPBACK, "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7")
