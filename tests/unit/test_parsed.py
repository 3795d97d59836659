"""Cached API objects parsed once per resourceVersion (``cdi.controller.parsed``)."""

from __future__ import annotations

from typing import Any

from cdi.api.types import DataVolume
from cdi.controller.parsed import ParseCache


def dv(version: str | None, uid: str = "u1", name: str = "a") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": uid}
    if version is not None:
        meta["resourceVersion"] = version
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": meta,
        "spec": {"source": {"blank": {}}, "pvc": {"accessModes": ["ReadWriteOnce"]}},
    }


def test_one_version_is_parsed_once_a_new_version_again() -> None:
    parse = ParseCache(DataVolume.from_dict)
    first = parse(dv("1"))
    assert parse(dv("1")) is first
    newer = parse(dv("2"))
    assert newer is not first and newer.spec == first.spec  # parsed again
    assert parse(dv("2")) is newer


def test_a_recreated_object_or_one_without_version_is_parsed_again() -> None:
    parse = ParseCache(DataVolume.from_dict)
    first = parse(dv("1"))
    assert parse(dv("1", uid="u2")) is not first  # deleted and created again
    assert parse(dv(None)) is not parse(dv(None))


def test_the_cache_keeps_at_most_size_objects() -> None:
    parse = ParseCache(DataVolume.from_dict, size=2)
    a = parse(dv("1", name="a"))
    parse(dv("1", name="b"))
    parse(dv("1", name="c"))  # a, the oldest, goes
    assert parse(dv("1", name="a")) is not a
    assert len(parse._last) == 2
