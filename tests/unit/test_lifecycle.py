"""The control-plane servers' loop: periodic work, failures survived, SIGTERM stops it."""

from __future__ import annotations

import asyncio
import os
import signal

from cdi.lifecycle import run_until_stopped


async def test_periodic_work_runs_survives_a_failure_and_sigterm_stops_the_loop() -> None:
    calls: list[int] = []

    async def periodic() -> None:
        calls.append(len(calls))
        if len(calls) == 2:
            raise RuntimeError("the API server is away")
        if len(calls) == 4:
            os.kill(os.getpid(), signal.SIGTERM)

    await asyncio.wait_for(run_until_stopped(0.01, periodic), 5)
    assert calls == [0, 1, 2, 3]
