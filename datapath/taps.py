"""Taps on the source byte stream: checksum and progress.

The checksum covers the source bytes exactly as they arrived (compressed, before any decoding),
as CDI's does, and every byte exactly once even when a download resumes. It runs on its own
thread stage: hashlib releases the GIL on large buffers, so it overlaps decompression.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from cdi.api.checksum import Checksum, ChecksumFormatError
from cdi.api.errors import ChecksumMismatch, InvalidConfig


def parse_checksum(text: str) -> Checksum:
    """CDI's ``algorithm:hex`` checksum (shared parser in ``cdi.api.checksum``)."""
    try:
        return Checksum.parse(text)
    except ChecksumFormatError as exc:
        raise InvalidConfig(f"checksum {text!r}: {exc}") from exc


def hash_stream(algorithm: str, chunks: Iterator[bytes]) -> str:
    """Consume ``chunks`` and return ``algorithm:hexdigest``."""
    digest = hashlib.new(algorithm)
    for chunk in chunks:
        digest.update(chunk)
    return f"{algorithm}:{digest.hexdigest()}"


def verify(expected: Checksum, actual: str) -> None:
    if actual != str(expected):
        raise ChecksumMismatch(f"checksum mismatch: expected {expected}, calculated {actual}")


@dataclass
class Progress:
    """Bytes moved so far; read by the metrics endpoint and the terminal progress bar."""

    total: int | None = None
    done: int = 0
    phase: str = "Pending"
    started: float = field(default_factory=time.monotonic)
    # the last durable resume checkpoint (offset, BLAKE3 of the prefix), for the controller
    checkpoint: tuple[int, str] | None = None

    def add(self, n: int) -> None:
        self.done += n

    @property
    def rate(self) -> float:
        elapsed = time.monotonic() - self.started
        return self.done / elapsed if elapsed > 0 else 0.0

    @property
    def percent(self) -> float | None:
        if not self.total:
            return None
        return min(100.0, 100.0 * self.done / self.total)
