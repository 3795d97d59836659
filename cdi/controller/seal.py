"""Seals: what the controller wrote on an object a tenant can edit, in a form only it can write.

The controller keeps its durable state on the claims it works on (the import record, the name
of a populator's prime), because pods and processes come and go. Those claims live in the
tenant's namespace, so with the built-in ``edit`` role the tenant can rewrite every annotation
on them, or create the object the controller would have created, first. For most of that state
the tenant only hurts itself; but where the controller acts on it beyond the tenant's reach (the
populator hands a PersistentVolume, a cluster-scoped object, to a claim), a value the tenant
could have written must not be the authority (issue 23, N1).

A seal is an HMAC-SHA256 over a purpose, the UID of the object it is about, and the value. The
UID binds it to one object (a seal copied from another claim, or from a deleted claim of the same
name, does not verify); the purpose keeps a seal of one kind from passing for another. The key is
derived from the controller's shared key (``--requester-key-secret``), so every replica and
every new leader verifies what an earlier one sealed.

Why not a record elsewhere (a ConfigMap in ``cdi``, the PV): the state must be written in the
same patch as what it vouches for, so a crash can never leave one without the other; a second
object would be a second write. Why not the UID alone: the tenant can write the annotation that
names a UID as easily as any other.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

VERSION = "v1"
_DERIVATION = b"cdi-py controller seal v1"


@dataclass(frozen=True)
class Seal:
    """Seals and checks values about one object; ``key`` is the controller's shared key."""

    key: bytes

    @classmethod
    def from_shared_key(cls, shared: bytes | None) -> Seal:
        """The seal keyed from the shared key; without one, a key of this process only (what it
        seals does not verify after a restart: populations then start over, safely)."""
        base = shared if shared else secrets.token_bytes(32)
        return cls(hmac.new(base, _DERIVATION, hashlib.sha256).digest())

    def _mac(self, purpose: str, uid: str, value: str) -> str:
        message = json.dumps([VERSION, purpose, uid, value], separators=(",", ":"))
        return hmac.new(self.key, message.encode(), hashlib.sha256).hexdigest()

    def seal(self, purpose: str, uid: str, value: str) -> str:
        """``v1:<mac>:<value>``: the value travels with its seal, so it can be recovered."""
        return f"{VERSION}:{self._mac(purpose, uid, value)}:{value}"

    def open(self, purpose: str, uid: str, sealed: object) -> str | None:
        """The value sealed for ``uid`` and ``purpose``, or None (absent, malformed, altered,
        or sealed for another object)."""
        if not isinstance(sealed, str) or not uid:
            return None
        version, _, rest = sealed.partition(":")
        mac, sep, value = rest.partition(":")
        if version != VERSION or not sep:
            return None
        if not hmac.compare_digest(mac, self._mac(purpose, uid, value)):
            return None
        return value


def object_uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")
