"""Per-import tickets for the import proxy relay: what a tenant's namespace holds instead of the
cluster's proxy password.

A ticket is HTTP Basic credentials, ``<namespace>~<claim>~<expiry>`` and a MAC of that user
name under a key only the controller (which issues) and the relay (which checks) read, from
Secret ``cdi/cdi-import-proxy-key``. The relay needs no state and no API call to check one:
the MAC says the controller issued it, the expiry bounds how long it is worth anything, and
the namespace and claim name whose import it is go into the relay's log. ``~`` is in neither a
namespace nor a claim name (DNS labels and subdomains) and is unreserved in a URL's userinfo,
so the ticket travels as the importer's proxy userinfo unchanged; the MAC is base64url.

What a ticket is worth to a tenant who reads it (``edit`` reads the Secret): GET, HEAD and
CONNECT through the operator's proxy until it expires, which is what their imports do through
it anyway; never the proxy's password.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass

TICKET_DOMAIN = b"cdi-import-proxy-ticket\0"
SEPARATOR = "~"
_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


class TicketRefused(Exception):
    """A ticket the relay does not accept; ``reason`` is safe to log (no ticket bytes)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Ticket:
    namespace: str
    claim: str
    expires: int  # Unix seconds

    @property
    def user(self) -> str:
        return SEPARATOR.join((self.namespace, self.claim, str(self.expires)))

    def password(self, key: bytes) -> str:
        mac = hmac.new(key, TICKET_DOMAIN + self.user.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).decode().rstrip("=")

    def userinfo(self, key: bytes) -> str:
        """``user:password`` for a proxy URL (every character unreserved)."""
        return f"{self.user}:{self.password(key)}"


def issue(namespace: str, claim: str, now: float, lifetime: float) -> Ticket:
    if not (_NAME.fullmatch(namespace) and _NAME.fullmatch(claim)):
        raise ValueError(f"not a namespace and claim name: {namespace!r}, {claim!r}")
    return Ticket(namespace, claim, int(now + lifetime))


def check(user: str, password: str, key: bytes, now: float) -> Ticket:
    """The ticket ``user:password`` stands for, if the controller issued it and it is still
    valid; ``TicketRefused`` otherwise."""
    parts = user.split(SEPARATOR)
    if len(parts) != 3 or not parts[2].isdigit():
        raise TicketRefused("not a ticket")
    ticket = Ticket(parts[0], parts[1], int(parts[2]))
    if not hmac.compare_digest(ticket.password(key).encode(), password.encode()):
        raise TicketRefused("ticket not issued by the controller")
    if ticket.expires <= now:
        raise TicketRefused("ticket expired")
    return ticket
