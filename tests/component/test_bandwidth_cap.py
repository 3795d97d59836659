"""The import bandwidth cap (issue 28) end to end with a real HTTP server on loopback: ``cdi
import --bandwidth-limit`` of a raw image served with ranges (parallel range requests share
the one cap) takes at least as long as the cap allows, writes the same bytes, and an import
without the cap is far faster on the same server (so the cap, not the server, set the pace);
a rate that is not a quantity is refused up front with a typed error, nothing read; a
containerDisk from the real registry on loopback is paced by the same cap."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from importer.runner import run_import
from testkit.containerdisk import add_disk
from tests.component.conftest import ImageFactory, MiB, Server, same_content
from tests.component.registry_fixtures import (  # noqa: F401 (fixture)
    Registries,
    registries_fixture,
    registry_config,
)
from tests.component.test_cli_and_pod import _run

CDI = [sys.executable, "-m", "commands.main"]
RATE = 8 * MiB


async def _import(url: str, target: Path, *extra: str) -> tuple[float, dict[str, object]]:
    started = time.monotonic()
    code, out, err = await _run(*CDI, "import", url, str(target), "--json", "--quiet", *extra)
    assert code == 0, err
    return time.monotonic() - started, json.loads(out)


async def test_a_capped_import_reads_no_faster_than_the_cap(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw")  # 32 MiB with data spread through it, served with ranges
    wire = image.path.stat().st_size
    url = server.link("ok", image.path)
    capped = tmp_path / "capped.img"
    seconds, result = await _import(url, capped, "--bandwidth-limit", "8Mi")
    assert result["reason"] == "Completed"
    assert seconds >= 0.9 * wire / RATE, (seconds, wire)  # 32 MiB at 8 MiB/s: >= 3.6 s
    assert same_content(capped, image.reference)
    free = tmp_path / "free.img"
    unlimited, _ = await _import(url, free)
    assert unlimited < seconds / 2, (unlimited, seconds)
    assert same_content(free, image.reference)


async def test_a_rate_that_is_not_a_quantity_is_refused_before_anything_is_read(
    server: Server, tmp_path: Path
) -> None:
    code, _, err = await _run(
        *CDI, "import", f"{server.url}/ok/none.img", str(tmp_path / "d.img"),
        "--bandwidth-limit", "fast",
    )  # fmt: skip
    assert code != 0
    assert "bandwidth limit 'fast' is not a quantity of bytes per second" in err, err
    assert "Traceback" not in err
    assert not server.recorder.requests


async def test_a_registry_import_shares_the_same_cap(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("raw", "gz")  # the layer is a gzip tar: its bytes are what is paced
    reg = registries.anonymous
    registries.publish(reg, "disks/capped", [add_disk(("disk.raw", image.reference))])
    target = tmp_path / "disk.img"
    config = registry_config(reg.url("disks/capped", "v1"), target, insecure_registry=True)
    started = time.monotonic()
    result = await run_import(replace(config, bandwidth_limit=MiB))
    seconds = time.monotonic() - started
    assert result.succeeded, result
    assert same_content(target, image.reference)
    assert seconds >= 0.9 * result.bytes_read / MiB, (seconds, result.bytes_read)
    assert result.bytes_read > MiB  # long enough for the cap to show
