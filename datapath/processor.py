"""The importer as an explicit phase machine: the paths an import can take, one handler each.

    Info -> Transfer -> Verify -> Resize -> Complete                  raw, qcow2/vdi/vmdk (streamed)
    Info -> Transfer -> TransferScratch -> Verify -> Validate -> ...  image too disordered to stream
    Info -> Transfer -> Verify -> Validate -> Convert -> Resize -> ... vhd/vhdx (qemu-img converts)
    Info -> Blank -> Resize -> Complete                               blank disk
    Info -> Transfer -> Verify -> Complete                            archive
    any  -> Failed (typed error; the target file is removed: never reported or left "complete")

Transfer is one streaming pass: the event loop reads the source and feeds two thread stages, the
checksum and the decode stage (``datapath.decode``), each bounded, so memory is constant.
"""

from __future__ import annotations

import contextlib
import enum
import os
import time
from collections.abc import Awaitable, Callable, Iterator

from cdi.api.constants import ContentType
from cdi.api.errors import InvalidConfig, WorkerError
from cdi.api.termination import REASON_COMPLETED, TerminationMessage
from datapath import checkpoint, qemu
from datapath.checkpoint import Checkpoint, Checkpointer
from datapath.decode import SCRATCH_NAME, DecodePlan, DecodeResult, decode_into
from datapath.decode.rawpieces import LayoutNotStreamable
from datapath.formats import ImageFormat
from datapath.sources import Source, SourceInfo
from datapath.stage import ThreadStage
from datapath.streams import CHUNK_SIZE
from datapath.taps import Progress, hash_stream, verify
from datapath.target import RawWriter, open_target
from importer.config import ImportConfig


class Phase(enum.Enum):
    INFO = "Info"
    BLANK = "Blank"
    TRANSFER = "Transfer"
    TRANSFER_SCRATCH = "TransferScratch"
    VERIFY = "Verify"
    VALIDATE = "Validate"
    CONVERT = "Convert"
    RESIZE = "Resize"
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
    Phase.COMPLETE: "Complete",
}


class Importer:
    """One import. State lives only for the import's duration; handlers return the next phase."""

    def __init__(self, config: ImportConfig, source: Source | None, progress: Progress) -> None:
        self.config = config
        self.source = source
        self.progress = progress
        self.fd = -1
        self.capacity: int | None = None
        self.decoded = DecodeResult()
        self.actual_checksum: str | None = None
        self.scratch_dir = self._pick_scratch_dir()
        self.info = SourceInfo(size=None, ranges=False)
        self.resume_offset = 0
        self.notes: list[str] = []  # said in the final message
        self.handlers: dict[Phase, Callable[[], Awaitable[Phase]]] = {
            Phase.INFO: self._info,
            Phase.BLANK: self._blank,
            Phase.TRANSFER: self._transfer,
            Phase.TRANSFER_SCRATCH: self._transfer_scratch,
            Phase.VERIFY: self._verify,
            Phase.VALIDATE: self._validate,
            Phase.CONVERT: self._convert,
            Phase.RESIZE: self._resize,
        }

    async def run(self) -> TerminationMessage:
        started = time.monotonic()
        phase, visited = Phase.INFO, set()
        try:
            while phase is not Phase.COMPLETE:
                if phase in visited:
                    raise RuntimeError(f"loop detected on phase {phase.value}")
                visited.add(phase)
                self.progress.phase = _PROGRESS_PHASE[phase]
                phase = await self.handlers[phase]()
        except WorkerError as exc:
            self.progress.phase = "Failed"
            self._discard(keep_for_resume=exc.transient)
            return self._message(exc.reason, exc.message, started, transient=exc.transient)
        finally:
            self._close()
            if self.source is not None:
                await self.source.close()
        self._cleanup_scratch()
        self.progress.phase = "Complete"
        self.progress.done = self.progress.total or self.progress.done
        checkpoint.remove(self.config.checkpoint_path)
        text = "; ".join(["Import Complete", *self.notes])
        return self._message(REASON_COMPLETED, text, started)

    def _message(
        self, reason: str, text: str, started: float, *, transient: bool = False
    ) -> TerminationMessage:
        return TerminationMessage(
            reason=reason,
            message=text,
            transient=transient,
            bytes_read=self.progress.done,
            bytes_written=self.decoded.bytes_written,
            virtual_size=self.decoded.virtual_size,
            format_chain=tuple(self.decoded.format_chain),
            checksum=self.actual_checksum,
            duration_seconds=round(time.monotonic() - started, 3),
            scratch_used=self.decoded.scratch_path is not None,
            resumed_from=self.resume_offset,
            preallocation_applied=self.config.target.preallocate,
            labels=self.config.labels,
        )

    # -- phases -------------------------------------------------------------------------------

    async def _info(self) -> Phase:
        target = self.config.target
        if self.config.content_type is ContentType.ARCHIVE:
            if target.block:
                raise InvalidConfig("content type archive needs a filesystem volume")
            os.makedirs(target.path, exist_ok=True)
            self.capacity = target.size
        if self.config.source == "blank":
            if self.config.content_type is ContentType.ARCHIVE:
                raise InvalidConfig("Cannot create empty disk with content type archive")
            self.fd, self.capacity = open_target(target)
            return Phase.BLANK
        if self.source is None:
            raise InvalidConfig(f"unknown source {self.config.source!r}")
        self.info = await self.source.probe()
        self.progress.total = self.info.size
        if self.config.content_type is ContentType.KUBEVIRT:
            self.resume_offset = self._resume_offset()
            self.fd, self.capacity = open_target(target, truncate=not self.resume_offset)
        return Phase.TRANSFER

    def _resume_offset(self) -> int:
        """Where a checkpoint of an earlier, interrupted attempt lets us continue (0: fresh)."""
        path, info = self.config.checkpoint_path, self.info
        found = checkpoint.load(path) if path else None
        if found is None:
            return 0
        checkpoint.remove(path)
        if not found.offset:
            self.notes.append(
                "an earlier attempt was interrupted before any resumable progress (only raw "
                "images resume; qcow2, vmdk, vdi and compressed ones cannot); restarted from "
                "byte 0"
            )
            return 0
        if not (
            info.ranges
            and found.matches(self._source_id(), info.size, info.validator)
            and os.path.exists(self.config.target.path)
        ):
            self.notes.append(
                "an earlier attempt's checkpoint does not match the source; restarted from byte 0"
            )
            return 0
        return found.offset

    async def _blank(self) -> Phase:
        if self.capacity is None:
            raise InvalidConfig("a blank disk needs a size")
        self.decoded.virtual_size = self.capacity
        return Phase.RESIZE

    async def _transfer(self) -> Phase:
        try:
            await self._stream_source(stream_images=True)
        except LayoutNotStreamable:
            return Phase.TRANSFER_SCRATCH
        return Phase.VERIFY

    async def _transfer_scratch(self) -> Phase:
        """The image layout was too disordered to stream: download again, through scratch."""
        self._close()
        self.fd, self.capacity = open_target(self.config.target)
        self.decoded = DecodeResult()
        self.progress.done = 0
        await self._stream_source(stream_images=False)
        return Phase.VERIFY

    async def _stream_source(self, *, stream_images: bool) -> None:
        assert self.source is not None
        self._mark_attempt()
        target = self.config.target
        writer = None
        if self.fd >= 0:
            writer = RawWriter(
                self.fd, self.capacity, direct=True, zero_fill=target.block and not target.zeroed
            )
        plan = DecodePlan(
            content_type=self.config.content_type,
            capacity=self.capacity,
            writer=writer,
            archive_dir=target.path,
            scratch_dir=self.scratch_dir,
            stream_images=stream_images,
            before_random_writes=self._zero_block_device if writer and writer.zero_fill else None,
            resume_offset=self.resume_offset,
            checkpointer=self._checkpointer(writer),
            spill_limit=self.config.qcow2_spill_limit,
            source_size=self.info.size,
        )

        def consume(chunks: Iterator[bytes]) -> DecodeResult:
            decoded = decode_into(chunks, plan, self.decoded)
            if writer is not None:
                writer.flush()  # a write that failed in flight fails the decode stage
            return decoded

        decode = ThreadStage(consume, name="decode")
        checksum = self.config.checksum
        hasher = (
            ThreadStage(
                lambda chunks: hash_stream(checksum.algorithm, self._with_prefix(chunks)),
                name="hash",
            )
            if checksum
            else None
        )
        self.progress.done = self.resume_offset
        try:
            async for chunk in self.source.stream(self.resume_offset):
                self.progress.add(len(chunk))
                if hasher is not None:
                    await hasher.put(chunk)
                await decode.put(chunk)
            await decode.finish()
            if hasher is not None:
                self.actual_checksum = await hasher.finish()
        except BaseException:
            await decode.abort()
            if hasher is not None:
                await hasher.abort()
            raise
        finally:
            if writer is not None:
                writer.close()  # the decode thread is done with it either way

    async def _verify(self) -> Phase:
        if self.config.checksum is not None:
            assert self.actual_checksum is not None
            verify(self.config.checksum, self.actual_checksum)
        if self.config.content_type is ContentType.ARCHIVE:
            return Phase.COMPLETE
        return Phase.VALIDATE if self.decoded.scratch_path else Phase.RESIZE

    async def _validate(self) -> Phase:
        path = self.decoded.scratch_path
        assert path is not None
        info = qemu.info(path, self.decoded.image_format)
        qemu.check_safe(info, path, self.capacity)
        self.decoded.virtual_size = info.virtual_size
        return Phase.CONVERT

    async def _convert(self) -> Phase:
        path = self.decoded.scratch_path
        assert path is not None
        target = self.config.target
        fmt: ImageFormat = self.decoded.image_format
        self._close()
        # The scratch file is deleted only after the target is durable (end of run): on a
        # filesystem mounted with `discard`, freeing ~700 MB before the fsync made that fsync
        # wait for the discards (vdi imports took 1.8 or 4.0 s, bimodal).
        qemu.convert(path, fmt, target.path, block=target.block, zeroed=target.zeroed)
        self.fd = os.open(target.path, os.O_WRONLY | os.O_CLOEXEC)
        self.decoded.bytes_written = _allocated(target.path, target.block, self.decoded)
        return Phase.RESIZE

    async def _resize(self) -> Phase:
        target = self.config.target
        size = self.decoded.virtual_size
        if not target.block and self.capacity is not None:
            size = max(size, self.capacity)  # grow to the usable size, as CDI does; never shrink
        RawWriter(self.fd, self.capacity, zero_fill=False).finish(
            size, preallocate=target.preallocate, block=target.block
        )
        if not target.block:
            os.chmod(target.path, 0o660)
        return Phase.COMPLETE

    # -- helpers ------------------------------------------------------------------------------

    def _pick_scratch_dir(self) -> str:
        """The mounted scratch volume, else (filesystem targets) a folder beside the target."""
        wanted = self.config.scratch_dir
        if wanted and (os.path.isdir(wanted) or self.config.target.block):
            return wanted
        return os.path.join(
            os.path.dirname(os.path.abspath(self.config.target.path)), ".cdi-scratch"
        )

    def _source_id(self) -> str:
        return self.config.http.url if self.config.http else self.config.file_path or ""

    def _mark_attempt(self) -> None:
        """A checkpoint at offset 0 before the first byte: if this attempt is killed, the next
        one can say it restarted (a raw import's Checkpointer replaces it with real progress;
        success or a permanent failure removes it)."""
        path, info = self.config.checkpoint_path, self.info
        if path and not self.resume_offset:
            base = Checkpoint(self._source_id(), info.size or 0, info.validator or "", 0)
            with contextlib.suppress(OSError):
                checkpoint.save(path, base)

    def _checkpointer(self, writer: RawWriter | None) -> Checkpointer | None:
        info, path = self.info, self.config.checkpoint_path
        if not (path and info.ranges and info.size and info.validator and writer is not None):
            return None
        base = Checkpoint(self._source_id(), info.size, info.validator, self.resume_offset)
        return Checkpointer(path, base, writer, self.config.checkpoint_interval)

    def _with_prefix(self, chunks: Iterator[bytes]) -> Iterator[bytes]:
        """On resume the checksum must still cover the bytes imported before: re-read them
        from the target (raw, so target bytes are source bytes; holes read as zeros)."""
        if self.resume_offset:
            with open(self.config.target.path, "rb") as fh:
                remaining = self.resume_offset
                while remaining:
                    piece = fh.read(min(remaining, CHUNK_SIZE))
                    if not piece:
                        raise InvalidConfig("the target is shorter than its checkpoint says")
                    remaining -= len(piece)
                    yield piece
        yield from chunks

    def _zero_block_device(self) -> None:
        """Random-order writes leave gaps: zero the device first (discard or write-zeroes)."""
        assert self.capacity is not None
        RawWriter(self.fd, self.capacity, zero_fill=True).zero_range(0, self.capacity)

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _discard(self, *, keep_for_resume: bool) -> None:
        """A failed import must not leave a file that looks like a finished disk. After a
        transient failure a checkpointed target is kept, for the next attempt to resume (its
        termination message says failed, so it is never taken for complete)."""
        self._close()
        target = self.config.target
        path = self.config.checkpoint_path
        if keep_for_resume and path and os.path.exists(path):
            return
        checkpoint.remove(path)
        if not target.block and self.config.content_type is ContentType.KUBEVIRT:
            with contextlib.suppress(OSError):
                os.unlink(target.path)
        self._cleanup_scratch()

    def _cleanup_scratch(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.scratch_dir, SCRATCH_NAME))
        if self.scratch_dir != self.config.scratch_dir:  # the folder we made beside the target
            with contextlib.suppress(OSError):
                os.rmdir(self.scratch_dir)


def _allocated(path: str, block: bool, decoded: DecodeResult) -> int:
    if block:
        return decoded.virtual_size
    return os.stat(path).st_blocks * 512
