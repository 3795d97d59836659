"""A persisted checkpoint so an importer that was killed can continue where it stopped.

Resuming is sound only where a source offset maps one-to-one onto a target offset: an
uncompressed raw image from a source with ranges (checkpoints are written only then). Every
``interval`` bytes the decode stage makes the target durable (fdatasync) and then records the
offset, so the checkpoint never claims more than the disk holds. It also records what identifies
the source (an identity the worker chose, e.g. the URL; size; ETag or Last-Modified): a changed
source restarts from byte 0. A checksum can still be verified on resume, because the bytes
already imported are re-read from the target.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from dataclasses import asdict, dataclass

from cdi.api.errors import WorkerError
from datapath.target import RawWriter
from datapath.target.nofollow import open_fresh, open_regular

INTERVAL = 256 * 1024 * 1024


@dataclass(frozen=True)
class Checkpoint:
    source_id: str  # opaque identity the worker chose (the importer: URL or file path)
    size: int
    validator: str  # ETag or Last-Modified of the source
    offset: int  # source bytes durably written to the target

    def matches(self, source_id: str, size: int | None, validator: str | None) -> bool:
        return (self.source_id, self.size, self.validator) == (source_id, size, validator)


def load(path: str) -> Checkpoint | None:
    try:
        with os.fdopen(open_regular(path), encoding="utf-8") as fh:
            return Checkpoint(**json.load(fh))
    except (OSError, ValueError, TypeError, WorkerError):  # a planted link or junk: no resume
        return None


def save(path: str, checkpoint: Checkpoint) -> None:
    tmp = f"{path}.tmp"
    with os.fdopen(open_fresh(tmp), "w", encoding="utf-8") as fh:
        json.dump(asdict(checkpoint), fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def remove(path: str | None) -> None:
    if path:
        with contextlib.suppress(OSError):
            os.unlink(path)


class Checkpointer:
    """Called by the decode stage with the sequential position after each write."""

    def __init__(
        self, path: str, base: Checkpoint, writer: RawWriter, interval: int = INTERVAL
    ) -> None:
        self.path = path
        self.base = base
        self.writer = writer
        self.fd = writer.fd
        self.interval = interval
        self.next_at = base.offset + interval

    def __call__(self, position: int) -> None:
        if position < self.next_at:
            return
        st = os.fstat(self.fd)
        if stat.S_ISREG(st.st_mode) and st.st_size < position:  # trailing zeros are holes too
            os.ftruncate(self.fd, position)
        self.writer.flush()  # writes still in flight are not on disk yet
        os.fdatasync(self.fd)
        save(
            self.path,
            Checkpoint(self.base.source_id, self.base.size, self.base.validator, position),
        )
        self.next_at = position + self.interval
