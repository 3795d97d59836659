"""The bandwidth cap's pure parts (issue 28): ``Pace`` (when each chunk may leave), the
``Throttled`` wrapper's order of sleeps and chunks, the importer's ``IMPORTER_BANDWIDTH_LIMIT``
parsing and the controller's rule (CDIConfig's cap, lowered never raised by the DataVolume)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

import pytest

from cdi.api.config import CDIConfig, CDIConfigSpec
from cdi.api.errors import InvalidConfig
from cdi.api.types import DataVolume
from cdi.render import RenderError
from cdi.render.importer_pod import bandwidth_limit
from datapath.sources import SourceInfo
from datapath.sources.throttle import Pace, Throttled
from importer.config import parse_bandwidth

MiB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_pace_releases_each_chunk_when_the_bytes_up_to_it_are_due() -> None:
    clock = Clock()
    pace = Pace(MiB, clock)
    assert pace.delay(MiB // 2) == pytest.approx(0.5)  # the first chunk's own bytes count
    clock.now += 0.5
    assert pace.delay(MiB // 2) == pytest.approx(0.5)
    clock.now += 3.0  # a slow source: nothing is owed, no catching up beyond the cap
    assert pace.delay(MiB) == 0.0
    assert pace.sent == 2 * MiB


def test_a_cap_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Pace(0)


class Chunks:
    def __init__(self, sizes: list[int]) -> None:
        self.sizes, self.closed = sizes, False

    async def probe(self) -> SourceInfo:
        return SourceInfo(size=sum(self.sizes), ranges=False)

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        for size in self.sizes:
            yield b"x" * size

    async def close(self) -> None:
        self.closed = True


def test_throttled_hands_on_every_chunk_after_its_wait() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async def run() -> list[int]:
        source = Chunks([MiB, MiB, MiB])
        throttled = Throttled(source, 10 * MiB, sleep=sleep)
        assert (await throttled.probe()).size == 3 * MiB
        got = [len(c) async for c in throttled.stream()]
        await throttled.close()
        assert source.closed
        return got

    assert asyncio.run(run()) == [MiB, MiB, MiB]
    assert len(slept) == 3 and all(0.0 < s <= 0.31 for s in slept), slept


@pytest.mark.parametrize(
    ("text", "rate"), [(None, None), ("", None), ("50Mi", 50 * MiB), ("1000000", 1000000)]
)
def test_the_importer_reads_its_cap(text: str | None, rate: int | None) -> None:
    assert parse_bandwidth(text) == rate


@pytest.mark.parametrize("text", ["fast", "0", "-5Mi"])
def test_the_importer_refuses_a_cap_that_is_not_a_positive_rate(text: str) -> None:
    with pytest.raises(InvalidConfig, match="bandwidth limit"):
        parse_bandwidth(text)


def _dv(annotation: str | None) -> DataVolume:
    annotations = (
        {"cdi.kubevirt.io/storage.import.bandwidthLimit": annotation} if annotation else {}
    )
    return DataVolume.from_dict(
        {
            "metadata": {"name": "d", "namespace": "n", "annotations": annotations},
            "spec": {"source": {"http": {"url": "http://x/d.img"}}},
        }
    )


def _config(cap: str | None) -> CDIConfig:
    return CDIConfig(spec=CDIConfigSpec(import_bandwidth_limit=cap))


@pytest.mark.parametrize(
    ("cluster", "own", "rate"),
    [
        (None, None, None),
        ("4Mi", None, 4 * MiB),
        (None, "1Mi", MiB),
        ("4Mi", "1Mi", MiB),  # lowered
        ("4Mi", "1Gi", 4 * MiB),  # never raised
    ],
)
def test_a_datavolume_lowers_the_cluster_cap_and_never_raises_it(
    cluster: str | None, own: str | None, rate: int | None
) -> None:
    assert bandwidth_limit(_dv(own), _config(cluster)) == rate


def test_a_bad_cap_is_a_render_error_that_names_where_it_is() -> None:
    with pytest.raises(
        RenderError, match=re.escape("annotation cdi.kubevirt.io/storage.import.bandwidthLimit")
    ):
        bandwidth_limit(_dv("fast"), _config(None))
    with pytest.raises(RenderError, match=re.escape("CDIConfig spec.importBandwidthLimit")):
        bandwidth_limit(_dv(None), _config("0"))
