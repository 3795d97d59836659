"""The typed termination message a worker leaves for the controller.

Written in exactly one place (``TerminationMessage.write``) to the path the pod spec names as
``terminationMessagePath``; the controller reads it back with ``from_json``. Kubernetes keeps at
most 4096 bytes of it, so ``to_json`` trims the free-text message to stay under that bound.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

MAX_BYTES = 4096

REASON_COMPLETED = "Completed"
# ``Verification.result``: the read-back matched, or the run wrote the target in a way the
# digest does not cover (qemu-img, an archive's files, a blank disk), said in the message. A
# mismatch is no result here: the run fails with ``VerificationFailed`` (cdi.api.errors).
VERIFIED = "Verified"
VERIFICATION_NOT_SUPPORTED = "VerificationNotSupported"


@dataclass(frozen=True)
class Verification:
    """What reading the target back found (``datapath.verify``), when the run was asked to."""

    result: str  # VERIFIED or VERIFICATION_NOT_SUPPORTED
    message: str
    digest: str | None = None  # "<algorithm>:<hex>" of the blocks written and read back
    blocks: int = 0  # non-zero blocks compared
    bytes_read: int = 0  # read back from the device


@dataclass(frozen=True)
class TerminationMessage:
    reason: str  # "Completed" on success, else an error reason (cdi.api.errors)
    message: str
    transient: bool = False
    bytes_read: int = 0
    bytes_written: int = 0
    virtual_size: int = 0
    format_chain: tuple[str, ...] = ()
    checksum: str | None = None  # "<algo>:<hex>" of the source bytes, when computed
    duration_seconds: float = 0.0
    scratch_used: bool = False
    scratch_bytes: int = 0  # bytes staged on scratch space (qemu-img input, out-of-order data)
    # CDI's ``scratchSpaceRequired``: the source needs staging and this pod had no scratch
    # space (reason ``Scratch space required``); the controller's next pod gets a scratch claim.
    scratch_space_required: bool = False
    resumed_from: int = 0  # source offset an interrupted import continued from (0: fresh)
    preallocation_applied: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    source_digest: str | None = None  # registry: the manifest digest a tag resolved to
    # A DataImportCron poll of an HTTP source or a release stream: what was found (the
    # stream's release record, ``cdi.api.releasestream``; the checksum or validators polled).
    source_release: dict[str, str] = field(default_factory=dict)
    verification: Verification | None = None  # asked for (storage.verify): what read-back found

    @property
    def succeeded(self) -> bool:
        return self.reason == REASON_COMPLETED

    def to_json(self) -> str:
        data: dict[str, Any] = asdict(self)
        data["format_chain"] = list(self.format_chain)
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        overflow = len(text.encode()) - MAX_BYTES
        if overflow > 0:
            data["message"] = self.message[: max(0, len(self.message) - overflow - 3)] + "..."
            text = json.dumps(data, separators=(",", ":"), sort_keys=True)
        return text

    @classmethod
    def from_json(cls, text: str) -> TerminationMessage:
        data = json.loads(text)
        data["format_chain"] = tuple(data.get("format_chain", ()))
        check = data.get("verification")
        if isinstance(check, dict):
            names = set(Verification.__dataclass_fields__)
            data["verification"] = Verification(**{k: v for k, v in check.items() if k in names})
        elif check is not None:
            data["verification"] = None
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def write(self, path: str) -> None:
        """Write atomically where we can, so a reader never sees half a message. In a pod the
        path is a file the kubelet bind-mounts: renaming onto a mount point fails (EBUSY), and
        the directory may be read-only. There we write in place, which is safe because the
        kubelet reads the message only after the container has exited."""
        text = self.to_json()
        tmp = f"{path}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
            os.replace(tmp, path)
            return
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
