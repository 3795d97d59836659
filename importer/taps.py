"""Taps on the source byte stream: checksum and progress.

The checksum covers the source bytes exactly as they arrived (compressed, before any decoding),
as CDI's does, and every byte exactly once even when a download resumes. It runs on its own
thread stage: hashlib releases the GIL on large buffers, so it overlaps decompression.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from cdi.api.errors import ChecksumMismatch, InvalidConfig

_HEX_LENGTHS = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}
_SPEC = re.compile(r"^(md5|sha1|sha256|sha512):([0-9a-fA-F]+)$")


@dataclass(frozen=True)
class ChecksumSpec:
    algorithm: str
    hexdigest: str

    @classmethod
    def parse(cls, text: str) -> ChecksumSpec:
        match = _SPEC.match(text.strip())
        if not match or len(match.group(2)) != _HEX_LENGTHS[match.group(1)]:
            raise InvalidConfig(
                f"checksum {text!r} is not <md5|sha1|sha256|sha512>:<hex digest of its length>"
            )
        return cls(match.group(1), match.group(2).lower())

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.hexdigest}"


def hash_stream(algorithm: str, chunks: Iterator[bytes]) -> str:
    """Consume ``chunks`` and return ``algorithm:hexdigest``."""
    digest = hashlib.new(algorithm)
    for chunk in chunks:
        digest.update(chunk)
    return f"{algorithm}:{digest.hexdigest()}"


def verify(expected: ChecksumSpec, actual: str) -> None:
    if actual != str(expected):
        raise ChecksumMismatch(f"checksum mismatch: expected {expected}, calculated {actual}")


@dataclass
class Progress:
    """Bytes moved so far; read by the metrics endpoint and the terminal progress bar."""

    total: int | None = None
    done: int = 0
    phase: str = "Pending"
    started: float = field(default_factory=time.monotonic)

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
