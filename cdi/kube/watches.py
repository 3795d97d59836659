"""What wakes a reconciler, declared beside it: controller-runtime's builder
(``For``/``Owns``/``Watches``) as plain data.

Each reconciler module says which kinds of object wake its reconciler and how an object of
each maps to the keys of its work queue; the manager (``cdi.controller.manager``) reads these
declarations, makes one informer per kind they name (shared by every reconciler that watches
it) and sends each event to the queues whose declarations map it to a key. So the list of
what wakes what lives where the reconciler does, and the manager only composes.

- ``For(resource)``: the reconciler's own kind; an object maps to its own key
  (``namespace/name``, or ``name`` for a cluster-scoped kind). ``first`` puts the key ahead of
  the queue (``WorkQueue.add(first=True)``): the DataVolume reconciler's new objects.
- ``Owns(resource, kinds)``: a child kind; an object maps to the key of its controller owner
  when that owner is of one of ``kinds`` (controller-runtime's ``OnlyControllerOwner``).
- ``Maps(resource, to)``: any other relation; ``to(obj)`` names the keys (none, one, or every
  object a cache holds that refers to it). ``one`` lifts a function that names at most one.

Every watch may carry ``where``, a predicate an event must pass (controller-runtime's
predicates): the DataVolume reconciler skips the watch echo of its own writes this way.

Mapping functions get only the object, never the event type: a reconcile re-reads the state
(the conventions' level-triggered rule), so the same function serves adds, updates, deletes
and resyncs. They are pure apart from the caches they read, and tested so (an object in, keys
out), without informers or queues.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from cdi.kube.client import JSON, Resource, object_key

Obj = JSON
Predicate = Callable[[Obj], bool]
KeyMap = Callable[[Obj], Iterable[str]]


def _always(_obj: Obj) -> bool:
    return True


def _never(_obj: Obj) -> bool:
    return False


def one(fn: Callable[[Obj], str | None]) -> KeyMap:
    """A mapping that names at most one key, as ``Maps`` wants it (``None``: no key)."""

    def keys(obj: Obj) -> list[str]:
        key = fn(obj)
        return [key] if key else []

    return keys


def controller_owner_key(obj: Obj, kinds: tuple[str, ...]) -> str | None:
    """The key of the controller owner of ``obj`` when that owner is of one of ``kinds``
    (owner references name an object in the same namespace)."""
    meta = obj.get("metadata") or {}
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") in kinds:
            ns = meta.get("namespace")
            return f"{ns}/{ref.get('name')}" if ns else str(ref.get("name"))
    return None


@dataclass(frozen=True)
class Request:
    """One key for one queue; ``first``: ahead of the ordinary keys."""

    key: str
    first: bool = False


@dataclass(frozen=True)
class For:
    resource: Resource
    first: Predicate = _never
    where: Predicate = _always

    def requests(self, obj: Obj) -> list[Request]:
        if not self.where(obj):
            return []
        key = object_key(obj)
        return [Request(key, self.first(obj))] if key else []


@dataclass(frozen=True)
class Owns:
    resource: Resource
    kinds: tuple[str, ...]  # the owner kinds whose children wake the reconciler
    where: Predicate = _always

    def requests(self, obj: Obj) -> list[Request]:
        if not self.where(obj):
            return []
        key = controller_owner_key(obj, self.kinds)
        return [Request(key)] if key else []


@dataclass(frozen=True)
class Maps:
    resource: Resource
    to: KeyMap
    where: Predicate = _always

    def requests(self, obj: Obj) -> list[Request]:
        if not self.where(obj):
            return []
        return [Request(key) for key in self.to(obj) if key]


Watch = For | Owns | Maps


@dataclass(frozen=True)
class Watches:
    """Everything that wakes one reconciler; ``initial``: keys queued at start, before any
    event (the CDIConfig singleton, created if missing)."""

    watches: tuple[Watch, ...]
    initial: tuple[str, ...] = ()

    def resources(self) -> list[Resource]:
        """The kinds watched, each once, in the order declared."""
        return list(dict.fromkeys(w.resource for w in self.watches))

    def requests(self, resource: Resource, obj: Obj) -> list[Request]:
        """What an event on ``obj`` (of ``resource``) asks of this reconciler's queue."""
        return [r for w in self.watches if w.resource == resource for r in w.requests(obj)]


def watched(declarations: Iterable[Watches]) -> list[Resource]:
    """Every kind some declaration watches, each once: one informer each."""
    return list(dict.fromkeys(r for d in declarations for r in d.resources()))
