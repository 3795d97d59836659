"""What an informer keeps of each object: what its readers read, and a bounded amount of it.

The controller and the webhook cache every claim, DataVolume, DataSource and DataImportCron in
the cluster (security review N8). Tenants write those objects, and Kubernetes bounds their
metadata loosely: 256 KiB of annotations per object, labels limited only by the object's size,
and ``managedFields`` that grow with every field manager. Kept as parsed JSON, a few thousand
such objects run a 384Mi controller or a 256Mi webhook out of memory. client-go answers this
with an informer *transform* (``SetTransform``: strip ``managedFields`` before the store); so
do we, and go further, since we know what our readers read:

- ``keys_only``: the object's identity (name, namespace, uid, resourceVersion) and nothing
  else, for caches that are asked only *whether* an object exists, or only map an event to a
  key (the webhook's claim cache, the controller's DataImportCron cache);
- ``Slim``: the object minus ``managedFields`` and kubectl's ``last-applied-configuration``
  (a second copy of the object; no reader looks at either), minus the labels and annotations
  its readers never read (``reads``), with what is left bounded by ``budget`` bytes.

When the kept labels and annotations exceed the budget, the largest are dropped (the small
ones, which map events to keys, stay) and the object is marked *partial*: a marker outside
every Kubernetes field (``PARTIAL``), so no reader can take it for data, and ``is_partial``
tells. A reader that needs the whole object (the DataVolume reconciler renders a claim from
its DataVolume's labels and annotations) reads a partial one fresh from the API server
(CONVENTIONS: the reconciler re-reads state when it must). A dropped value is never replaced
by a truncated one: a truncated record could be parsed as a real, shorter one. No legitimate
object comes near the budget (CDI's own annotations on a claim are ~2 KiB, a requester record
with many groups a few KiB), so partial objects are a tenant's oversized ones, and the fresh
reads they cost are that tenant's.

Transforms run on the reflector thread, page by page, so a list holds at most one page of
whole objects; ``SLIM_PAGE`` keeps that page small (100 objects of the worst 256 KiB of
annotations are ~25 MiB of JSON, where the default 500 would be ~125 MiB, twice over while it
is parsed). Labels and annotations are the bulk a tenant controls cheaply; a huge ``spec``
string stays possible up to the object size limit, which only a count quota bounds
(``docs/security.md``, N8).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]
Transform = Callable[[JSON], JSON]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
MAX_KEPT_BYTES = 16 * 1024  # labels and annotations one cached object keeps (keys + values)
SLIM_PAGE = 100  # objects per list page of a slimmed informer (the default is 500)
# Not a Kubernetes field name (those are camelCase words): set only by ``Slim``.
PARTIAL = "cdi-py.cache/partial"
IDENTITY = ("name", "namespace", "uid", "resourceVersion", "deletionTimestamp")


def is_partial(obj: JSON | None) -> bool:
    """``obj`` came from a slimmed cache that dropped labels or annotations it had."""
    return bool(obj) and PARTIAL in obj  # type: ignore[operator]


def keys_only(obj: JSON) -> JSON:
    """The object's identity: what a cache asked "does it exist" or "which key" must hold."""
    meta = obj.get("metadata") or {}
    out: JSON = {"metadata": {k: meta[k] for k in IDENTITY if k in meta}}
    for field in ("apiVersion", "kind"):
        if field in obj:
            out[field] = obj[field]
    return out


def every_key(_key: str) -> bool:
    return True


def kubevirt_key(key: str) -> bool:
    """A label or annotation key in KubeVirt's domains (``cdi.kubevirt.io/...``,
    ``*.kubevirt.io/...``; also the bare key ``cdi.kubevirt.io``, CDI's component label)."""
    prefix = key.partition("/")[0]
    return prefix == "kubevirt.io" or prefix.endswith(".kubevirt.io")


def kubevirt_and(keys: Collection[str]) -> Callable[[str], bool]:
    """``kubevirt_key``, and the other keys the readers read (``keys``)."""
    extra = frozenset(keys)
    return lambda key: key in extra or kubevirt_key(key)


@dataclass(frozen=True)
class Slim:
    """The transform: ``reads`` says which label and annotation keys are kept at all."""

    reads: Callable[[str], bool] = every_key
    budget: int = MAX_KEPT_BYTES

    def __call__(self, obj: JSON) -> JSON:
        meta = obj.get("metadata")
        if not isinstance(meta, dict):
            return obj
        meta.pop("managedFields", None)
        kept = {
            (field, k): v
            for field in ("labels", "annotations")
            for k, v in (meta.get(field) or {}).items()
            if k != LAST_APPLIED and self.reads(k)
        }
        dropped = self._over_budget(kept)
        for field in ("labels", "annotations"):
            if field in meta:
                entries = {
                    k: v for (f, k), v in kept.items() if f == field and (f, k) not in dropped
                }
                meta[field] = entries
        if dropped:
            obj[PARTIAL] = True
        return obj

    def _over_budget(self, kept: dict[tuple[str, str], Any]) -> set[tuple[str, str]]:
        """The entries to drop: the largest, until the rest fits the budget."""
        sizes = {entry: len(entry[1]) + len(str(value)) for entry, value in kept.items()}
        total = sum(sizes.values())
        dropped: set[tuple[str, str]] = set()
        for entry in sorted(sizes, key=lambda e: sizes[e], reverse=True):
            if total <= self.budget:
                break
            dropped.add(entry)
            total -= sizes[entry]
        return dropped
