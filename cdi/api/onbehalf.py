"""A clone the controller makes on someone's behalf: a DataImportCron's cross-namespace pvc source.

A DataImportCron's imports are DataVolumes the controller creates, so the requester the
webhook records and signs on them (``cdi.api.requester``) is the controller's own
ServiceAccount, whose cluster-wide rights must never decide a tenant's clone. CDI (#3970/#3971)
authorizes such a clone for the cron namespace's ``default`` ServiceAccount; we do the same by
delegation:

1. the cron controller asks CDI's SubjectAccessReviews (``cdi.api.cloneauth``) for
   ``system:serviceaccount:<cron namespace>:default`` (groups ``system:serviceaccounts``,
   ``system:serviceaccounts:<ns>``, ``system:authenticated``) in the source namespace, and makes
   no import unless they allow it;
2. on the DataVolume it creates it writes ``storage.requester.onBehalfOf`` (that identity as
   JSON ``{"username", "groups"}``) and ``storage.requester.onBehalfOf.signature``:
   ``ob1:<signedAt>:<hex HMAC-SHA256>`` with the requester record's key, over the version tag,
   the DataVolume's namespace and name, the record exactly as stored, the source claim's
   namespace and name, and the signing time;
3. clone authorization (``cdi.controller.flavours.clone.auth``) reads the record ONLY when the
   DataVolume's webhook-signed requester is the controller itself, and then authorizes the
   on-behalf identity instead (the same SubjectAccessReviews, asked again now). On anybody
   else's DataVolume the record is ignored: a tenant who writes or copies it gains nothing.

Replay: the MAC binds namespace, name and source, and ``signedAt`` must be within
``MAX_SKEW_SECONDS`` of the DataVolume's ``creationTimestamp``, as the requester record's; the
version tag ``ob1`` is the MAC's first field, so a requester signature never verifies here nor
this one there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from datetime import UTC, datetime

from cdi.api.constants import GROUP
from cdi.api.requester import MAX_SKEW_SECONDS, TIME_FORMAT, Requester, _fresh

ANN_ON_BEHALF = f"{GROUP}/storage.requester.onBehalfOf"
ANN_ON_BEHALF_SIGNATURE = f"{GROUP}/storage.requester.onBehalfOf.signature"
ON_BEHALF_KEYS = (ANN_ON_BEHALF, ANN_ON_BEHALF_SIGNATURE)
VERSION = "ob1"


def default_service_account(namespace: str) -> Requester:
    """The identity CDI authorizes a cron's clone for: the namespace's ``default`` SA, with the
    groups the API server gives a ServiceAccount."""
    return Requester(
        f"system:serviceaccount:{namespace}:default",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


def record(user: Requester) -> str:
    """The stored value: ``{"username", "groups"}`` as compact JSON."""
    return json.dumps(
        {"username": user.username, "groups": list(user.groups)}, separators=(",", ":")
    )


def _mac(
    key: bytes, namespace: str, name: str, value: str, source: tuple[str, str], at: str
) -> str:
    message = json.dumps([VERSION, namespace, name, value, *source, at], separators=(",", ":"))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def signed_annotations(
    key: bytes,
    namespace: str,
    name: str,
    user: Requester,
    source: tuple[str, str],
    at: datetime,
) -> dict[str, str]:
    """The two annotations the controller writes on the DataVolume ``namespace/name`` it creates
    to clone ``source`` (namespace, name) on behalf of ``user``."""
    value = record(user)
    stamp = at.astimezone(UTC).strftime(TIME_FORMAT)
    mac = _mac(key, namespace, name, value, source, stamp)
    return {ANN_ON_BEHALF: value, ANN_ON_BEHALF_SIGNATURE: f"{VERSION}:{stamp}:{mac}"}


def trusted_on_behalf(
    obj: Mapping[str, object],
    key: bytes | None,
    source: tuple[str, str],
    max_skew: float = MAX_SKEW_SECONDS,
) -> Requester | None:
    """The identity the DataVolume ``obj`` (as read) was made on behalf of to clone ``source``,
    if the record verifies; else None. Callers honour it only on the controller's own
    DataVolumes (see the module's docstring)."""
    meta = obj.get("metadata")
    if not key or not isinstance(meta, Mapping):
        return None
    ann = meta.get("annotations")
    if not isinstance(ann, Mapping):
        return None
    value, signature = ann.get(ANN_ON_BEHALF), ann.get(ANN_ON_BEHALF_SIGNATURE)
    if not isinstance(value, str) or not isinstance(signature, str):
        return None
    version, _, rest = signature.partition(":")
    stamp, _, mac = rest.rpartition(":")
    if version != VERSION:
        return None
    if not _fresh(stamp, str(meta.get("creationTimestamp") or ""), max_skew):
        return None
    namespace, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    expected = _mac(key, namespace, name, value, source, stamp)
    if not hmac.compare_digest(expected, mac):
        return None
    try:
        data = json.loads(value)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("username"), str):
        return None
    groups = data.get("groups")
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        return None
    return Requester(data["username"], tuple(groups))
