"""How the control-plane servers live: serve until SIGTERM/SIGINT, doing periodic work between.

The webhook and the upload processes (token API, proxy) all run the same loop: wait for a stop
signal or the next check (certificate rotation, key rotation), run the check, keep serving if
it fails. One helper, so a fix to shutdown or to the cadence lands in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)


async def run_until_stopped(interval: float, periodic: Callable[[], Awaitable[None]]) -> None:
    """Call ``periodic`` every ``interval`` seconds until SIGTERM or SIGINT arrives; a failed
    call is logged and retried at the next interval."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
        if stop.is_set():
            break
        try:
            await periodic()
        except Exception as exc:  # keep serving with what we have; retry later
            log.warning("periodic check failed: %s", exc)
