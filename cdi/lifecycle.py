"""How the control-plane servers live: serve until SIGTERM/SIGINT, doing periodic work between.

The webhook and the upload processes (token API, proxy) all run the same loop: wait for a stop
signal or the next check (certificate rotation, key rotation), run the check, keep serving if
it fails. One helper, so a fix to shutdown or to the cadence lands in every process. And how
their logging follows CDIConfig ``logVerbosity`` (``LogVerbosity``), the same in every process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable

from cdi.api.config import CDIConfig

log = logging.getLogger(__name__)


async def run_until_stopped(
    interval: float | Callable[[], float],
    periodic: Callable[[], Awaitable[None]],
    tick: float = 5.0,
) -> None:
    """Call ``periodic`` every ``interval`` seconds until SIGTERM or SIGINT arrives; a failed
    call is logged and retried at the next interval. A callable ``interval`` is asked again
    every ``tick`` seconds (a shorter one, e.g. a new CA lifetime, takes effect then)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    if callable(interval):
        due, ticking = interval, True
    else:
        fixed = float(interval)
        due, ticking = (lambda: fixed), False
    last = loop.time()
    while not stop.is_set():
        wait = min(tick, due()) if ticking else due()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), wait)
        if stop.is_set():
            break
        if ticking and loop.time() - last < due():
            continue
        last = loop.time()
        try:
            await periodic()
        except Exception as exc:  # keep serving with what we have; retry later
            log.warning("periodic check failed: %s", exc)


class LogVerbosity:
    """CDIConfig ``spec.logVerbosity`` applied to this process: the root logger's level follows
    it (``cdi.api.config.log_level_for``), and goes back to the ``--log-level`` flag's
    (``flag_level``, else the level when this was made) once it is unset. The caller hands it
    every CDIConfig it reads: the controller from its informer, the webhook and the upload
    processes from the TLS profile's periodic read (``cdi.pki.profile``)."""

    def __init__(self, logger: logging.Logger | None = None, flag_level: int | None = None) -> None:
        self.logger = logger if logger is not None else logging.getLogger()
        self.flag_level = self.logger.level if flag_level is None else flag_level

    def apply(self, config: CDIConfig) -> None:
        wanted = config.log_level
        level = self.flag_level if wanted is None else wanted
        if level == self.logger.level:
            return
        self.logger.setLevel(level)
        # WARNING: a change of what this process logs shows whatever the level is now
        log.warning(
            "log level %s (CDIConfig logVerbosity %s)",
            logging.getLevelName(level),
            "unset" if config.spec.log_verbosity is None else config.spec.log_verbosity,
        )
