"""Runs one import from a config: builds the source and the plan's processor, serves metrics,
writes the result.

Shared by the pod entry point (``python -m importer``) and the ``cdi import`` command, so both
take exactly the same path through the data path's phase machine. This is the importer's edge:
the only place that turns source options into a ``Source`` (a table by options type).
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol, cast

from cdi.api.termination import REASON_COMPLETED, TerminationMessage
from datapath import FileSource, Processor, Progress, Source
from datapath.sources.throttle import Throttled
from importer.config import BlankOptions, FileOptions, ImportConfig, SourceOptions
from importer.poll import poll
from importer.sources.gcs import GcsOptions, GcsSource
from importer.sources.http import HttpOptions, HttpSource
from importer.sources.registry_options import NodePullOptions, RegistryOptions
from importer.sources.s3 import S3Options, S3Source

if TYPE_CHECKING:
    from importer.sources.containerdisk import NodePullSource
    from importer.sources.registry import RegistrySource

_M_ARENA_MAX = -8  # glibc mallopt parameter


def tune_process_memory() -> None:
    """One malloc arena for the whole process; call first thing in an importer process.

    Chunks are 4 MiB bytes objects made on the HTTP threads and freed on the decode and
    writer threads; with glibc's default of one arena per thread each arena keeps its own
    high-water mark of freed chunks. Measured on a 632 MB qcow2 import: peak RSS 120-130 MB
    with per-thread arenas, 100 MB with one, at the same speed (the threads allocate a few
    large blocks, not many small ones, so the shared arena's lock is not contended).
    Without glibc (musl) this does nothing.
    """
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)  # libc's, if this libc has it
    if mallopt is not None:
        mallopt(ctypes.c_int(_M_ARENA_MAX), ctypes.c_int(1))


def make_source(options: SourceOptions) -> Source | None:
    """The source the options name; None for a blank disk."""
    match options:
        case HttpOptions():
            return HttpSource(options)
        case S3Options():
            return S3Source(options)
        case GcsOptions():
            return GcsSource(options)
        case RegistryOptions():
            from importer.sources.registry import RegistrySource  # ~30 ms: only when used

            return RegistrySource(options)
        case NodePullOptions():
            from importer.sources.containerdisk import NodePullSource

            return NodePullSource(options)
        case FileOptions(path=path):
            return FileSource(path)
        case BlankOptions():
            return None


NETWORK_SOURCES = (HttpOptions, S3Options, GcsOptions, RegistryOptions)
"""The sources a bandwidth cap applies to (S3 and GCS options are HTTP options too)."""


def capped(source: Source | None, config: ImportConfig) -> Source | None:
    """The source under the config's bandwidth cap, if it reads the network and one is set."""
    if source is None or config.bandwidth_limit is None or config.poll_only:
        return source
    if not isinstance(config.source, NETWORK_SOURCES):
        return source
    return Throttled(source, config.bandwidth_limit)


async def run_import(config: ImportConfig, progress: Progress | None = None) -> TerminationMessage:
    progress = progress or Progress()
    edges = config.edges
    if config.http_poll is not None and isinstance(config.source, HttpOptions):
        message = await poll(config.source, config.http_poll)  # a poll serves no progress
        if edges.termination_path:
            message.write(edges.termination_path)
        return message
    source = make_source(config.source)
    # registry options make a RegistrySource (imported lazily, so no isinstance on it here)
    registry = (
        cast("RegistrySource", source) if isinstance(config.source, RegistryOptions) else None
    )
    if config.poll_only and source is not None:  # a poll serves no progress
        # poll_only comes only with registry or node-pull options (ImportConfig checks it)
        message = await poll_digest(cast("PolledImage", source))
        if edges.termination_path:
            message.write(edges.termination_path)
        return message
    if edges.metrics_port is not None:
        from datapath.metrics import serve_metrics  # prometheus_client: 12 ms of start-up

        serve_metrics(progress, edges.owner_uid, edges.metrics_port, edges.metrics_addr)
    message = await Processor(config.plan, capped(source, config), progress).run()
    if isinstance(config.source, NodePullOptions):  # the image's labels; the kubelet's digest
        labels = {**cast("NodePullSource", source).labels, **message.labels}
        message = replace(message, labels=labels)
    if registry is not None and registry.digest:
        # What the image said about itself, and which digest a tag resolved to: CDI copies
        # the image's KUBEVIRT_IO_ labels to the PVC; the digest makes the import reproducible.
        labels = {**registry.labels, **message.labels}
        message = replace(message, labels=labels, source_digest=registry.digest)
    if edges.termination_path:
        message.write(edges.termination_path)
    return message


class PolledImage(Protocol):
    """What a registry poll reads of its source (``RegistrySource``, ``NodePullSource``)."""

    @property
    def labels(self) -> dict[str, str]: ...

    @property
    def digest(self) -> str | None: ...

    async def probe(self) -> object: ...

    async def close(self) -> None: ...


async def poll_digest(source: PolledImage) -> TerminationMessage:
    """A registry poll. Pulled by us: resolve the image's tag to the digest it names now
    (manifest, platform, config read and verified as for an import) and report it; no layer
    is read, nothing is written. Pulled by the node (``NodePullSource``): the kubelet resolved
    the tag; check the image it runs beside us holds one disk and report its labels, no
    digest (the controller takes the kubelet's ``imageID``, never one the pod reports)."""
    started = time.monotonic()
    try:
        await source.probe()
    finally:
        await source.close()
    return TerminationMessage(
        reason=REASON_COMPLETED,
        message="Digest resolved",
        duration_seconds=round(time.monotonic() - started, 3),
        labels=source.labels,
        source_digest=source.digest,
    )
