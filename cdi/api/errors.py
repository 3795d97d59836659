"""Typed errors shared by the workers and the control plane.

Every failure the data plane can report carries a machine-readable ``reason`` (it becomes the
DataVolume condition reason verbatim) and says whether retrying can help. Callers branch on
the type or on ``transient``, never on message text (CONVENTIONS.md, httpx's exception tree).
"""

from __future__ import annotations


class WorkerError(Exception):
    """Base of every data-plane failure. ``reason`` is a CamelCase word, ``transient`` says
    whether the controller should retry the pod."""

    reason = "ImportFailed"
    transient = False

    def __init__(self, message: str, *, transient: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if transient is not None:  # an instance may know better than its class
            self.transient = transient


class SourceUnavailable(WorkerError):
    """The source could not be reached or answered with an error (retry may help)."""

    reason = "SourceUnavailable"
    transient = True


class SourceNotFound(WorkerError):
    """The source answered 404/410: the image is not there."""

    reason = "SourceNotFound"
    transient = False


class SourceForbidden(WorkerError):
    """The source refused our credentials (401/403 on GET), or the import network policy
    refused the destination (``cdi.api.netpolicy``; the same whatever listens there)."""

    reason = "SourceForbidden"
    transient = False


class ProxyAuthenticationFailed(WorkerError):
    """The import proxy answered 407: it refused the proxy credentials (CDIConfig
    ``importProxy``'s userinfo, or the relay's ticket). Asking again with the same ones cannot
    help; the message names the proxy (without its userinfo) and the 407, never a credential."""

    reason = "ProxyAuthenticationFailed"
    transient = False


class ChecksumMismatch(WorkerError):
    reason = "ChecksumMismatch"


class UnsupportedFormat(WorkerError):
    reason = "UnsupportedFormat"


class UnsafeImage(WorkerError):
    """Backing file, external data file, encryption, hostile tables or archive escapes."""

    reason = "UnsafeImage"


class InvalidImage(WorkerError):
    """The bytes are not a well-formed image of the detected format (truncated, corrupt)."""

    reason = "InvalidImage"


class InsufficientSpace(WorkerError):
    """The image does not fit the target volume."""

    reason = "InsufficientSpace"


class ScratchSpaceRequired(WorkerError):
    """The source must be staged (vhd/vhdx for qemu-img, an image too disordered to stream)
    and the worker has no writable scratch space: a block target has no folder of its own
    and the root filesystem is read-only. Not the import's failure: the controller records
    CDI's ``requiresScratch`` and gives the next pod a ``<pvc>-scratch`` claim (CDI's
    ``ErrRequiresScratchSpace`` and ``scratchSpaceRequired``). A pod that had scratch space
    and still says so fails with this reason (never an endless loop)."""

    reason = "Scratch space required"  # CDI's Running condition reason, verbatim
    transient = False


class InvalidConfig(WorkerError):
    """The worker was started with configuration it cannot act on."""

    reason = "InvalidConfig"


class TargetError(WorkerError):
    """Writing the target failed for a reason other than space (I/O error, missing device)."""

    reason = "TargetError"
    transient = True


class NoValidator(WorkerError):
    """A DataImportCron poll of an HTTP source: the server names no version of the image (no
    ``ETag``, no ``Last-Modified``), so a change cannot be told without downloading it."""

    reason = "NoValidator"


class ChecksumFileInvalid(WorkerError):
    """A DataImportCron poll: the checksum file beside the image does not list the image."""

    reason = "ChecksumFileInvalid"


class InvalidStreamDocument(WorkerError):
    """A DataImportCron poll: the release stream document does not parse as one."""

    reason = "InvalidStreamDocument"


class StreamArtifactMissing(WorkerError):
    """A DataImportCron poll: the stream document has no such architecture or artifact."""

    reason = "StreamArtifactMissing"


class VerificationFailed(WorkerError):
    """The target, read back from the device after the run, does not hold what the run wrote
    (``datapath.verify``: the digest of the written blocks differs from the read-back's).
    Never retried: the volume cannot be trusted, and an attempt that overwrote it would hide
    the fault."""

    reason = "VerificationFailed"


class InternalError(WorkerError):
    """A bug: something failed that no typed error describes. The message is fixed and
    generic (an exception's text may hold a URL's credentials); the details go to the log."""

    reason = "InternalError"


ALL_ERRORS: tuple[type[WorkerError], ...] = (
    WorkerError,
    SourceUnavailable,
    SourceNotFound,
    SourceForbidden,
    ProxyAuthenticationFailed,
    ChecksumMismatch,
    UnsupportedFormat,
    UnsafeImage,
    InvalidImage,
    InsufficientSpace,
    ScratchSpaceRequired,
    InvalidConfig,
    TargetError,
    NoValidator,
    ChecksumFileInvalid,
    InvalidStreamDocument,
    StreamArtifactMissing,
    VerificationFailed,
    InternalError,
)
