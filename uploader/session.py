"""The upload server's state: at most one upload at a time, and the pod's final outcome.

CDI's server keeps two flags (``uploading``, ``done``); ours keeps the one ``Upload`` in
flight, which owns its ``UploadBody`` (the resumable source) and the task running the data
path's ``Processor`` over it. Requests ask the ``Uploads`` object for what CDI answers:
another upload in flight -> ``Busy`` (503), the pod already done -> ``AlreadyDone`` (409). A
cut upload that is only waiting for its continuation does not block a plain CDI-style retry
(POST from byte 0): it is abandoned and the new one starts.

How an upload ends decides the pod's fate: success -> the termination message ``Upload
Complete`` and exit 0; a failure while a request is waiting for the answer -> the request gets
it and the server stays ready for a retry (CDI); a failure after an async upload was already
answered -> the termination message says why and the pod exits non-zero (restarted).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, replace

from cdi.api.constants import ContentType
from cdi.api.failure import failure_message
from cdi.api.termination import TerminationMessage
from datapath import Processor, checkpoint
from datapath.checkpoint import Checkpoint
from uploader.body import Busy, OffsetMismatch, UploadBody
from uploader.config import UploadConfig

log = logging.getLogger("uploader")

UPLOAD_COMPLETE = "Upload Complete"
RESTART_NOTE = (
    "the upload server restarted before this upload reached a durable checkpoint (only a raw "
    "image of known length keeps one), so it must start again from byte 0"
)


class AlreadyDone(Exception):
    """The upload completed; this pod takes no more (409)."""


@dataclass(frozen=True)
class Mode:
    content_type: ContentType
    sync: bool  # answer after conversion and resize (else once the bytes are in)


class Upload:
    """One upload in flight: its resumable body and the data path running over it."""

    def __init__(self, config: UploadConfig, mode: Mode, body: UploadBody) -> None:
        self.mode = mode
        self.body = body
        plan = config.plan_for(mode.content_type, length=body.length)
        self.processor = Processor(plan, body)
        self.task: asyncio.Task[TerminationMessage] = asyncio.ensure_future(self._run())
        self.answered_early = False  # an async upload's request was answered before the end

    async def _run(self) -> TerminationMessage:
        try:
            message = await self.processor.run()
        except Exception as exc:  # a bug: typed, redacted, logged; never a traceback outward
            return failure_message(exc, log, "upload server")
        if message.succeeded:
            rest = message.message.removeprefix("Import Complete")
            message = replace(message, message=UPLOAD_COMPLETE + rest)
        return message

    @property
    def waiting(self) -> bool:
        """Cut and waiting for a continuation (no request is sending bytes)."""
        return not self.body.attached and not self.body.finished and not self.task.done()


async def _settles(upload: Upload, grace: float = 2.0) -> bool:
    """Whether ``upload`` is (or within ``grace`` seconds becomes) only waiting for its
    continuation: a client that retries at once may see its cut before this server does."""
    for _ in range(int(grace / 0.05)):
        if upload.waiting or upload.task.done():
            return True
        if upload.body.finished:
            return False  # all bytes in, converting: a real upload in flight
        await asyncio.sleep(0.05)
    return upload.waiting


class Uploads:
    def __init__(self, config: UploadConfig) -> None:
        self.config = config
        self.current: Upload | None = None
        self.outcome: TerminationMessage | None = None  # the pod's final answer
        self.ended = asyncio.Event()  # set with ``outcome``: the process may exit

    @property
    def in_flight(self) -> bool:
        return self.current is not None and not self.current.task.done()

    async def begin(self, mode: Mode, length: int | None) -> Upload:
        """A new upload from byte 0 (POST)."""
        if self.outcome is not None:
            raise AlreadyDone()
        current = self.current
        if current is not None and not current.task.done():
            if not await _settles(current):
                raise Busy("another upload is in progress")
            current.body.abandon("a new upload started from byte 0")
            with contextlib.suppress(Exception):
                await current.task
        if self.config.checkpoint_path:  # a fresh upload never resumes an earlier one
            await asyncio.to_thread(checkpoint.remove, self.config.checkpoint_path)
        return self._start(mode, UploadBody(length=length, idle_timeout=self.config.idle_timeout))

    async def resume(self, mode: Mode, at: int, length: int | None) -> Upload:
        """The upload a PATCH at ``at`` continues: the one in flight, or after a restart of
        the pod one rebuilt from the durable checkpoint (raw images only)."""
        if self.outcome is not None:
            raise AlreadyDone()
        current = self.current
        if current is not None and not current.task.done():
            return current
        found = await asyncio.to_thread(self.saved)
        if found is not None and found.offset and at == found.offset:
            body = UploadBody(length=found.size, idle_timeout=self.config.idle_timeout, start=at)
            return self._start(mode, body)
        if at:
            raise OffsetMismatch(f"Upload-Offset {at} does not match 0")
        return await self.begin(mode, length)

    def saved(self) -> Checkpoint | None:
        """The checkpoint an earlier process of this pod left (raw uploads, after a restart)."""
        path = self.config.checkpoint_path
        return checkpoint.load(path) if path and self.current is None else None

    def _start(self, mode: Mode, body: UploadBody) -> Upload:
        upload = Upload(self.config, mode, body)
        self.current = upload
        upload.task.add_done_callback(lambda _: self._finished(upload))
        return upload

    def _finished(self, upload: Upload) -> None:
        if upload.task.cancelled():  # the process is shutting down
            return
        message = upload.task.result()
        if message.succeeded or upload.answered_early:
            self.outcome = message
            self.ended.set()
        elif self.current is upload:
            log.warning(
                "upload failed (%s): %s; ready for a retry", message.reason, message.message
            )
            self.current = None

    def end(self, message: TerminationMessage) -> None:
        """End the pod without an upload (the deadline passed)."""
        self.outcome = message
        self.ended.set()
