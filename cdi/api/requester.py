"""Who created a DataVolume, as the mutating webhook saw it, signed so the controller can tell.

Cross-namespace clone authorization rests on the requester recorded at creation
(``storage.requester.username`` / ``.groups`` / ``.uid`` / ``.extra``). A DataVolume's
annotations are written by its creator, so those values alone prove nothing: they may come from
the webhook, or from a tenant when the webhook did not run (failurePolicy Ignore, an outage, a
namespace outside its selector, objects restored from a backup). So the webhook adds
``storage.requester.signature``: ``v2:<signedAt>:<hex HMAC-SHA256>`` over the namespace, the
name (``generateName*`` when the name is not chosen yet), the four recorded values exactly as
stored (an absent ``uid``/``extra`` annotation is the empty string) and the signing time, with
a key kept in a Secret only the webhook and the controller read.

Why a signature and not a record elsewhere: at admission the DataVolume has no UID yet and a
webhook should not write other objects (``sideEffects: None``), so a tamper-proof note must
travel on the object itself; an HMAC is checked with no API call. Why these fields: namespace
and name bind it to one DataVolume, ``signedAt`` (checked against ``creationTimestamp``) stops
a signature copied from a deleted DataVolume of the same name being replayed later, and
``uid``/``extra`` are part of who the requester is: the API server passes them to every
authorization decision (a scoped token, an impersonation with extras), so the controller's
SubjectAccessReviews must carry them too (``cdi.api.cloneauth.access_review_body``).

Versions: ``v1`` records (username and groups only) are refused, not read as "no uid, no
extra". The webhook that wrote them signed any AdmissionReview POSTed to it, whoever sent it
(security review finding N2), so a ``v1`` signature does not show that the API server admitted
the DataVolume; and it dropped ``extra``, so its user would be judged without the scopes the
API server applied. A cross-namespace clone admitted before the upgrade stops with
``CloneNotAuthorized`` and is created again. The version tag is the first field the MAC covers,
so a record of one version never verifies as the other.

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
ANN_REQUESTER_UID = f"{GROUP}/storage.requester.uid"
ANN_REQUESTER_EXTRA = f"{GROUP}/storage.requester.extra"
# the recorded values, in the order the signature covers them
RECORD_KEYS = (ANN_REQUESTER_USERNAME, ANN_REQUESTER_GROUPS, ANN_REQUESTER_UID, ANN_REQUESTER_EXTRA)
VERSION = "v2"
MAX_SKEW_SECONDS = 300.0  # signedAt vs creationTimestamp (admission happens just before)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

Extra = tuple[tuple[str, tuple[str, ...]], ...]  # userInfo.extra, keys sorted: hashable


def extra_from(data: object) -> Extra:
    """``userInfo.extra`` (a map of string lists) in canonical form; anything else is empty."""
    if not isinstance(data, Mapping):
        return ()
    pairs = []
    for key, values in data.items():
        if isinstance(values, list | tuple):
            pairs.append((str(key), tuple(str(v) for v in values)))
    return tuple(sorted(pairs))


@dataclass(frozen=True)
class Requester:
    """Who asked: ``AdmissionRequest.userInfo``, as the API server authenticated them."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: Extra = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Requester:
        groups = data.get("groups")
        return cls(
            str(data.get("username") or ""),
            tuple(str(g) for g in groups) if isinstance(groups, list | tuple) else (),
            str(data.get("uid") or ""),
            extra_from(data.get("extra")),
        )

    def extra_dict(self) -> dict[str, list[str]]:
        return {key: list(values) for key, values in self.extra}

    def record(self) -> dict[str, str]:
        """The annotations recording this requester (``uid`` and ``extra`` only when set)."""
        out = {
            ANN_REQUESTER_USERNAME: self.username,
            ANN_REQUESTER_GROUPS: json.dumps(list(self.groups)),
        }
        if self.uid:
            out[ANN_REQUESTER_UID] = self.uid
        if self.extra:
            out[ANN_REQUESTER_EXTRA] = json.dumps(self.extra_dict(), separators=(",", ":"))
        return out


def signed_name(metadata: Mapping[str, object]) -> str:
    """The name the signature binds: the name, else ``generateName`` + ``*``."""
    name = str(metadata.get("name") or "")
    return name or f"{metadata.get('generateName') or ''}*"


def _mac(key: bytes, namespace: str, name: str, record: Mapping[str, object], at: str) -> str:
    values = [str(record.get(k) or "") for k in RECORD_KEYS]
    message = json.dumps([VERSION, namespace, name, *values, at], separators=(",", ":"))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def sign(key: bytes, namespace: str, name: str, record: Mapping[str, str], at: datetime) -> str:
    """The signature annotation's value over ``record`` (``Requester.record``, as stored)."""
    stamp = at.astimezone(UTC).strftime(TIME_FORMAT)
    return f"{VERSION}:{stamp}:{_mac(key, namespace, name, record, stamp)}"


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class RequesterSigner:
    """The webhook's signer: the key from the shared Secret and a clock (tests pass one)."""

    key: bytes
    clock: Callable[[], datetime] = field(default=_now)

    def __call__(self, namespace: str, name: str, record: Mapping[str, str]) -> str:
        return sign(self.key, namespace, name, record, self.clock())


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
    record = {k: ann.get(k, "") for k in RECORD_KEYS}
    version, _, rest = str(ann.get(ANN_REQUESTER_SIGNATURE) or "").partition(":")
    stamp, _, mac = rest.rpartition(":")
    if version != VERSION or not all(isinstance(v, str) for v in record.values()):
        return None  # v1 included: see the module's docstring
    if ANN_REQUESTER_USERNAME not in ann or ANN_REQUESTER_GROUPS not in ann:
        return None
    if not _fresh(stamp, str(meta.get("creationTimestamp") or ""), max_skew):
        return None
    namespace = str(meta.get("namespace") or "")
    name = str(meta.get("name") or "")
    for candidate in (name, f"{meta.get('generateName') or ''}*"):
        if not _name_matches(candidate, name):
            continue
        expected = _mac(key, namespace, candidate, record, stamp)
        if hmac.compare_digest(expected, mac):
            return _parse(record)
    return None


def _fresh(stamp: str, created: str, max_skew: float) -> bool:
    try:
        signed_at = datetime.strptime(stamp, TIME_FORMAT).replace(tzinfo=UTC)
        created_at = datetime.strptime(created, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return False
    return abs((created_at - signed_at).total_seconds()) <= max_skew


def _parse(record: Mapping[str, object]) -> Requester | None:
    try:
        groups = json.loads(str(record[ANN_REQUESTER_GROUPS]))
        extra = json.loads(str(record[ANN_REQUESTER_EXTRA] or "{}"))
    except ValueError:
        return None
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return None
    if not isinstance(extra, dict) or not all(
        isinstance(v, list) and all(isinstance(x, str) for x in v) for v in extra.values()
    ):
        return None
    username, uid = str(record[ANN_REQUESTER_USERNAME]), str(record[ANN_REQUESTER_UID])
    return Requester(username, tuple(groups), uid, extra_from(extra))
