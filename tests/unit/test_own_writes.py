"""``OwnWrites``: the reconciler's read-your-writes over a lagging informer cache."""

from __future__ import annotations

from typing import Any

from cdi.kube.own_writes import OwnWrites


def obj(rv: str, uid: str = "u1", status: str = "") -> dict[str, Any]:
    meta = {"namespace": "ns", "name": "dv", "uid": uid, "resourceVersion": rv}
    return {"metadata": meta, "status": {"phase": status}}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_cache_behind_our_write_is_shadowed_until_it_catches_up() -> None:
    own = OwnWrites()
    own.wrote(obj("12", status="ImportScheduled"))
    assert own.freshest("ns/dv", obj("10"))["status"]["phase"] == "ImportScheduled"
    assert own.freshest("ns/dv", None)["metadata"]["resourceVersion"] == "12"
    caught_up = obj("12", status="ImportScheduled")
    assert own.freshest("ns/dv", caught_up) is caught_up
    assert len(own) == 0  # the entry went once the cache showed it
    assert own.freshest("ns/dv", obj("11")) == obj("11")  # and no longer shadows anything


def test_a_newer_cached_version_wins() -> None:
    own = OwnWrites()
    own.wrote(obj("12"))
    newer = obj("15", status="Succeeded")
    assert own.freshest("ns/dv", newer) is newer


def test_another_object_at_the_key_or_an_unreadable_version_wins() -> None:
    own = OwnWrites()
    own.wrote(obj("12"))
    recreated = obj("3", uid="u2")
    assert own.freshest("ns/dv", recreated) is recreated
    own.wrote(obj("12"))
    opaque = obj("not-a-number")
    assert own.freshest("ns/dv", opaque) is opaque


def test_an_entry_expires_and_other_keys_are_untouched() -> None:
    clock = Clock()
    own = OwnWrites(ttl=30.0, clock=clock)
    own.wrote(obj("12"))
    other = {"metadata": {"namespace": "ns", "name": "other", "resourceVersion": "1"}}
    assert own.freshest("ns/other", other) is other
    clock.now += 31
    assert own.freshest("ns/dv", None) is None  # deleted behind our back: not shadowed forever
    own.wrote(obj("20"))
    own.forget("ns/dv")
    assert own.freshest("ns/dv", obj("13")) == obj("13")


def test_only_the_very_version_we_wrote_is_an_echo() -> None:
    clock = Clock()
    own = OwnWrites(ttl=30.0, clock=clock)
    own.wrote(obj("12", status="ImportScheduled"))
    assert own.echoes(obj("12"))
    assert not own.echoes(obj("13"))  # someone wrote after us
    assert not own.echoes(obj("11"))  # the version before ours
    assert not own.echoes(obj("12", uid="u2"))  # another object
    assert not own.echoes({"metadata": {"namespace": "ns", "name": "x", "resourceVersion": "12"}})
    clock.now += 31
    assert not own.echoes(obj("12"))  # a resync long after is not skipped


def test_an_object_the_informer_reports_gone_is_no_longer_shadowed() -> None:
    own = OwnWrites()
    own.wrote(obj("12"))
    own.gone(obj("14"))  # its delete event: the last version, deleted
    assert own.freshest("ns/dv", None) is None
    own.wrote(obj("20", uid="u2"))  # made again by us after the old one went
    own.gone(obj("14"))  # a late delete event of the old object spares the new one
    assert own.freshest("ns/dv", None) == obj("20", uid="u2")
