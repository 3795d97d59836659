"""The processor driven by a one-shot, in-memory source (an upload body): every format and
compression of the import matrix, byte-identical to qemu-img, never reading the source twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdi.api.errors import InvalidConfig
from datapath import Phase, Processor, ProcessPlan, SourceConsumed, StreamSource, TargetSpec
from tests.component.conftest import (
    COMPRESSORS,
    CONVERSIONS,
    ImageFactory,
    allocated,
    run,
    same_content,
)
from tests.component.onesource import OneShotBody, process_body

MiB = 1024 * 1024
MATRIX = [(kind, None) for kind in CONVERSIONS] + [
    (kind, comp) for kind in ("raw", "qcow2", "vmdk", "vdi", "vhd", "vhdx") for comp in COMPRESSORS
]


def l1_after_12_mib_of_data(d: Path) -> Path:
    """A resize moved the L1 table after 12 MiB of data: more than one source chunk arrives
    before the table that maps it."""
    image = d / "moved.qcow2"
    run("qemu-img", "create", "-f", "qcow2", "-o", "cluster_size=4096", image, "16M")
    run("qemu-io", "-c", "write -P 7 0 12M", image)
    run("qemu-img", "resize", image, "256M")
    return image


@pytest.mark.parametrize(("kind", "compression"), MATRIX)
async def test_one_shot_source_is_identical_to_qemu_img(
    kind: str, compression: str | None, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make(kind, compression)
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    body = OneShotBody.of(image.path)
    result = await process_body(body, target)
    assert result.succeeded, result
    assert body.iterations == 1
    assert same_content(target, image.reference)
    assert target.stat().st_size == image.reference.stat().st_size
    assert allocated(target) <= allocated(image.reference)
    assert result.bytes_read == image.path.stat().st_size
    through_scratch = kind in ("vhd", "vhdx")
    assert result.scratch_used == through_scratch
    plain = images.root / f"disk.{kind}"  # the uncompressed image is what goes to scratch
    assert result.scratch_bytes == (plain.stat().st_size if through_scratch else 0)
    assert not list(target.parent.glob(".cdi-scratch/*")), "scratch left behind"


async def test_disordered_qcow2_within_the_memory_bound_streams_in_one_pass(
    tmp_path: Path,
) -> None:
    image = l1_after_12_mib_of_data(tmp_path)
    reference = tmp_path / "ref.raw"
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", image, reference)
    body = OneShotBody.of(image)
    result = await process_body(body, tmp_path / "disk.img")
    assert result.succeeded, result
    assert body.iterations == 1 and not result.scratch_used
    assert same_content(tmp_path / "disk.img", reference)


async def test_a_one_shot_source_is_never_streamed_again(tmp_path: Path) -> None:
    """Beyond every bound the layout cannot be decoded in one pass: a replayable source would
    be read again through scratch, a one-shot one fails with the typed reason instead."""
    image = l1_after_12_mib_of_data(tmp_path)
    body = OneShotBody.of(image)
    target = tmp_path / "disk.img"
    result = await process_body(body, target, spill_limit=4096)
    assert result.reason == "Qcow2LayoutUnordered", result
    assert body.iterations == 1
    assert not target.exists()


async def test_transfer_done_fires_when_the_bytes_are_in_before_convert(
    images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("vhdx", "gz")
    phases: list[str] = []
    target = tmp_path / "disk.img"
    plan = ProcessPlan(target=TargetSpec(str(target), block=False))
    processor: Processor

    async def done() -> None:
        phases.append(processor.progress.phase)
        assert processor.progress.done == image.path.stat().st_size

    processor = Processor(plan, StreamSource(OneShotBody.of(image.path)), on_transfer_done=done)
    result = await processor.run()
    assert result.succeeded, result
    assert phases == ["Validating"]  # Verify: after Transfer, before Validate and Convert
    assert processor.transfer_done.is_set()
    assert same_content(target, image.reference)


async def test_a_blank_plan_takes_no_source_and_a_source_plan_needs_one(tmp_path: Path) -> None:
    spec = TargetSpec(str(tmp_path / "disk.img"), block=False, size=8 * MiB)
    result = await Processor(ProcessPlan(target=spec, blank=True), None).run()
    assert result.succeeded and result.virtual_size == 8 * MiB
    assert allocated(tmp_path / "disk.img") == 0
    with pytest.raises(InvalidConfig):
        Processor(ProcessPlan(target=spec), None)
    with pytest.raises(InvalidConfig):
        Processor(ProcessPlan(target=spec, blank=True), StreamSource(OneShotBody(b"")))


async def test_stream_source_coalesces_pieces_and_refuses_a_second_stream() -> None:
    source = StreamSource(OneShotBody(bytes(range(256)) * 4096 * 3, piece=1000), chunk_size=MiB)
    info = await source.probe()
    assert not info.replayable and not info.ranges
    sizes = [len(c) async for c in source.stream()]
    assert sizes[:-1] and all(MiB <= s < MiB + 1000 for s in sizes[:-1])
    assert sum(sizes) == 256 * 4096 * 3
    with pytest.raises(SourceConsumed):
        source.stream()


def test_every_phase_has_a_handler() -> None:
    spec = TargetSpec("/nonexistent/disk.img", block=False)
    processor = Processor(ProcessPlan(target=spec, blank=True), None)
    assert set(processor.handlers) == set(Phase) - {Phase.COMPLETE}
