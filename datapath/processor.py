"""The data path as an explicit phase machine: the paths a run can take, one handler each.

    Info -> Transfer -> Verify -> Resize -> Complete                  raw, qcow2/vdi/vmdk (streamed)
    Info -> Transfer -> TransferScratch -> Verify -> Validate -> ...  too disordered to stream,
                                                                      replayable sources only
    Info -> Transfer -> Verify -> Validate -> Convert -> Resize -> ... vhd/vhdx (qemu-img converts)
    Info -> Blank -> Resize -> Complete                               blank disk (plan.blank)
    Info -> Transfer -> Verify -> Complete                            archive, filesystem-clone
    ... -> Resize -> ReadBack -> Complete      a verified volume (plan.verify): the target is
                                               read back from the device and compared with the
                                               digest of what was written (datapath.verify)
    any  -> Failed (typed error; the target file is removed: never reported or left "complete")

``Processor`` takes a ``Source`` and a frozen ``ProcessPlan``, never a worker's configuration.
What a phase learns is handed to the next one in an explicit ``RunState`` that handlers return;
the target's descriptor lives in a ``TargetHandle``. The fallback for an image too disordered
to stream is chosen at Info from what the source says: a replayable source may be streamed
again through scratch; a one-shot source (an upload body) never is. Every blocking call (open,
fsync, chmod, qemu-img) runs off the event loop, and ``transfer_done`` is set (and
``on_transfer_done`` awaited) as soon as all source bytes are in, before Validate/Convert.
"""

from __future__ import annotations

import asyncio
import enum
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field, replace

from cdi.api.constants import ContentType
from cdi.api.errors import InvalidConfig, ScratchSpaceRequired, WorkerError
from cdi.api.termination import (
    REASON_COMPLETED,
    VERIFICATION_NOT_SUPPORTED,
    VERIFIED,
    TerminationMessage,
    Verification,
)
from datapath import qemu
from datapath.checkpoint import Checkpoint
from datapath.decode import DecodePlan, DecodeResult, decode_into
from datapath.decode.rawpieces import LayoutNotStreamable
from datapath.plan import ProcessPlan
from datapath.run_files import RunFiles
from datapath.sources import Source, SourceInfo
from datapath.taps import Progress, verify
from datapath.target import RawWriter, TargetHandle, TargetSpec, preallocate_tree
from datapath.transfer import pump
from datapath.verify import WriteDigest, compare_files, read_into


class Phase(enum.Enum):
    INFO = "Info"
    BLANK = "Blank"
    TRANSFER = "Transfer"
    TRANSFER_SCRATCH = "TransferScratch"
    VERIFY = "Verify"
    VALIDATE = "Validate"
    CONVERT = "Convert"
    RESIZE = "Resize"
    READ_BACK = "ReadBack"
    COMPLETE = "Complete"


_PROGRESS_PHASE = {
    Phase.INFO: "Pending",
    Phase.BLANK: "Resizing",
    Phase.TRANSFER: "Transferring",
    Phase.TRANSFER_SCRATCH: "Transferring",
    Phase.VERIFY: "Validating",
    Phase.VALIDATE: "Validating",
    Phase.CONVERT: "Converting",
    Phase.RESIZE: "Resizing",
    Phase.READ_BACK: "Validating",
    Phase.COMPLETE: "Complete",
}

_FILE_CONTENT = (  # a disk image target
    ContentType.KUBEVIRT,
    ContentType.BLOCKDEVICE_CLONE,
    ContentType.BLOCKDEVICE_CLONE_SPARSE,
)
_TREE_CONTENT = (ContentType.ARCHIVE, ContentType.FILESYSTEM_CLONE)  # a folder of files


@dataclass(frozen=True)
class RunState:
    """What the phases have learnt so far. ``decoded`` is filled by the decode stage as it
    goes (so a failure still reports the format chain found); everything else is replaced."""

    info: SourceInfo = field(default_factory=lambda: SourceInfo(size=None, ranges=False))
    restream: bool = False  # the fallback chosen at Info: may the source be read again?
    resume_offset: int = 0
    decoded: DecodeResult = field(default_factory=DecodeResult)
    checksum: str | None = None  # computed over the source bytes
    notes: tuple[str, ...] = ()  # said in the final message


Step = tuple[Phase, RunState]
TransferHook = Callable[[], Awaitable[None]]
# Called on a worker thread with the target once it is durable, before it is read back: tests
# corrupt the target here to show a mismatch fails the run.
ReadBackHook = Callable[[TargetSpec], None]


class Processor:
    """One run of the data path. Create one per run; ``run()`` returns the typed result."""

    def __init__(
        self,
        plan: ProcessPlan,
        source: Source | None,
        progress: Progress | None = None,
        *,
        on_transfer_done: TransferHook | None = None,
        before_read_back: ReadBackHook | None = None,
    ) -> None:
        if (source is None) != plan.blank:
            raise InvalidConfig("a blank disk takes no source; anything else needs one")
        self.plan = plan
        self.source = source
        self.progress = progress or Progress()
        self.transfer_done = asyncio.Event()
        self._on_transfer_done = on_transfer_done
        self._before_read_back = before_read_back
        # A verified volume: the digest of what the current pass writes (a re-read through
        # scratch starts a new one), why the target cannot be checked against it, the result.
        self._digest: WriteDigest | None = None
        self._tree_digests: dict[str, WriteDigest] | None = None  # an archive's files
        self._unverifiable: str | None = None
        self.verification: Verification | None = None
        self.target = TargetHandle(plan.target)
        self.files = RunFiles(plan)
        self.handlers: dict[Phase, Callable[[RunState], Awaitable[Step]]] = {
            Phase.INFO: self._info,
            Phase.BLANK: self._blank,
            Phase.TRANSFER: self._transfer,
            Phase.TRANSFER_SCRATCH: self._transfer_scratch,
            Phase.VERIFY: self._verify,
            Phase.VALIDATE: self._validate,
            Phase.CONVERT: self._convert,
            Phase.RESIZE: self._resize,
            Phase.READ_BACK: self._read_back,
        }

    async def run(self) -> TerminationMessage:
        started = time.monotonic()
        phase, state, visited = Phase.INFO, RunState(), set()
        try:
            with self.target:
                while phase is not Phase.COMPLETE:
                    if phase in visited:
                        raise RuntimeError(f"loop detected on phase {phase.value}")
                    visited.add(phase)
                    self.progress.phase = _PROGRESS_PHASE[phase]
                    phase, state = await self.handlers[phase](state)
        except WorkerError as exc:
            self.progress.phase = "Failed"
            await asyncio.to_thread(self.files.discard, keep_for_resume=exc.transient)
            message = self._message(state, exc.reason, exc.message, started, exc.transient)
            return replace(message, scratch_space_required=isinstance(exc, ScratchSpaceRequired))
        except BaseException:  # a bug or a cancellation: nothing may look complete either
            self.progress.phase = "Failed"
            self.files.discard(keep_for_resume=False)
            raise
        finally:
            if self.source is not None:
                await self.source.close()
        await asyncio.to_thread(self.files.succeeded)
        self.progress.phase = "Complete"
        self.progress.done = self.progress.total or self.progress.done
        text = "; ".join(["Import Complete", *state.notes])
        return self._message(state, REASON_COMPLETED, text, started)

    def _message(
        self, state: RunState, reason: str, text: str, started: float, transient: bool = False
    ) -> TerminationMessage:
        decoded = state.decoded
        return TerminationMessage(
            reason=reason,
            message=text,
            transient=transient,
            bytes_read=self.progress.done,
            bytes_written=decoded.bytes_written,
            virtual_size=decoded.virtual_size,
            format_chain=tuple(decoded.format_chain),
            checksum=state.checksum,
            duration_seconds=round(time.monotonic() - started, 3),
            scratch_used=decoded.scratch_path is not None or decoded.scratch_bytes > 0,
            scratch_bytes=decoded.scratch_bytes,
            resumed_from=state.resume_offset,
            preallocation_applied=self._preallocates,
            labels=dict(self.plan.labels),
            verification=self.verification,
        )

    @property
    def _preallocates(self) -> bool:
        """Preallocation asked for and applied: an archive's files are not (CDI: disk images
        only), a disk image and a filesystem clone's files are."""
        return self.plan.target.preallocate and self.plan.content_type != ContentType.ARCHIVE

    # -- phases -------------------------------------------------------------------------------

    async def _info(self, state: RunState) -> Step:
        plan, target = self.plan, self.plan.target
        if plan.content_type in _TREE_CONTENT:
            if target.block:
                raise InvalidConfig(f"content type {plan.content_type} needs a filesystem volume")
            await asyncio.to_thread(os.makedirs, target.path, exist_ok=True)
            self.target.capacity = target.size
        if plan.blank:
            if plan.content_type not in _FILE_CONTENT:
                raise InvalidConfig(
                    f"Cannot create empty disk with content type {plan.content_type}"
                )
            await self.target.open()
            return Phase.BLANK, state
        assert self.source is not None
        info = await self.source.probe()
        self.progress.total = info.size
        state = replace(state, info=info, restream=info.replayable)
        if plan.content_type in _FILE_CONTENT:
            offset, notes = await asyncio.to_thread(self.files.resume_offset, info)
            state = replace(state, resume_offset=offset, notes=state.notes + notes)
            await self.target.open(truncate=not offset)
            if offset:  # what lay past the verified prefix is not the source's
                await asyncio.to_thread(os.ftruncate, self.target.fd, offset)
        return Phase.TRANSFER, state

    async def _blank(self, state: RunState) -> Step:
        if self.target.capacity is None:
            raise InvalidConfig("a blank disk needs a size")
        state.decoded.virtual_size = self.target.capacity
        await self._transfer_is_done()
        return Phase.RESIZE, state

    async def _transfer(self, state: RunState) -> Step:
        try:
            return Phase.VERIFY, await self._stream_source(state, stream_images=True)
        except LayoutNotStreamable:
            if not state.restream:
                raise  # a one-shot source is never read twice
            return Phase.TRANSFER_SCRATCH, replace(state, decoded=DecodeResult())

    async def _transfer_scratch(self, state: RunState) -> Step:
        """The image layout was too disordered to stream: read the source again, through
        scratch (only ever chosen for a replayable source)."""
        await self.target.open()
        self.progress.done = 0
        return Phase.VERIFY, await self._stream_source(state, stream_images=False)

    async def _stream_source(self, state: RunState, *, stream_images: bool) -> RunState:
        assert self.source is not None
        await asyncio.to_thread(self.files.mark_attempt, state.info, state.resume_offset)
        digest = self._digest = await self._new_digest(state)
        if self.plan.verify and self.plan.content_type in _TREE_CONTENT:
            self._tree_digests = {}
        writer = self.target.writer(direct=True, digest=digest) if self.target.is_open else None
        plan = self._decode_plan(state, writer, stream_images)

        def consume(chunks: Iterator[bytes]) -> DecodeResult:
            decoded = decode_into(chunks, plan, state.decoded)
            if writer is not None:
                writer.flush()  # a write that failed in flight fails the decode stage
            return decoded

        checksum = self.plan.checksum
        self.progress.done = state.resume_offset
        try:
            decoded, actual = await pump(
                self.source.stream(state.resume_offset),
                consume,
                self.progress,
                checksum_algorithm=checksum.algorithm if checksum else None,
                hash_prefix=lambda: self.files.target_prefix(state.resume_offset),
            )
        finally:
            if writer is not None:  # the decode thread is done with it either way
                await asyncio.to_thread(writer.close)
        return replace(state, decoded=decoded, checksum=actual)

    async def _new_digest(self, state: RunState) -> WriteDigest | None:
        """A verified volume's digest for this pass. A resumed import's prefix was written by
        an earlier attempt and vouched for by the checkpoint's attested digest: it is read in
        as if written now, so the read-back covers the whole target."""
        if not self.plan.verify or not self.target.is_open:
            return None
        digest = WriteDigest()
        if state.resume_offset:
            target = self.plan.target
            await asyncio.to_thread(
                read_into, digest, target.path, target.block, state.resume_offset
            )
        return digest

    def _decode_plan(
        self, state: RunState, writer: RawWriter | None, stream_images: bool
    ) -> DecodePlan:
        zero_first = writer is not None and writer.zero_fill
        return DecodePlan(
            content_type=self.plan.content_type,
            capacity=self.target.capacity,
            writer=writer,
            archive_dir=self.plan.target.path,
            scratch_dir=self.files.scratch_dir,
            stream_images=stream_images,
            before_random_writes=self._zero_block_device if zero_first else None,
            resume_offset=state.resume_offset,
            checkpointer=self.files.checkpointer(
                state.info, writer, state.resume_offset, self._checkpointed
            ),
            spill_limit=self.plan.spill_limit,
            source_size=state.info.size,
            tar_member=self.plan.tar_member,
            tree_digests=self._tree_digests,
        )

    def _checkpointed(self, saved: Checkpoint) -> None:
        """Published on the metrics page, for the controller to attest the next resume."""
        self.progress.checkpoint = (saved.offset, saved.digest)

    def _zero_block_device(self) -> None:
        """Random-order writes leave gaps: zero the device first (runs on the decode thread)."""
        assert self.target.capacity is not None
        self.target.writer(zero_fill=True).zero_range(0, self.target.capacity)

    async def _transfer_is_done(self) -> None:
        if not self.transfer_done.is_set():
            self.transfer_done.set()
            if self._on_transfer_done is not None:
                await self._on_transfer_done()

    async def _verify(self, state: RunState) -> Step:
        await self._transfer_is_done()
        if self.plan.checksum is not None:
            assert state.checksum is not None
            verify(self.plan.checksum, state.checksum)
        if self.plan.content_type in _TREE_CONTENT:
            if self._preallocates:  # a filesystem clone's disk.img came as a sparse member
                await asyncio.to_thread(preallocate_tree, self.plan.target.path)
            return self._after_resize(), state
        return (Phase.VALIDATE if state.decoded.scratch_path else Phase.RESIZE), state

    async def _validate(self, state: RunState) -> Step:
        path = state.decoded.scratch_path
        assert path is not None
        info = await qemu.info(path, state.decoded.image_format)
        qemu.check_safe(info, path, self.target.capacity)
        state.decoded.virtual_size = info.virtual_size
        return Phase.CONVERT, state

    async def _convert(self, state: RunState) -> Step:
        decoded, target = state.decoded, self.plan.target
        assert decoded.scratch_path is not None
        self._unverifiable = "qemu-img converted the image into the volume"
        self.target.close()
        # The scratch file is deleted only after the target is durable (end of run): on a
        # filesystem mounted with `discard`, freeing ~700 MB before the fsync made that fsync
        # wait for the discards (vdi imports took 1.8 or 4.0 s, bimodal).
        await qemu.convert(
            decoded.scratch_path,
            decoded.image_format,
            target.path,
            block=target.block,
            zeroed=target.zeroed,
        )
        await self.target.reopen_existing()
        if not target.block:
            st = await asyncio.to_thread(os.stat, target.path)
            decoded.bytes_written = st.st_blocks * 512
        else:
            decoded.bytes_written = decoded.virtual_size
        return Phase.RESIZE, state

    async def _resize(self, state: RunState) -> Step:
        await self.target.finish(state.decoded.virtual_size)
        return self._after_resize(), state

    def _after_resize(self) -> Phase:
        return Phase.READ_BACK if self.plan.verify else Phase.COMPLETE

    async def _read_back(self, state: RunState) -> Step:
        """The target is durable (fsync'd): read it back from the device and compare it with
        the digest of what this run wrote (datapath.verify). A mismatch fails the run."""
        why = self._why_unverifiable()
        if why is not None:
            self.verification = Verification(VERIFICATION_NOT_SUPPORTED, f"not verified: {why}")
            return Phase.COMPLETE, replace(state, notes=(*state.notes, f"not verified: {why}"))
        target = self.plan.target
        if self._before_read_back is not None:
            await asyncio.to_thread(self._before_read_back, target)
        if self._tree_digests is not None:
            files = dict(self._tree_digests)
        else:
            assert self._digest is not None
            files = {target.path: self._digest}
        # a block device is compared up to the image's end: CDI leaves the rest as it was
        length = state.decoded.virtual_size if target.block else None
        expected, found = await asyncio.to_thread(
            compare_files, files, block_device=target.block, length=length
        )
        text = (
            f"verified: {expected.blocks} non-zero 64 KiB blocks read back from the device "
            f"match what was written"
        )
        if self._tree_digests is not None:
            text += f" ({len(files)} files)"
        self.verification = Verification(
            VERIFIED, text, str(expected), expected.blocks, found.bytes_read
        )
        return Phase.COMPLETE, replace(state, notes=(*state.notes, text))

    def _why_unverifiable(self) -> str | None:
        if self.plan.blank:
            return "a blank disk: nothing was written"
        if self.plan.content_type in _TREE_CONTENT:
            if self._tree_digests is None:
                return "the archive was not extracted through the data path"
            if any(d.unordered for d in self._tree_digests.values()):
                return "an archive member was written by tarfile's own copy"
            return None
        if self._unverifiable is not None:
            return self._unverifiable
        if self._digest is None:
            return "nothing was written through the data path"
        if self._digest.unordered:
            return "pieces came out of order beyond the digest's bound"
        return None
