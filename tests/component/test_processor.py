"""The processor driven by a one-shot, in-memory source (an upload body): every format and
compression of the import matrix, byte-identical to qemu-img, never reading the source twice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from cdi.api.errors import InvalidConfig
from datapath import (
    FileSource,
    Phase,
    Processor,
    ProcessPlan,
    SourceConsumed,
    StreamSource,
    TargetSpec,
)
from datapath.sources.stream import PASS_SIZE, coalesce
from tests.component.conftest import (
    COMPRESSORS,
    CONVERSIONS,
    ImageFactory,
    allocated,
    run,
    same_content,
)
from tests.component.onesource import OneShotBody, process_body
from tests.unit.disk_builders import VdiSpec, VmdkSpec, build_vdi, build_vmdk

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


def vdi_map_after_data(d: Path) -> Path:
    image = d / "moved.vdi"
    blocks = {virt: bytes([virt + 1]) * MiB for virt in (0, 2, 5, 9)}
    image.write_bytes(build_vdi(VdiSpec(disk_size=12 * MiB, blocks=blocks, map_after_data=True)))
    return image


def vmdk_grains_first(d: Path) -> Path:
    image = d / "grains-first.vmdk"
    grains = {g: bytes([g % 250 + 1]) * 4096 for g in range(0, 3000, 3)}
    spec = VmdkSpec(capacity=3000 * 8, gtes=512, grains=grains, grains_first=True)
    image.write_bytes(build_vmdk(spec))
    return image


DISORDERED = {
    "qcow2": l1_after_12_mib_of_data,
    "vdi": vdi_map_after_data,
    "vmdk": vmdk_grains_first,
}


@pytest.mark.parametrize("fmt", sorted(DISORDERED))
@pytest.mark.parametrize("memory", [64 * MiB, 4096])
async def test_disordered_image_from_a_one_shot_source_converts_in_one_pass(
    fmt: str, memory: int, tmp_path: Path
) -> None:
    """Data before its table waits in memory, past the bound in a sparse scratch file that
    holds only the out-of-order part; the body is read once either way."""
    image = DISORDERED[fmt](tmp_path)
    reference = tmp_path / "ref.raw"
    run("qemu-img", "convert", "-f", fmt, "-O", "raw", image, reference)
    body = OneShotBody.of(image)
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    result = await process_body(body, target, spill_limit=memory)
    assert result.succeeded, result
    assert body.iterations == 1
    assert same_content(target, reference)
    assert list(result.format_chain) == [fmt]
    spilled = memory < 64 * MiB
    assert result.scratch_used == spilled
    assert (0 < result.scratch_bytes < image.stat().st_size) == spilled
    assert not list(target.parent.glob(".cdi-scratch/*")), "spill file left behind"


def vmdk_compressed_without_markers(d: Path) -> Path:
    """Compressed grains without grain markers: their lengths are unknown until the grain
    tables are read, so no spill helps; only qemu-img could try it (and refuses this one)."""
    image = d / "no-markers.vmdk"
    grains = {0: b"\x01" * 4096, 7: b"\x02" * 4096, 3: b"\x05" * 100}
    data = bytearray(build_vmdk(VmdkSpec(capacity=61, grains=grains, compressed=True)))
    data[10] &= ~0x02  # flags bit 17: "grains have markers"
    image.write_bytes(data)
    return image


async def test_a_one_shot_source_is_never_streamed_again(tmp_path: Path) -> None:
    """A layout no spill helps with: a replayable source is read again through scratch and
    handed to qemu-img, a one-shot one fails with the typed reason instead of being read
    twice."""
    image = vmdk_compressed_without_markers(tmp_path)
    body = OneShotBody.of(image)
    target = tmp_path / "disk.img"
    result = await process_body(body, target)
    assert result.reason == "ImageLayoutUnordered", result
    assert body.iterations == 1
    assert not target.exists()
    plan = ProcessPlan(target=TargetSpec(str(target), block=False))
    result = await Processor(plan, FileSource(str(image))).run()
    assert result.reason == "TargetError" and "qemu-img convert" in result.message, result
    assert result.scratch_used and result.scratch_bytes == image.stat().st_size
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


async def test_coalesce_hands_on_large_pieces_uncopied_and_keeps_the_order() -> None:
    big = [bytes([i]) * PASS_SIZE for i in range(3)]
    pieces = [b"a" * 10, b"b" * 20, big[0], big[1], b"c" * 5, big[2], b"d"]

    async def body() -> AsyncIterator[bytes]:
        for piece in pieces:
            yield piece

    out = [c async for c in coalesce(body(), size=MiB)]
    assert out[1] is big[0] and out[2] is big[1] and out[4] is big[2]
    assert out[0] == b"a" * 10 + b"b" * 20 and out[3] == b"c" * 5 and out[5] == b"d"
    assert b"".join(out) == b"".join(pieces)


def test_every_phase_has_a_handler() -> None:
    spec = TargetSpec("/nonexistent/disk.img", block=False)
    processor = Processor(ProcessPlan(target=spec, blank=True), None)
    assert set(processor.handlers) == set(Phase) - {Phase.COMPLETE}
