"""The keyed work queue: deduplication, one worker per key, delays, rate-limited requeue."""

from __future__ import annotations

import asyncio

from cdi.kube.workqueue import Backoff, Result, WorkQueue, run_workers


async def test_a_key_added_many_times_is_queued_once() -> None:
    q = WorkQueue()
    for _ in range(5):
        q.add("ns/a")
    q.add("ns/b")
    assert len(q) == 2
    assert await q.get() == "ns/a"
    assert await q.get() == "ns/b"


async def test_a_key_added_while_processing_is_requeued_after_done_not_handed_out_twice() -> None:
    q = WorkQueue()
    q.add("k")
    key = await q.get()
    q.add("k")  # an event arrives while a worker holds the key
    assert len(q) == 0 and "k" in q.processing
    assert key is not None
    q.done(key)
    assert len(q) == 1 and await q.get() == "k"


async def test_workers_never_reconcile_the_same_key_concurrently() -> None:
    q = WorkQueue()
    running: set[str] = set()
    overlaps: list[str] = []
    calls: dict[str, int] = {}

    async def reconcile(key: str) -> Result:
        if key in running:
            overlaps.append(key)
        running.add(key)
        calls[key] = calls.get(key, 0) + 1
        await asyncio.sleep(0.01)
        q.add(key) if calls[key] < 3 else None  # events keep arriving while we work
        running.discard(key)
        return Result()

    for key in ("a", "b", "c"):
        q.add(key)
    workers = asyncio.create_task(run_workers(q, reconcile, 4))
    await asyncio.sleep(0.3)
    q.shutdown()
    await asyncio.wait_for(workers, 2)
    assert not overlaps
    assert calls == {"a": 3, "b": 3, "c": 3}


async def test_add_after_keeps_the_earliest_deadline() -> None:
    q = WorkQueue()
    q.add_after("k", 0.2)
    q.add_after("k", 0.05)
    q.add_after("k", 1.0)
    await asyncio.wait_for(q.get(), 0.15)


async def test_failures_back_off_exponentially_until_forgotten() -> None:
    q = WorkQueue(Backoff(base=0.01, cap=0.05))
    delays = [q.add_rate_limited("k") for _ in range(5)]
    assert delays[0] < delays[1] < delays[2]
    assert max(delays) <= 0.05 * 1.1
    assert q.failures("k") == 5
    q.forget("k")
    assert q.failures("k") == 0


async def test_failing_reconcile_is_retried_with_backoff_and_result_requeues() -> None:
    q = WorkQueue(Backoff(base=0.01, cap=0.02))
    attempts: list[str] = []

    async def reconcile(key: str) -> Result:
        attempts.append(key)
        if len(attempts) < 3:
            raise RuntimeError("API down")
        return Result(requeue_after=0.01) if len(attempts) < 5 else Result()

    q.add("k")
    workers = asyncio.create_task(run_workers(q, reconcile, 2))
    await asyncio.sleep(0.3)
    q.shutdown()
    await asyncio.wait_for(workers, 2)
    assert len(attempts) == 5
    assert q.failures("k") == 0  # a success forgets the failures


async def test_shutdown_wakes_idle_workers() -> None:
    q = WorkQueue()
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0.01)
    q.shutdown()
    assert await asyncio.wait_for(getter, 1) is None


async def test_keys_added_first_go_ahead_of_ordinary_ones_in_arrival_order() -> None:
    q = WorkQueue()
    q.add("old/followup")
    q.add("new/a", first=True)
    q.add("old/other")
    q.add("new/b", first=True)
    q.add("old/other", first=True)  # already waiting as an ordinary key: moved ahead
    assert [await q.get() for _ in range(len(q))] == [
        "new/a",
        "new/b",
        "old/other",
        "old/followup",
    ]


async def test_follow_ups_are_limited_while_first_keys_wait_or_run() -> None:
    q = WorkQueue(follow_ups_while_urgent=1)
    for key in ("old/a", "old/b", "old/c"):
        q.add(key)
    assert await q.get() == "old/a"  # nothing urgent: follow-ups go freely
    assert await q.get() == "old/b"
    q.add("new/x", first=True)
    assert q.urgent == 1
    assert await q.get() == "new/x"  # the first key goes ahead
    q.done("old/a")
    q.done("old/b")
    assert q.urgent == 1  # new/x is still being processed
    assert await q.get() == "old/c"  # one follow-up at a time beside it
    q.add("old/a")
    waiting = asyncio.create_task(q.get())
    await asyncio.sleep(0.02)
    assert not waiting.done()  # held back: old/c takes the one follow-up slot
    q.done("old/c")
    assert await asyncio.wait_for(waiting, 1) == "old/a"  # a slot freed: it goes
    q.add("old/b")
    waiting = asyncio.create_task(q.get())
    await asyncio.sleep(0.02)
    assert not waiting.done()
    q.done("new/x")  # the burst is served: no limit any more
    assert q.urgent == 0
    assert await asyncio.wait_for(waiting, 1) == "old/b"


async def test_without_a_limit_follow_ups_never_wait_for_first_keys() -> None:
    q = WorkQueue()
    q.add("new/x", first=True)
    assert await q.get() == "new/x"
    for key in ("old/a", "old/b", "old/c"):
        q.add(key)
    assert [await q.get() for _ in range(3)] == ["old/a", "old/b", "old/c"]
