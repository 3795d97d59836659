"""Polling with a deadline, for tests and the harness: ``wait_until(fn)`` returns fn's first
truthy value or raises ``TimeoutError`` naming what it waited for and the last value seen."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    fn: Callable[[], T | None], what: str, timeout: float = 60.0, interval: float = 0.2
) -> T:
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = fn()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(
                f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}"
            )
        time.sleep(interval)
