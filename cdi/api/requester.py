"""Who created a DataVolume, as the mutating webhook saw it, signed so the controller can tell.

Cross-namespace clone authorization rests on the requester recorded at creation
(``storage.requester.username`` / ``.groups``). A DataVolume's annotations are written by its
creator, so those two values alone prove nothing: they may come from the webhook, or from a
tenant when the webhook did not run (failurePolicy Ignore, an outage, a namespace outside its
selector, objects restored from a backup). So the webhook adds
``storage.requester.signature``: ``v1:<signedAt>:<hex HMAC-SHA256>`` over the namespace, the
name (``generateName*`` when the name is not chosen yet), the username, the groups and the
signing time, with a key kept in a Secret only the webhook and the controller read.

Why a signature and not a record elsewhere: at admission the DataVolume has no UID yet and a
webhook should not write other objects (``sideEffects: None``), so a tamper-proof note must
travel on the object itself; an HMAC is checked with no API call. Why these fields: namespace
and name bind it to one DataVolume, ``signedAt`` (checked against ``creationTimestamp``) stops
a signature copied from a deleted DataVolume of the same name being replayed later.

``trusted_requester`` is what clone authorization must call: it returns the requester only
for a DataVolume whose record the webhook wrote; anything else is None, "not trusted".
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cdi.api.constants import ANN_REQUESTER_GROUPS, ANN_REQUESTER_USERNAME, GROUP

ANN_REQUESTER_SIGNATURE = f"{GROUP}/storage.requester.signature"
VERSION = "v1"
MAX_SKEW_SECONDS = 300.0  # signedAt vs creationTimestamp (admission happens just before)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class Requester:
    username: str
    groups: tuple[str, ...]


def signed_name(metadata: Mapping[str, object]) -> str:
    """The name the signature binds: the name, else ``generateName`` + ``*``."""
    name = str(metadata.get("name") or "")
    return name or f"{metadata.get('generateName') or ''}*"


def _mac(key: bytes, namespace: str, name: str, username: str, groups: str, at: str) -> str:
    message = json.dumps([VERSION, namespace, name, username, groups, at], separators=(",", ":"))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, namespace: str, name: str, username: str, groups: str, at: datetime) -> str:
    """The signature annotation's value; ``groups`` as stored (a JSON list)."""
    stamp = at.astimezone(UTC).strftime(TIME_FORMAT)
    return f"{VERSION}:{stamp}:{_mac(key, namespace, name, username, groups, stamp)}"


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class RequesterSigner:
    """The webhook's signer: the key from the shared Secret and a clock (tests pass one)."""

    key: bytes
    clock: Callable[[], datetime] = field(default=_now)

    def __call__(self, namespace: str, name: str, username: str, groups: str) -> str:
        return sign(self.key, namespace, name, username, groups, self.clock())


def _name_matches(signed: str, actual: str) -> bool:
    if signed.endswith("*"):
        return actual.startswith(signed[:-1])
    return signed == actual


def trusted_requester(
    obj: Mapping[str, object], key: bytes | None, max_skew: float = MAX_SKEW_SECONDS
) -> Requester | None:
    """The requester of a DataVolume (as read from the API server) if the webhook signed it."""
    meta = obj.get("metadata")
    if not key or not isinstance(meta, Mapping):
        return None
    ann = meta.get("annotations")
    if not isinstance(ann, Mapping):
        return None
    username, groups = ann.get(ANN_REQUESTER_USERNAME), ann.get(ANN_REQUESTER_GROUPS)
    version, _, rest = str(ann.get(ANN_REQUESTER_SIGNATURE) or "").partition(":")
    stamp, _, mac = rest.rpartition(":")
    if version != VERSION or not isinstance(username, str) or not isinstance(groups, str):
        return None
    if not _fresh(stamp, str(meta.get("creationTimestamp") or ""), max_skew):
        return None
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    for candidate in (name, f"{meta.get('generateName') or ''}*"):
        if not _name_matches(candidate, name):
            continue
        expected = _mac(key, namespace, candidate, username, groups, stamp)
        if hmac.compare_digest(expected, mac):
            return _parse(username, groups)
    return None


def _fresh(stamp: str, created: str, max_skew: float) -> bool:
    try:
        signed_at = datetime.strptime(stamp, TIME_FORMAT).replace(tzinfo=UTC)
        created_at = datetime.strptime(created, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return False
    return abs((created_at - signed_at).total_seconds()) <= max_skew


def _parse(username: str, groups: str) -> Requester | None:
    try:
        parsed = json.loads(groups)
    except ValueError:
        return None
    if not isinstance(parsed, list) or not all(isinstance(g, str) for g in parsed):
        return None
    return Requester(username, tuple(parsed))
