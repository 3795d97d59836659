"""A release stream document (the CoreOS stream metadata format, ``streams/<stream>.json``) and
the one artifact a DataImportCron follows in it.

Pure and shared: the webhook checks a cron's ``architecture`` and ``artifact`` with the same
rules the poller applies, and the poller (the importer in poll mode, in the cron's worker pod:
the document is tenant-named input fetched under the import network policy) turns the document
into a ``StreamRelease`` that it reports and the controller imports. The format, as Fedora
CoreOS publishes it (``https://builds.coreos.fedoraproject.org/streams/stable.json``)::

    {"stream": "stable", "metadata": {"last-modified": "..."},
     "architectures": {"x86_64": {
        "artifacts": {"qemu": {"release": "40.20240416.3.1",
                      "formats": {"qcow2.xz": {"disk": {"location": "https://...qcow2.xz",
                                                        "sha256": "<64 hex>",
                                                        "uncompressed-sha256": "<64 hex>"}}}}},
        "images": {"kubevirt": {
            "release": "40.20240416.3.1",
            "image": "quay.io/fedora/fedora-coreos-kubevirt:stable",
            "digest-ref": "quay.io/fedora/fedora-coreos-kubevirt@sha256:..."}}}}}

Two kinds of artifact: ``kubevirt`` (``images.kubevirt``: the containerDisk, imported by its
digest reference, never by the moving tag) and ``<platform>/<format>`` (``artifacts.<platform>
.formats.<format>.disk``: a file over HTTP, imported with the stream's own ``sha256`` checked).
The artifact's identity is its digest (the image manifest's or the file's sha256), so a new
release with new bytes is a new import and the same bytes are never imported twice. Anything
missing or malformed is refused with a typed error before any import: a document that does not
parse (``InvalidStreamDocument``) or lacks the artifact (``StreamArtifactMissing``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from cdi.api.errors import InvalidStreamDocument, StreamArtifactMissing

KUBEVIRT = "kubevirt"
KIND_REGISTRY = "registry"
KIND_HTTP = "http"
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024  # Fedora's stable.json is ~50 KB
# The record travels in a termination message (4096 bytes) and an annotation: bounded fields.
MAX_LOCATION = 2048
MAX_RELEASE = 128
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
_ARCH = re.compile(r"[a-z0-9][a-z0-9_]{0,31}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DIGEST_REF = re.compile(r"[^\s@/][^\s@]*/[^\s@]+@sha256:[0-9a-f]{64}")


@dataclass(frozen=True)
class Artifact:
    """What a cron follows: ``kubevirt`` or ``<platform>/<format>`` (``qemu/qcow2.xz``)."""

    platform: str = ""  # empty: images.kubevirt
    format: str = ""

    @classmethod
    def parse(cls, text: str) -> Artifact:
        if text == KUBEVIRT:
            return cls()
        platform, sep, fmt = text.partition("/")
        if not sep or not _NAME.fullmatch(platform) or not _NAME.fullmatch(fmt):
            raise ValueError(
                f"artifact {text!r} is neither {KUBEVIRT!r} nor '<platform>/<format>' "
                "(e.g. qemu/qcow2.xz)"
            )
        return cls(platform, fmt)

    @property
    def kind(self) -> str:
        return KIND_HTTP if self.platform else KIND_REGISTRY

    def __str__(self) -> str:
        return f"{self.platform}/{self.format}" if self.platform else KUBEVIRT


def valid_architecture(text: str) -> bool:
    return bool(_ARCH.fullmatch(text))


@dataclass(frozen=True)
class StreamRelease:
    """One artifact of one release: what to import and how to check it."""

    stream: str
    release: str
    artifact: str  # as the cron names it
    location: str  # registry: docker://<repo>@sha256:...; http: the file's URL
    digest: str  # "sha256:<hex>": the image manifest's digest, or the file's sha256

    @property
    def kind(self) -> str:
        return Artifact.parse(self.artifact).kind

    def record(self) -> dict[str, str]:
        """A flat map for the termination message and the cron's annotation."""
        return {
            "stream": self.stream,
            "release": self.release,
            "artifact": self.artifact,
            "location": self.location,
            "digest": self.digest,
        }

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> StreamRelease:
        """Back from ``record()``, checked again (the record passes through an annotation of
        the tenant's cron, so it is input like the document itself)."""
        try:
            artifact = Artifact.parse(str(record.get("artifact") or ""))
            release = cls(
                stream=str(record.get("stream") or ""),
                release=str(record["release"]),
                artifact=str(artifact),
                location=str(record["location"]),
                digest=str(record["digest"]),
            )
        except (KeyError, ValueError) as exc:
            raise InvalidStreamDocument(f"not a stream release record: {exc}") from exc
        _check_release(release)
        return release


def _check_release(release: StreamRelease) -> None:
    if release.kind == KIND_REGISTRY:
        ref = release.location.removeprefix("docker://")
        if not release.location.startswith("docker://") or not _DIGEST_REF.fullmatch(ref):
            raise InvalidStreamDocument("images.kubevirt: digest-ref is not <repo>@sha256:<hex>")
    hexpart = release.digest.removeprefix("sha256:")
    if not release.digest.startswith("sha256:") or not _SHA256.fullmatch(hexpart):
        raise InvalidStreamDocument(f"{release.artifact}: digest is not sha256:<64 hex>")
    if not release.release or len(release.release) > MAX_RELEASE:
        raise InvalidStreamDocument(f"{release.artifact}: no release version of a sane length")
    if len(release.location) > MAX_LOCATION or len(release.stream) > MAX_RELEASE:
        raise InvalidStreamDocument(f"{release.artifact}: location or stream name too long")
    if release.kind == KIND_REGISTRY:
        if not release.location.endswith("@" + release.digest):
            raise InvalidStreamDocument("images.kubevirt: digest-ref names another digest")
    else:
        parts = urlsplit(release.location)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise InvalidStreamDocument(f"{release.artifact}: location is not an http(s) URL")


def _member(node: Any, key: str, where: str) -> Any:
    """``node[key]`` of a JSON object, or the typed refusal naming what is missing."""
    if not isinstance(node, dict):
        raise InvalidStreamDocument(f"{where} is not an object")
    value = node.get(key)
    if value is None:
        raise StreamArtifactMissing(f"the stream has no {where}.{key}")
    return value


def _text(node: Any, key: str, where: str) -> str:
    value = _member(node, key, where)
    if not isinstance(value, str):
        raise InvalidStreamDocument(f"{where}.{key} is not a string")
    return value


def parse_stream(data: bytes, architecture: str, artifact: Artifact) -> StreamRelease:
    """The release of ``artifact`` for ``architecture`` in a stream document."""
    if len(data) > MAX_DOCUMENT_BYTES:
        raise InvalidStreamDocument(f"the stream document is over {MAX_DOCUMENT_BYTES} bytes")
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidStreamDocument(f"the stream document is not JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("architectures"), dict):
        raise InvalidStreamDocument("the document has no 'architectures' object: not a stream")
    stream = doc.get("stream")
    stream = stream if isinstance(stream, str) else ""
    arch = _member(doc["architectures"], architecture, "architectures")
    where = f"architectures.{architecture}"
    if artifact.kind == KIND_REGISTRY:
        images = _member(arch, "images", where)
        image = _member(images, KUBEVIRT, f"{where}.images")
        here = f"{where}.images.kubevirt"
        ref = _text(image, "digest-ref", here)
        digest = "sha256:" + ref.rpartition("@sha256:")[2] if "@sha256:" in ref else ""
        found = StreamRelease(
            stream, _text(image, "release", here), str(artifact), f"docker://{ref}", digest
        )
    else:
        platform = _member(
            _member(arch, "artifacts", where), artifact.platform, f"{where}.artifacts"
        )
        here = f"{where}.artifacts.{artifact.platform}"
        fmt = _member(_member(platform, "formats", here), artifact.format, f"{here}.formats")
        disk = _member(fmt, "disk", f"{here}.formats.{artifact.format}")
        there = f"{here}.formats.{artifact.format}.disk"
        found = StreamRelease(
            stream,
            _text(platform, "release", here),
            str(artifact),
            _text(disk, "location", there),
            "sha256:" + _text(disk, "sha256", there).lower(),
        )
    _check_release(found)
    return found
