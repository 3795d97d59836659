"""``cdi.controller.importslots`` (issue 28, CDIConfig maxConcurrentImports): what holds a
slot (importer pods alive, not a cron's poller, not a finished or deleted pod), admission in
creation order, admitted pods counted until the informer shows them, and waiters that stop
asking losing their place."""

from __future__ import annotations

from typing import Any

from cdi.controller.importslots import RECENT, SETTLE, WAIT_TTL, ImportSlots, alive_importers


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    labels = {"cdi.kubevirt.io": "importer", **meta.pop("labels", {})}
    return {"metadata": {"name": name, "namespace": "ns", "labels": labels, **meta},
            "status": {"phase": phase}}  # fmt: skip


def test_only_live_importer_pods_hold_slots() -> None:
    cron = [{"kind": "DataImportCron", "name": "c"}]
    pods = [
        pod("importer-a"),
        pod("importer-b", "Pending"),
        pod("importer-c", "Succeeded"),
        pod("importer-d", deletionTimestamp="2026-12-05T00:00:00Z"),
        pod("poller", ownerReferences=cron),
        pod("upload", labels={"cdi.kubevirt.io": "cdi-upload-server"}),
    ]
    assert alive_importers(pods) == {("ns", "importer-a"), ("ns", "importer-b")}


def test_waiters_are_admitted_in_creation_order_as_slots_free() -> None:
    clock = Clock()
    slots = ImportSlots(clock)
    running = [pod("importer-x")]
    late, early = ("ns", "late"), ("ns", "early")
    t_late, t_early = "2026-12-05T10:00:02Z", "2026-12-05T10:00:01Z"
    # limit 2, one running: one slot free; the later DataVolume asks first: it lines up
    assert slots.take(late, t_late, ("ns", "p-late"), 2, running) == 0
    assert slots.take(early, t_early, ("ns", "p-early"), 2, running) == 0
    clock.now += SETTLE
    assert slots.take(late, t_late, ("ns", "p-late"), 2, running) == 1  # early is ahead
    assert slots.take(early, t_early, ("ns", "p-early"), 2, running) is None
    assert slots.take(late, t_late, ("ns", "p-late"), 2, running) == 0
    # the early one's pod is counted although the informer does not show it yet
    assert slots.recent == {("ns", "p-early"): clock.now}
    # the running pod ends: a slot frees for the late one, which keeps it
    shown = [pod("p-early")]
    assert slots.take(late, t_late, ("ns", "p-late"), 2, shown) is None
    assert slots.take(late, t_late, ("ns", "p-late"), 2, shown) is None


def test_a_tie_in_creation_time_goes_by_namespace_and_name() -> None:
    slots = ImportSlots(Clock())
    t = "2026-12-05T10:00:00Z"
    assert slots.take(("ns", "b"), t, ("ns", "pb"), 1, [pod("busy")]) == 0
    assert slots.take(("ns", "a"), t, ("ns", "pa"), 1, [pod("busy")]) == 0
    assert slots.take(("ns", "b"), t, ("ns", "pb"), 1, [pod("busy")]) == 1


def test_a_waiter_that_stops_asking_loses_its_place_and_recent_admissions_expire() -> None:
    clock = Clock()
    slots = ImportSlots(clock)
    busy = [pod("busy")]
    assert slots.take(("ns", "gone"), "t1", ("ns", "pg"), 1, busy) == 0
    clock.now += WAIT_TTL + 1  # its DataVolume was deleted: nobody asks for it any more
    assert slots.take(("ns", "next"), "t2", ("ns", "pn"), 1, []) == 0  # lines up first
    assert ("ns", "gone") not in slots.waiting
    clock.now += SETTLE
    assert slots.take(("ns", "next"), "t2", ("ns", "pn"), 1, []) is None
    clock.now += RECENT + 1  # its pod never showed up (refused by a quota, say)
    assert slots.take(("ns", "third"), "t3", ("ns", "p3"), 1, []) == 0
    clock.now += SETTLE
    assert slots.take(("ns", "third"), "t3", ("ns", "p3"), 1, []) is None
