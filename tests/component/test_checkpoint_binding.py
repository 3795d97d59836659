"""A resume checkpoint keeps only bytes the source sent (issue 11).

The checkpoint and ``disk.img`` both live in the tenant's volume, so both can be planted. These
tests plant them the way a tenant could (identity copied from the real source, digest computed
over the planted bytes) and check that the import still ends with exactly the source's bytes:
the pod (which requires an attestation from outside the volume) restarts from byte 0, the CLI
(which trusts its own disk) re-verifies the prefix digest, and bytes past an attested prefix are
cut off rather than kept where the source has zeros.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import blake3

from cdi.api.termination import TerminationMessage
from datapath import CheckpointPlan, checkpoint
from importer.config import ImportConfig
from importer.runner import make_source, run_import
from tests.component.conftest import ImageFactory, Server, same_content
from tests.component.helpers import http_config

JUNK = b"\xa5" * 4096  # no page of it is zero: the writer never skips it


async def _config(
    url: str, volume: Path, *, require: bool, attested: tuple[int, str] | None = None
) -> tuple[ImportConfig, checkpoint.Checkpoint]:
    """An import into ``volume/disk.img`` with a checkpoint plan, and the identity a checkpoint
    of this source carries (URL, size, validator: all visible to the tenant)."""
    config = http_config(url, volume / "disk.img")
    path = str(volume / ".cdi-import-checkpoint")
    plan = CheckpointPlan(path, url, 1 << 20, attested=attested, require_attested=require)
    config = replace(config, plan=replace(config.plan, checkpoint=plan))
    source = make_source(config.source)
    assert source is not None
    info = await source.probe()
    await source.close()
    assert info.size and info.validator and info.ranges
    return config, checkpoint.Checkpoint(url, info.size, info.validator, 0)


def _plant(volume: Path, content: bytes, identity: checkpoint.Checkpoint, offset: int) -> None:
    (volume / "disk.img").write_bytes(content)
    digest = blake3.blake3(content[:offset]).hexdigest()
    checkpoint.save(
        str(volume / ".cdi-import-checkpoint"), replace(identity, offset=offset, digest=digest)
    )


def _junk(size: int) -> bytes:
    return (JUNK * (size // len(JUNK) + 1))[:size]


async def _import(config: ImportConfig) -> TerminationMessage:
    result = await run_import(config)
    assert result.succeeded, result.message
    return result


async def test_planted_checkpoint_and_disk_are_not_resumed_by_the_pod(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """A self-consistent planted pair (digest of the planted bytes) is not an attestation."""
    image = images.make("raw")
    size = image.path.stat().st_size
    config, identity = await _config(server.link("ok", image.path), tmp_path, require=True)
    _plant(tmp_path, _junk(size), identity, size // 2)
    result = await _import(config)
    assert result.resumed_from == 0 and "restarted from byte 0" in result.message
    assert same_content(tmp_path / "disk.img", image.reference, size)


async def test_a_changed_prefix_under_a_real_checkpoint_restarts_the_cli(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """Without an attestation requirement the file's digest is recomputed over the prefix."""
    image = images.make("raw")
    data = image.path.read_bytes()
    config, identity = await _config(server.link("ok", image.path), tmp_path, require=False)
    half = len(data) // 2
    _plant(tmp_path, data, identity, half)  # a genuine checkpoint of a genuine prefix ...
    with open(tmp_path / "disk.img", "r+b") as fh:  # ... then the prefix is changed
        fh.write(JUNK)
    result = await _import(config)
    assert result.resumed_from == 0 and "restarted from byte 0" in result.message
    assert same_content(tmp_path / "disk.img", image.reference, len(data))


async def test_an_intact_checkpoint_still_resumes_the_cli(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw")
    data = image.path.read_bytes()
    config, identity = await _config(server.link("ok", image.path), tmp_path, require=False)
    _plant(tmp_path, data[: len(data) // 2], identity, len(data) // 2)
    result = await _import(config)
    assert result.resumed_from == len(data) // 2
    assert same_content(tmp_path / "disk.img", image.reference, len(data))


async def test_an_attested_prefix_resumes_and_nothing_past_it_is_kept(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """Past the prefix the planted file holds junk where the source has zero pages (which the
    writer skips as holes): the resume must not keep it."""
    image = images.make("raw")
    data = image.path.read_bytes()
    half = len(data) // 2
    assert data[half:].count(bytes(4096)) > 0  # the source has zero pages after the prefix
    attested = (half, blake3.blake3(data[:half]).hexdigest())
    url = server.link("ok", image.path)
    config, identity = await _config(url, tmp_path, require=True, attested=attested)
    _plant(tmp_path, data[:half] + _junk(len(data) - half), identity, half)
    result = await _import(config)
    assert result.resumed_from == half
    assert same_content(tmp_path / "disk.img", image.reference, len(data))


async def test_an_attested_digest_the_volume_does_not_match_restarts(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw")
    data = image.path.read_bytes()
    half = len(data) // 2
    attested = (half, blake3.blake3(data[:half]).hexdigest())
    url = server.link("ok", image.path)
    config, identity = await _config(url, tmp_path, require=True, attested=attested)
    _plant(tmp_path, _junk(len(data)), identity, half)
    result = await _import(config)
    assert result.resumed_from == 0 and "restarted from byte 0" in result.message
    assert same_content(tmp_path / "disk.img", image.reference, len(data))
