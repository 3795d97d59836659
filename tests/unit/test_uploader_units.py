"""The upload server's pure parts: configuration from CDI's environment, the per-upload plan,
and the resumable body source (attach, cut, continue, refuse, give up)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdi.api.constants import ContentType
from cdi.api.errors import InvalidConfig
from uploader.body import Busy, OffsetMismatch, UploadAbandoned, UploadBody, UploadTooLong
from uploader.config import from_env


def test_config_reads_cdis_environment(tmp_path: Path) -> None:
    config = from_env(
        {
            "DESTINATION": str(tmp_path / "disk.img"),
            "UPLOAD_IMAGE_SIZE": "1Gi",
            "FILESYSTEM_OVERHEAD": "0.055",
            "PREALLOCATION": "true",
            "CONTENT_TYPE": "archive",
            "CLIENT_NAME": "src/a-tgt/b",
            "DEADLINE": "2030-01-02T03:04:05Z",
            "OWNER_UID": "uid-1",
        }
    )
    assert (config.size, config.filesystem_overhead, config.preallocate) == (1 << 30, 0.055, True)
    assert config.content_type is ContentType.ARCHIVE and not config.block
    assert config.tls.client_name == "src/a-tgt/b"
    assert config.tls.cert == "/etc/cdi/upload-server/tls.crt"
    assert config.deadline == dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert config.checkpoint_path == str(tmp_path / ".cdi-upload-checkpoint")
    assert (config.address, config.port) == ("0.0.0.0", 8443)


@pytest.mark.parametrize(
    "env",
    [
        {"UPLOAD_IMAGE_SIZE": "lots"},
        {"DEADLINE": "tomorrow"},
        {"CONTENT_TYPE": "blockdevice-clone"},
        {"FILESYSTEM_OVERHEAD": "abc"},
    ],
)
def test_bad_environment_is_a_typed_error(env: dict[str, str]) -> None:
    with pytest.raises(InvalidConfig):
        from_env(env)


def test_plan_for_archive_targets_the_folder_and_keeps_no_checkpoint(tmp_path: Path) -> None:
    config = from_env({"DESTINATION": str(tmp_path / "disk.img"), "UPLOAD_IMAGE_SIZE": "1Gi"})
    archive = config.plan_for(ContentType.ARCHIVE, length=10)
    assert archive.target.path == str(tmp_path) and archive.checkpoint is None
    disk = config.plan_for(ContentType.KUBEVIRT, length=10)
    assert disk.target.path == str(tmp_path / "disk.img") and disk.checkpoint is not None


async def pieces(*parts: bytes, cut: bool = False) -> AsyncIterator[bytes]:
    for part in parts:
        yield part
    if cut:
        raise ConnectionResetError("cut")


async def collect(body: UploadBody) -> bytes:
    return b"".join([chunk async for chunk in body.stream(body.offset)])


async def test_a_cut_body_waits_for_its_continuation_at_the_offset() -> None:
    body = UploadBody(length=10, idle_timeout=5)
    reader = asyncio.ensure_future(collect(body))
    first = body.attach(pieces(b"abcd", cut=True), 0)
    assert await first.ended is False and body.offset == 4 and not body.finished
    with pytest.raises(OffsetMismatch):
        body.attach(pieces(b"zz"), 3)
    second = body.attach(pieces(b"efghij"), 4)
    assert await second.ended is True
    assert await reader == b"abcdefghij" and body.finished


async def test_a_second_body_while_one_is_attached_is_busy() -> None:
    body = UploadBody(length=None, idle_timeout=5)
    body.attach(pieces(b"a"), 0)
    with pytest.raises(Busy):
        body.attach(pieces(b"b"), 0)


async def test_more_bytes_than_declared_is_a_typed_error() -> None:
    body = UploadBody(length=3, idle_timeout=5)
    body.attach(pieces(b"abcdef"), 0)
    with pytest.raises(UploadTooLong):
        await collect(body)


async def test_a_cut_upload_not_continued_in_time_is_abandoned() -> None:
    body = UploadBody(length=10, idle_timeout=0.1)
    body.attach(pieces(b"abc", cut=True), 0)
    with pytest.raises(UploadAbandoned, match="not continued within"):
        await collect(body)


async def test_abandon_wakes_the_waiting_reader() -> None:
    body = UploadBody(length=None, idle_timeout=30)
    reader = asyncio.ensure_future(collect(body))
    await asyncio.sleep(0.01)
    body.abandon("a new upload started from byte 0")
    with pytest.raises(UploadAbandoned, match="new upload"):
        await reader


async def test_probe_offers_ranges_only_for_a_known_length() -> None:
    known = await UploadBody(length=5, idle_timeout=1).probe()
    unknown = await UploadBody(length=None, idle_timeout=1).probe()
    assert known.ranges and known.validator and known.size == 5 and not known.replayable
    assert not unknown.ranges and unknown.validator is None
