"""Claims for the admission rules from the webhook's claim cache, read fresh where it matters.

Every DataVolume create asks whether a claim of its name exists (CDI's "Destination PVC
ns/name already exists"); asked with a GET, that is one API round trip inside every create call
(~80 ms of it under a 200-DataVolume burst, docs/controller.md). The webhook process keeps a
claim informer instead, and ``CachedClaims.get_pvc`` answers from it by one rule:

- **absent from a synced cache: no claim.** The common case (a new DataVolume) costs nothing.
  The cache lags the API server by the watch's delivery, so a claim created in that instant
  before the DataVolume is not seen: the same kind of window a GET has (a claim created between
  the GET and the DataVolume's storage is not seen either), and the controller stays the
  backstop: it never adopts a claim that is not its own unless adoption is allowed
  (``ErrResourceExists``);
- **present in the cache: read it fresh.** The verdict then rests on the claim's owner
  reference and annotations (``populatedFor``, ``createdForDataVolume``): a cached version
  could still show an owner DataVolume or a ``populatedFor`` that has since been removed and
  let a create through over a claim that is nobody's to take (or refuse one over a claim since
  deleted). Claims that exist are the rare case (adoption, populated claims, clone sources);
- **cache not synced yet** (start-up, a re-list): read fresh.

Pure: the cache and the fresh read are injected (``cdi.admission`` wires the informer and a
GET), so this module stays free of Kubernetes clients like the rest of ``cdi.webhooks``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

Claim = Mapping[str, Any]


class ClaimCache(Protocol):
    """What the rule needs of an informer: has it listed once, and its object by key."""

    @property
    def synced(self) -> bool: ...

    def get(self, key: str) -> Claim | None: ...


class CachedClaims:
    """``get_pvc`` by the rule above: ``fetch(namespace, name)`` is the fresh read."""

    def __init__(self, cache: ClaimCache, fetch: Callable[[str, str], Claim | None]) -> None:
        self.cache = cache
        self.fetch = fetch

    def get_pvc(self, namespace: str, name: str) -> Claim | None:
        if self.cache.synced and self.cache.get(f"{namespace}/{name}") is None:
            return None
        return self.fetch(namespace, name)
