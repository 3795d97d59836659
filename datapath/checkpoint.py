"""A persisted checkpoint so an importer that was killed can continue where it stopped.

Resuming is sound only where a source offset maps one-to-one onto a target offset: an
uncompressed raw image from a source with ranges (checkpoints are written only then). Every
``interval`` bytes the decode stage makes the target durable (fdatasync) and then records the
offset, so the checkpoint never claims more than the disk holds. It also records what identifies
the source (an identity the worker chose, e.g. the URL; size; ETag or Last-Modified): a changed
source restarts from byte 0. A checksum can still be verified on resume, because the bytes
already imported are re-read from the target.

The checkpoint and the target live in the tenant's volume, so both can be planted. A checkpoint
is therefore bound to what was written: it carries the BLAKE3 digest of the target prefix it
vouches for (a running hash the decode stage keeps over the bytes it writes; BLAKE3 because it
costs a quarter of SHA-256's CPU, 0.54 s per 2 GiB here, and stays collision resistant: the
tenant chooses the source, so a hash with practical collisions would let them serve one prefix
and plant another), and a resume recomputes
that hash over the kept prefix (``verify_prefix``) and restarts from byte 0 on any difference.
That alone stops a planted ``disk.img`` under a real checkpoint, an edited offset, and a stale or
corrupted prefix, but not a tenant who plants both and computes the hash of their own bytes. So
a worker in a tenant's volume passes ``attested``: the (offset, digest) it may resume from, taken
from outside the volume (the importer pod: ``IMPORTER_CHECKPOINT_ATTESTED``, which the
controller fills from what it scraped from the previous attempt's metrics, see
``docs/security.md``); with ``require_attested`` the file's own claim is never enough. The
trailing bytes after the kept prefix are cut off before the import continues (holes left by
zero detection must read as zeros, not as whatever an earlier writer left there).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import blake3

from cdi.api.errors import WorkerError
from datapath.target import RawWriter
from datapath.target.nofollow import open_fresh, open_regular

INTERVAL = 256 * 1024 * 1024
_READ = 4 * 1024 * 1024


@dataclass(frozen=True)
class Checkpoint:
    source_id: str  # opaque identity the worker chose (the importer: URL or file path)
    size: int
    validator: str  # ETag or Last-Modified of the source
    offset: int  # source bytes durably written to the target
    digest: str = ""  # BLAKE3 (hex) of the target's first ``offset`` bytes

    def matches(self, source_id: str, size: int | None, validator: str | None) -> bool:
        return (self.source_id, self.size, self.validator) == (source_id, size, validator)


def load(path: str) -> Checkpoint | None:
    try:
        with os.fdopen(open_regular(path), encoding="utf-8") as fh:
            return Checkpoint(**json.load(fh))
    except (OSError, ValueError, TypeError, WorkerError):  # a planted link or junk: no resume
        return None


def verify_prefix(path: str, offset: int, digest: str) -> Any | None:
    """The running hash of the target's first ``offset`` bytes if it equals ``digest`` (to go
    on hashing from there), else None. Holes read as zeros, as they were hashed."""
    if not digest or offset < 0:
        return None
    running = blake3.blake3()
    try:
        with os.fdopen(open_regular(path), "rb", buffering=0) as fh:
            remaining = offset
            while remaining:
                piece = fh.read(min(remaining, _READ))
                if not piece:
                    return None  # shorter than the checkpoint says
                running.update(piece)
                remaining -= len(piece)
    except (OSError, WorkerError):
        return None
    return running if running.hexdigest() == digest else None


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
    """Called by the decode stage with each piece it wrote and the sequential position after
    it; ``running`` is the hash of the prefix before ``base.offset`` (``verify_prefix``).
    ``on_saved`` is told every checkpoint made durable (the importer publishes it for the
    controller to attest)."""

    def __init__(
        self,
        path: str,
        base: Checkpoint,
        writer: RawWriter,
        interval: int = INTERVAL,
        running: Any | None = None,
        on_saved: Callable[[Checkpoint], None] | None = None,
    ) -> None:
        self.path = path
        self.base = base
        self.writer = writer
        self.fd = writer.fd
        self.interval = interval
        self.next_at = base.offset + interval
        self.running = running if running is not None else blake3.blake3()
        self.on_saved = on_saved

    def __call__(self, piece: bytes | memoryview, position: int) -> None:
        self.running.update(piece)  # releases the GIL: the writes in flight go on meanwhile
        if position < self.next_at:
            return
        st = os.fstat(self.fd)
        if stat.S_ISREG(st.st_mode) and st.st_size < position:  # trailing zeros are holes too
            os.ftruncate(self.fd, position)
        self.writer.flush()  # writes still in flight are not on disk yet
        os.fdatasync(self.fd)
        saved = replace(self.base, offset=position, digest=self.running.hexdigest())
        save(self.path, saved)
        if self.on_saved is not None:
            self.on_saved(saved)
        self.next_at = position + self.interval
