"""The typed (frozen) form of cached API objects, parsed once per resourceVersion.

The reconciler reads plain dicts from informer caches and parses them into the frozen API
dataclasses (``DataVolume.from_dict``, ``CDIConfig.from_dict``, ``StorageProfile.from_dict``)
on every reconcile. Under a burst of 200 DataVolumes that parsing was the largest share of the
controller's event-loop time (py-spy, docs/controller.md): the same CDIConfig and
StorageProfile parsed for every reconcile of every DataVolume, and each DataVolume again for
each of its follow-ups. A resourceVersion names one content of one object, and the parsed
objects are immutable, so the parse of the last version seen is kept per object and reused
while the version is the same. An object without a resourceVersion (built by hand) is parsed
every time. One entry per object (namespace/name), oldest dropped beyond ``size``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ParseCache(Generic[T]):
    """``parse(raw)``, remembered per object for its resourceVersion (and UID)."""

    def __init__(self, parse: Callable[[Mapping[str, Any]], T], size: int = 4096) -> None:
        self.parse = parse
        self.size = size
        self._last: dict[tuple[Any, Any], tuple[Any, Any, T]] = {}

    def __call__(self, raw: Mapping[str, Any]) -> T:
        meta = raw.get("metadata") or {}
        version, uid = meta.get("resourceVersion"), meta.get("uid")
        if not version:
            return self.parse(raw)
        key = (meta.get("namespace"), meta.get("name"))
        hit = self._last.get(key)
        if hit is not None and hit[0] == version and hit[1] == uid:
            return hit[2]
        parsed = self.parse(raw)  # raises as parse does: nothing is remembered then
        self._last.pop(key, None)
        if len(self._last) >= self.size:
            del self._last[next(iter(self._last))]
        self._last[key] = (version, uid, parsed)
        return parsed
