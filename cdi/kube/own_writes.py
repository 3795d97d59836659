"""Read-your-own-writes over an informer cache: the object this process last wrote, until the
cache has caught up with it.

A reconciler that reads from an informer store instead of GETting from the API server saves a
request per read, but the store lags: right after the controller patched a DataVolume's status,
the next reconcile of that key may still see the old version, compute the same status again
and send a patch that fails with 409 Conflict (it carries the stale resourceVersion). client-go
answers this with "expectations"; the simplest form of them is to remember the object each
write returned and prefer it while the cache is older.

"Older" compares resourceVersions as integers. The API server documents them as opaque, but
with etcd they are its revisions, which only grow; a version that is not an integer makes the
cache win, which is the behaviour without this class. An object
deleted or re-created behind our back must not be shadowed, so an entry gives way to a cached
object with another UID, goes when the informer reports the object gone (``gone``) and expires
after ``ttl`` seconds whatever happens.

``echoes`` tells a watch event that carries exactly what a write of ours returned: the
controller skips the reconcile such an event would trigger (the write's own reconcile already
decided what comes next), as controller-runtime's predicates filter events. Anything written
by someone else has another resourceVersion and is never skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

JSON = dict[str, Any]


def _version(obj: JSON) -> int | None:
    try:
        return int(str((obj.get("metadata") or {}).get("resourceVersion")))
    except ValueError:
        return None


def _uid(obj: JSON) -> str | None:
    return (obj.get("metadata") or {}).get("uid") or None


def _key(obj: JSON) -> str:
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name", "")
    return f"{ns}/{name}" if ns else str(name)


class OwnWrites:
    """The newest object each write of this process returned, by ``namespace/name``."""

    def __init__(self, ttl: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl = ttl
        self.clock = clock
        self._written: dict[str, tuple[JSON, float]] = {}

    def __len__(self) -> int:
        return len(self._written)

    def wrote(self, obj: JSON) -> None:
        """Remember what a create/patch/update returned."""
        now = self.clock()
        if len(self._written) > 256:
            self._expire(now)
        self._written[_key(obj)] = (obj, now)

    def echoes(self, obj: JSON) -> bool:
        """``obj`` is the very version a write of this process returned (within ``ttl``): a
        watch event that only echoes our own write, which the controller has acted on."""
        entry = self._written.get(_key(obj))
        if entry is None or self.clock() - entry[1] > self.ttl:
            return False
        mine = entry[0]
        if _uid(obj) != _uid(mine):
            return False
        return _version(obj) is not None and _version(obj) == _version(mine)

    def forget(self, key: str) -> None:
        self._written.pop(key, None)

    def gone(self, obj: JSON) -> None:
        """The informer no longer holds ``obj`` (its delete event, or a relist without it):
        what this process wrote at its key is forgotten, unless that is another object (one
        created after ``obj``). Without this a write of ours would shadow the deletion until
        ``ttl`` ran out."""
        key = _key(obj)
        entry = self._written.get(key)
        if entry is not None and _uid(entry[0]) in (None, _uid(obj)):
            del self._written[key]

    def freshest(self, key: str, cached: JSON | None) -> JSON | None:
        """``cached`` unless the object this process last wrote at ``key`` is newer."""
        entry = self._written.get(key)
        if entry is None:
            return cached
        mine, at = entry
        if self.clock() - at > self.ttl or (cached is not None and self._caught_up(cached, mine)):
            del self._written[key]
            return cached
        return mine

    @staticmethod
    def _caught_up(cached: JSON, mine: JSON) -> bool:
        if _uid(cached) != _uid(mine):
            return True  # another object now: ours is gone
        have, wrote = _version(cached), _version(mine)
        return have is None or wrote is None or have >= wrote

    def _expire(self, now: float) -> None:
        for key in [k for k, (_, at) in self._written.items() if now - at > self.ttl]:
            del self._written[key]
