"""Registry source: a containerDisk's ``disk/`` file streamed from its layers, no scratch.

``probe`` resolves the reference once (a tag becomes the digest of the manifest served, which is
what the import reports and what a checkpoint would be keyed by), narrows an index to the wanted
platform, reads the config for the image's labels, and keeps the layer list. ``stream`` then
runs the layer walk (``importer.registry.layers``: decompression, tar, whiteouts, digest checks)
on a worker thread, because all of it is CPU work; the layer blobs themselves are streamed by
``HttpSource`` (retries, ``Range`` resume, origin-only credentials, the import network policy),
whose async chunks the walk pulls across the thread boundary one at a time.

Replayable: the same digests give the same bytes, so the processor may read the disk again for a
layout its decoders cannot stream. Not ranged: the disk's offsets are not the blobs' offsets.
"""

from __future__ import annotations

import asyncio
import contextlib
import platform
from collections.abc import AsyncGenerator, AsyncIterator, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, cast

from cdi.api.errors import InvalidConfig
from datapath.sources import SourceInfo
from importer.registry.client import RegistryClient
from importer.registry.layers import disk_bytes
from importer.registry.manifest import (
    INDEXES,
    Descriptor,
    Manifest,
    choose_platform,
    config_labels,
    media_type,
    parse_json,
    parse_manifest,
)
from importer.registry.reference import Reference, parse_reference
from importer.sources.http import HttpSource
from importer.sources.registry_options import RegistryOptions


def _pull(awaitable: Any, loop: asyncio.AbstractEventLoop) -> Any:
    """Run ``awaitable`` on ``loop`` from a worker thread and wait for it; from the loop's own
    thread only schedule it."""
    future = asyncio.run_coroutine_threadsafe(awaitable, loop)
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    return None if running is loop else future.result()


_MACHINES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def host_architecture() -> str:
    """This node's architecture in OCI's words (the default platform, as CDI's)."""
    machine = platform.machine().lower()
    return _MACHINES.get(machine, machine)


@dataclass(frozen=True)
class Resolved:
    """What ``probe`` learnt: the pinned image and how to read it."""

    reference: Reference  # pinned to the manifest's digest
    manifest: Manifest
    labels: dict[str, str]


class RegistrySource:
    def __init__(self, options: RegistryOptions) -> None:
        self.options = options
        self.ref = parse_reference(options.url)
        self.client = RegistryClient(
            self.ref,
            options.http,
            username=options.username,
            password=options.password,
            plain_http_fallback=options.insecure_registry,
        )
        self.resolved: Resolved | None = None
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="registry")

    @property
    def labels(self) -> dict[str, str]:
        """Labels from the image's ``KUBEVIRT_IO_`` variables (after ``probe``)."""
        return dict(self.resolved.labels) if self.resolved else {}

    @property
    def digest(self) -> str | None:
        """The manifest digest imported (after ``probe``): the tag resolved once."""
        return self.resolved.reference.digest if self.resolved else None

    async def probe(self) -> SourceInfo:
        loop = asyncio.get_running_loop()
        self.resolved = await loop.run_in_executor(self._pool, self._resolve)
        return SourceInfo(size=None, ranges=False, validator=self.digest, replayable=True)

    def _resolve(self) -> Resolved:
        found, digest = self.client.manifest(self.ref.reference)
        data = parse_json(found.body, "manifest")
        if media_type(data, found.content_type) in INDEXES:
            arch = self.options.architecture or host_architecture()
            entry = choose_platform(data, arch)
            found, digest = self.client.manifest(entry.digest)
            data = parse_json(found.body, "manifest")
            if media_type(data, found.content_type) in INDEXES:
                raise InvalidConfig("an image index points at another index")
        manifest = parse_manifest(data)
        blob = self.client.blob(manifest.config.digest, manifest.config.size)
        config = parse_json(blob, "config")
        pinned = self.ref.pinned(self.ref.digest or digest)
        return Resolved(pinned, manifest, config_labels(config))

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        if start:
            raise InvalidConfig("a registry image cannot be read from an offset")
        if self.resolved is None:
            await self.probe()
        assert self.resolved is not None
        loop = asyncio.get_running_loop()
        walk = disk_bytes(self.resolved.manifest.layers, lambda blob: self._blob(blob, loop))
        try:
            while (chunk := await loop.run_in_executor(self._pool, next, walk, None)) is not None:
                yield chunk
        finally:
            await loop.run_in_executor(self._pool, walk.close)

    def _blob(
        self, blob: Descriptor, loop: asyncio.AbstractEventLoop
    ) -> Generator[bytes, None, None]:
        """A layer blob's bytes for the walk's thread, pulled from ``HttpSource`` on the loop.
        The walk closes it on its own thread; should it ever be finalized on the loop's thread
        instead, the clean-up is scheduled there rather than waited for (which would deadlock)."""
        source = HttpSource(self.client.blob_options(blob.digest))
        chunks = cast(AsyncGenerator[bytes, None], source.stream())
        try:
            while (chunk := _pull(anext(chunks, None), loop)) is not None:
                yield chunk
        finally:
            with contextlib.suppress(Exception):
                _pull(chunks.aclose(), loop)
            _pull(source.close(), loop)

    async def close(self) -> None:
        self.client.close()
        self._pool.shutdown(wait=False, cancel_futures=True)
