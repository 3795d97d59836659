"""The DataImportCron poller of HTTP images and release streams (``importer.poll``) against real
loopback servers: it learns the image's identity without its body (HEAD, or a one-byte ranged
GET where HEAD is refused), reads checksum files and stream documents, refuses what names no
version, and goes through the import network policy like any import."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from cdi.api.errors import NoValidator, SourceForbidden, StreamArtifactMissing
from cdi.api.netpolicy import NetPolicy
from cdi.api.releasestream import Artifact
from cdi.api.termination import TerminationMessage
from importer.config import from_env
from importer.failure import guarded
from importer.poll import HttpPoll, StreamPoll, poll
from importer.runner import run_import
from importer.sources.http import HttpOptions
from tests.component.conftest import Handler
from tests.component.helpers import LOOPBACK_ALLOWED

Serve = Callable[[str, Handler], Awaitable[str]]
BODY = b"not really a disk image, but 64 bytes of it ............\n" + b"x" * 7


class Site:
    """One image with switchable validators; records every request and the body bytes sent."""

    def __init__(self) -> None:
        self.etag: str | None = '"v1"'
        self.head_allowed = True
        self.requests: list[tuple[str, str, str]] = []  # method, path, Range
        self.body_bytes = 0
        self.files: dict[str, bytes] = {}

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append((request.method, request.path, request.headers.get("Range", "")))
        if request.path in self.files:
            return web.Response(body=self.files[request.path])
        if request.method == "HEAD" and not self.head_allowed:
            raise web.HTTPMethodNotAllowed("HEAD", ["GET"])
        headers = {"ETag": self.etag} if self.etag else {}
        if request.headers.get("Range") == "bytes=0-0":
            self.body_bytes += 1
            headers["Content-Range"] = f"bytes 0-0/{len(BODY)}"
            return web.Response(status=206, body=BODY[:1], headers=headers)
        if request.method == "GET":
            self.body_bytes += len(BODY)
        return web.Response(body=BODY, headers=headers)


async def _poll(
    url: str, plan: HttpPoll | StreamPoll, policy: NetPolicy = LOOPBACK_ALLOWED
) -> TerminationMessage:
    return await poll(HttpOptions(url=url, policy=policy), plan)


async def test_the_etag_names_the_image_and_no_body_is_read(serve: Serve) -> None:
    site = Site()
    url = await serve("127.0.0.1", site.handle) + "/images/disk.qcow2"
    first = await _poll(url, HttpPoll())
    again = await _poll(url, HttpPoll())
    assert first.succeeded and first.source_digest == again.source_digest
    assert first.source_release == {"validator": 'ETag "v1"'}
    site.etag = '"v2"'
    changed = await _poll(url, HttpPoll())
    assert changed.source_digest != first.source_digest
    assert {m for m, _, _ in site.requests} == {"HEAD"} and site.body_bytes == 0


async def test_where_head_is_refused_a_one_byte_range_is_asked(serve: Serve) -> None:
    site = Site()
    site.head_allowed = False
    url = await serve("127.0.0.1", site.handle) + "/disk.qcow2"
    found = await _poll(url, HttpPoll())
    assert found.succeeded, found
    assert ("GET", "/disk.qcow2", "bytes=0-0") in site.requests
    assert site.body_bytes == 1
    site.head_allowed = True
    assert (await _poll(url, HttpPoll())).source_digest == found.source_digest, (
        "HEAD and the ranged GET give one identity (the whole length from Content-Range)"
    )


async def test_a_server_without_validators_is_no_validator(serve: Serve) -> None:
    site = Site()
    site.etag = None
    url = await serve("127.0.0.1", site.handle) + "/disk.qcow2"
    with pytest.raises(NoValidator, match="checksumFile"):
        await _poll(url, HttpPoll())


async def test_the_checksum_file_beside_the_image_gives_its_identity(serve: Serve) -> None:
    site = Site()
    site.etag = None
    origin = await serve("127.0.0.1", site.handle)
    digest = hashlib.sha256(BODY).hexdigest()
    site.files["/pub/SHA256SUMS"] = f"{digest}  disk.qcow2\n{'0' * 64}  other.iso\n".encode()
    found = await _poll(f"{origin}/pub/disk.qcow2", HttpPoll(f"{origin}/pub/SHA256SUMS"))
    assert found.source_digest == f"sha256:{digest}"
    assert found.source_release == {"checksum": f"sha256:{digest}"}
    assert [p for _, p, _ in site.requests] == ["/pub/SHA256SUMS"], "the image is not touched"


async def test_the_stream_document_gives_the_artifacts_release(serve: Serve) -> None:
    site = Site()
    origin = await serve("127.0.0.1", site.handle)
    ref = "127.0.0.1:5000/fcos/kubevirt@sha256:" + "ab" * 32
    images = {"kubevirt": {"release": "41.1", "image": "x:stable", "digest-ref": ref}}
    site.files["/streams/stable.json"] = json.dumps(
        {"stream": "stable", "architectures": {"x86_64": {"images": images}}}
    ).encode()
    found = await _poll(f"{origin}/streams/stable.json", StreamPoll("x86_64", Artifact()))
    assert found.source_digest == "sha256:" + "ab" * 32
    assert found.source_release["release"] == "41.1"
    assert found.source_release["location"] == f"docker://{ref}"
    with pytest.raises(StreamArtifactMissing):
        await _poll(f"{origin}/streams/stable.json", StreamPoll("aarch64", Artifact()))


async def test_the_poll_obeys_the_import_policy(serve: Serve) -> None:
    site = Site()
    url = await serve("127.0.0.1", site.handle) + "/disk.qcow2"
    with pytest.raises(SourceForbidden, match="import policy"):
        await _poll(url, HttpPoll(), NetPolicy())  # the default: loopback refused
    assert site.requests == [], "a refused destination is never contacted"

    async def to_metadata(request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("http://169.254.169.254/latest/meta-data/")

    bounce = await serve("127.0.0.1", to_metadata)
    with pytest.raises(SourceForbidden):
        await _poll(f"{bounce}/streams/stable.json", StreamPoll("x86_64", Artifact()))


async def test_the_pod_environment_runs_a_stream_poll_end_to_end(
    serve: Serve, tmp_path: Path
) -> None:
    site = Site()
    origin = await serve("127.0.0.1", site.handle)
    site.files["/streams/next.json"] = b"<html>not json</html>"
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": f"{origin}/streams/next.json",
        "IMPORTER_POLL": "stream",
        "IMPORTER_POLL_STREAM_ARCHITECTURE": "x86_64",
        "IMPORTER_POLL_STREAM_ARTIFACT": "qemu/qcow2.xz",
        "IMPORTER_ALLOWED_SOURCE_CIDRS": "127.0.0.1/32",
        "IMPORTER_DATA_DIR": str(tmp_path / "data"),
        "IMPORTER_SCRATCH_DIR": str(tmp_path / "scratch"),
        "IMPORTER_TERMINATION_PATH": str(tmp_path / "termination"),
    }
    path = env["IMPORTER_TERMINATION_PATH"]
    message = await guarded(lambda: run_import(from_env(env)), path, logging.getLogger("test"))
    assert message.reason == "InvalidStreamDocument", message
    written = TerminationMessage.from_json((tmp_path / "termination").read_text())
    assert written.reason == "InvalidStreamDocument"
    assert not (tmp_path / "data").exists(), "a poll writes no volume"
