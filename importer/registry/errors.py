"""Typed failures of a registry pull, each with the reason the DataVolume condition shows.

CDI reports anything that stops it from getting the image (unknown repository or tag, refused
credentials, a registry that says no) as ``ImagePullFailed`` with a message starting "failed to
pull image"; we keep that reason and prefix so users' alerts and runbooks keep working. A blob or
manifest whose bytes do not hash to their digest is ``DigestMismatch``: the registry (or
something between) served other bytes than the image names, and retrying will not help.
"""

from __future__ import annotations

from cdi.api.errors import InvalidImage, UnsupportedFormat, WorkerError

PULL_FAILED_PREFIX = "failed to pull image: "


class ImagePullFailed(WorkerError):
    """The registry would not give us the image: unknown image or tag, authentication refused.
    Transient: CDI keeps retrying (an image may be pushed, a Secret fixed, later)."""

    reason = "ImagePullFailed"
    transient = True

    def __init__(self, detail: str, *, transient: bool | None = None) -> None:
        super().__init__(PULL_FAILED_PREFIX + detail, transient=transient)


class DigestMismatch(WorkerError):
    """Bytes served for a digest do not hash to it (or are not its declared size)."""

    reason = "DigestMismatch"
    transient = False


class NoMatchingPlatform(WorkerError):
    """An image index has no manifest for the wanted platform (CDI's message, verbatim tail)."""

    reason = "Error"
    transient = False


class UnsupportedManifest(UnsupportedFormat):
    """A manifest type we do not read (schema 1, an artifact, an unknown media type)."""


class RegistryImageInvalid(InvalidImage):
    """The image's filesystem is not a containerDisk: no disk, several, a directory."""
