"""The files a run owns besides the target: scratch space and the resume checkpoint.

Kept out of the phase machine because each is a small policy of its own (where scratch goes,
when a checkpoint may be trusted, what a failure must delete) and all of it is blocking file
work: the processor calls these methods through ``asyncio.to_thread``, except the checkpointer
and the prefix reader, which run on the decode and hash threads.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Callable, Iterator
from typing import Any

from cdi.api.constants import ContentType
from cdi.api.errors import InvalidConfig
from datapath import checkpoint
from datapath.checkpoint import Checkpoint, Checkpointer
from datapath.decode import SCRATCH_NAME
from datapath.decode.spill import SPILL_PREFIX
from datapath.plan import ProcessPlan
from datapath.sources import SourceInfo
from datapath.streams import CHUNK_SIZE
from datapath.target import RawWriter
from datapath.target.nofollow import open_regular

_RESTARTED = (
    "an earlier attempt was interrupted before any resumable progress (only raw images "
    "resume; qcow2, vmdk, vdi and compressed ones cannot); restarted from byte 0"
)
_MISMATCH = "an earlier attempt's checkpoint does not match the source; restarted from byte 0"
_UNBOUND = (
    "an earlier attempt's checkpoint does not match the bytes in the volume (or was not "
    "attested); restarted from byte 0"
)


class RunFiles:
    def __init__(self, plan: ProcessPlan) -> None:
        self.plan = plan
        self.scratch_dir = self._pick_scratch_dir()
        self._resumed_hash: Any | None = None  # running BLAKE3 of the verified prefix

    def _pick_scratch_dir(self) -> str:
        """The mounted scratch volume, else (filesystem targets) a folder beside the target."""
        wanted, target = self.plan.scratch_dir, self.plan.target
        if wanted and (os.path.isdir(wanted) or target.block):
            return wanted
        return os.path.join(os.path.dirname(os.path.abspath(target.path)), ".cdi-scratch")

    @property
    def _checkpoint_path(self) -> str | None:
        return self.plan.checkpoint.path if self.plan.checkpoint else None

    def _base(self, info: SourceInfo, offset: int) -> Checkpoint:
        source_id = self.plan.checkpoint.source_id if self.plan.checkpoint else ""
        return Checkpoint(source_id, info.size or 0, info.validator or "", offset)

    def resume_offset(self, info: SourceInfo) -> tuple[int, tuple[str, ...]]:
        """Where a checkpoint of an earlier, interrupted attempt lets us continue (0: fresh),
        and what to say about it in the final message."""
        path = self._checkpoint_path
        found = checkpoint.load(path) if path else None
        if found is None:
            return 0, ()
        checkpoint.remove(path)
        if not found.offset:
            return 0, (_RESTARTED,)
        if not (
            info.ranges
            and found.matches(self._base(info, 0).source_id, info.size, info.validator)
            and os.path.exists(self.plan.target.path)
        ):
            return 0, (_MISMATCH,)
        offset, digest = self._claim(found)
        self._resumed_hash = checkpoint.verify_prefix(self.plan.target.path, offset, digest)
        if not offset or self._resumed_hash is None:
            return 0, (_UNBOUND,)
        return offset, ()

    def _claim(self, found: Checkpoint) -> tuple[int, str]:
        """The prefix a resume may keep: the attested one when the worker has one (it must
        not lie beyond what the file says was made durable), else the file's own claim unless
        the plan requires an attestation."""
        plan = self.plan.checkpoint
        assert plan is not None
        if plan.attested is not None:
            offset, digest = plan.attested
            return (offset, digest) if 0 < offset <= found.offset else (0, "")
        return (0, "") if plan.require_attested else (found.offset, found.digest)

    def mark_attempt(self, info: SourceInfo, resume_offset: int) -> None:
        """A checkpoint at offset 0 before the first byte: if this attempt is killed, the next
        one can say it restarted (a raw import's Checkpointer replaces it with real progress;
        success or a permanent failure removes it)."""
        path = self._checkpoint_path
        if path and not resume_offset:
            with contextlib.suppress(OSError):
                checkpoint.save(path, self._base(info, 0))

    def checkpointer(
        self,
        info: SourceInfo,
        writer: RawWriter | None,
        resume_offset: int,
        on_saved: Callable[[Checkpoint], None] | None = None,
    ) -> Checkpointer | None:
        plan = self.plan.checkpoint
        if not (plan and info.ranges and info.size and info.validator and writer is not None):
            return None
        running = self._resumed_hash if resume_offset else None
        base = self._base(info, resume_offset)
        return Checkpointer(plan.path, base, writer, plan.interval, running, on_saved)

    def target_prefix(self, resume_offset: int) -> Iterator[bytes]:
        """On resume the checksum must still cover the bytes imported before: re-read them
        from the target (raw, so target bytes are source bytes; holes read as zeros)."""
        if not resume_offset:
            return
        with os.fdopen(open_regular(self.plan.target.path), "rb") as fh:
            remaining = resume_offset
            while remaining:
                piece = fh.read(min(remaining, CHUNK_SIZE))
                if not piece:
                    raise InvalidConfig("the target is shorter than its checkpoint says")
                remaining -= len(piece)
                yield piece

    def succeeded(self) -> None:
        self.cleanup_scratch()
        checkpoint.remove(self._checkpoint_path)

    def discard(self, *, keep_for_resume: bool) -> None:
        """A failed run must not leave a file that looks like a finished disk. After a
        transient failure a checkpointed target is kept, for the next attempt to resume (its
        termination message says failed, so it is never taken for complete)."""
        path = self._checkpoint_path
        if keep_for_resume and path and os.path.exists(path):
            return
        checkpoint.remove(path)
        target = self.plan.target
        if not target.block and self.plan.content_type in (
            ContentType.KUBEVIRT,
            ContentType.BLOCKDEVICE_CLONE,
            ContentType.BLOCKDEVICE_CLONE_SPARSE,
        ):
            with contextlib.suppress(OSError):
                os.unlink(target.path)
        self.cleanup_scratch()

    def cleanup_scratch(self) -> None:
        """The qemu-img input and any spill file a killed decoder could not delete."""
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.scratch_dir, SCRATCH_NAME))
        for leftover in glob.glob(os.path.join(glob.escape(self.scratch_dir), SPILL_PREFIX + "*")):
            with contextlib.suppress(OSError):
                os.unlink(leftover)
        if self.scratch_dir != self.plan.scratch_dir:  # the folder we made beside the target
            with contextlib.suppress(OSError):
                os.rmdir(self.scratch_dir)
