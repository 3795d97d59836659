"""The DataImportCron poller for HTTP sources and release streams: say which image is there now,
without importing it.

It runs where every import runs, in a worker pod (the importer in poll mode, rendered by the
controller from the cron's template): the URL is tenant input, so the poll goes through the
same HTTP client as an import, with its ``Dialer`` and the import network policy
(``cdi.api.netpolicy``: no metadata, link-local, cluster or unlisted private addresses, checked
on every connection and redirect), its trust, proxies and credentials. The control plane never
fetches a tenant's URL itself.

What is reported (the termination message's ``source_digest`` and ``source_release``):

- an HTTP image: its identity from the validators (``ETag``/``Last-Modified``/length, by HEAD or
  a one-byte ranged GET) or from its entry in a checksum file beside it (``cdi.api.httpchange``);
- a release stream: the followed artifact's release, location and digest
  (``cdi.api.releasestream``), read from the stream document (at most 4 MiB).

Typed refusals (``NoValidator``, ``ChecksumFileInvalid``, ``InvalidStreamDocument``,
``StreamArtifactMissing``) end the poll like any import failure; the controller shows the
reason on the cron and imports nothing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from cdi.api.constants import ImporterEnv
from cdi.api.errors import InvalidConfig
from cdi.api.httpchange import (
    MAX_CHECKSUM_FILE_BYTES,
    checksum_identity,
    checksum_url,
    find_checksum,
    image_file_name,
)
from cdi.api.redact import redact_url
from cdi.api.releasestream import MAX_DOCUMENT_BYTES, Artifact, parse_stream, valid_architecture
from cdi.api.termination import REASON_COMPLETED, TerminationMessage
from importer.sources.http import HttpOptions, HttpSource

POLL_ENV = ImporterEnv.POLL  # "http" or "stream" in a DataImportCron poller pod
CHECKSUM_FILE_ENV = ImporterEnv.POLL_CHECKSUM_FILE
STREAM_ARCHITECTURE_ENV = ImporterEnv.POLL_STREAM_ARCHITECTURE
STREAM_ARTIFACT_ENV = ImporterEnv.POLL_STREAM_ARTIFACT


@dataclass(frozen=True)
class HttpPoll:
    """Poll an HTTP image: by its validators, or by its checksum file when one is named."""

    checksum_url: str | None = None


@dataclass(frozen=True)
class StreamPoll:
    """Poll a release stream document for one architecture's artifact."""

    architecture: str
    artifact: Artifact


PollPlan = HttpPoll | StreamPoll


def poll_plan(env: Mapping[str, str], url: str) -> PollPlan | None:
    """The poll the pod's environment asks for (None: an import)."""
    get = env.get
    kind = get(POLL_ENV, "")
    if not kind:
        return None
    if kind == "http":
        name = get(CHECKSUM_FILE_ENV, "")
        if not name:
            return HttpPoll()
        try:
            return HttpPoll(checksum_url(url, name))
        except ValueError as exc:
            raise InvalidConfig(f"{CHECKSUM_FILE_ENV}: {exc}") from exc
    if kind == "stream":
        architecture = get(STREAM_ARCHITECTURE_ENV, "")
        if not valid_architecture(architecture):
            raise InvalidConfig(f"{STREAM_ARCHITECTURE_ENV}: {architecture!r} is no architecture")
        try:
            return StreamPoll(architecture, Artifact.parse(get(STREAM_ARTIFACT_ENV, "")))
        except ValueError as exc:
            raise InvalidConfig(f"{STREAM_ARTIFACT_ENV}: {exc}") from exc
    raise InvalidConfig(f"{POLL_ENV}={kind!r}: neither http nor stream")


async def poll(options: HttpOptions, plan: PollPlan) -> TerminationMessage:
    """Run one poll and report what it found; no volume is touched."""
    started = time.monotonic()
    if isinstance(plan, StreamPoll):
        data = await _document(options, MAX_DOCUMENT_BYTES)
        found = parse_stream(data, plan.architecture, plan.artifact)
        digest, release, message = found.digest, found.record(), f"Release {found.release}"
    elif plan.checksum_url is not None:
        data = await _document(replace(options, url=plan.checksum_url), MAX_CHECKSUM_FILE_BYTES)
        name = image_file_name(options.url)
        checksum = find_checksum(data, name, redact_url(plan.checksum_url))
        digest, release = checksum_identity(checksum), {"checksum": str(checksum)}
        message = f"Checksum of {name} read"
    else:
        source = HttpSource(options)
        try:
            validators = await source.validators()
        finally:
            await source.close()
        digest = validators.identity(redact_url(options.url))
        release, message = {"validator": validators.describe()}, "Validators read"
    return TerminationMessage(
        reason=REASON_COMPLETED,
        message=message,
        duration_seconds=round(time.monotonic() - started, 3),
        source_digest=digest,
        source_release=release,
    )


async def _document(options: HttpOptions, limit: int) -> bytes:
    source = HttpSource(options)
    try:
        return await source.fetch_document(limit)
    finally:
        await source.close()
