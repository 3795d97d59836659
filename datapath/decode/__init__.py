"""The decode stage: from source bytes to raw bytes in the target, in one synchronous pass.

Runs on a worker thread (never on the event loop) and is a plain function of an iterator of
chunks, so tests can drive it with a list. Two tables choose what runs, so a reader can see
every path bytes can take:

- ``_ENVELOPES``: what wraps the image, chosen by the plan (never sniffed): ``sniffed``
  (kubevirt: peel compression layers by their first bytes, then decode by format),
  ``passthrough`` (blockdevice-clone: verbatim and sparse, no sniffing), ``sparse`` (our
  cloner's blockdevice-clone-sparse: data extents in frames), ``archive`` (archive
  and filesystem-clone: a tar extracted with the archive rules) and ``tar_member`` (a registry
  layer: the one file under ``disk/``, then sniffed again).
- ``_FORMATS``: what the innermost sniffed format becomes: raw bytes go to the sparse
  ``RawWriter``; qcow2, vdi and vmdk go through their streaming decoders (``_DECODERS``)
  straight into the target (their headers are vetted first, whichever path follows); vhd/vhdx,
  and any image whose layout a decoder could not stream (the processor's re-read fallback), go
  to a scratch file for qemu-img.

One shortcut comes first: a multi-block .xz holding a raw image is written block by block in
place, on several threads, instead of being decoded in order (``_write_xz_blocks``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cdi.api.constants import ContentType
from cdi.api.errors import UnsupportedFormat
from cdi.api.quantity import scratch_ceiling
from datapath.decode.qcow2 import Qcow2StreamDecoder
from datapath.decode.qcow2.header import parse_header, peek_cluster_size
from datapath.decode.rawpieces import Write
from datapath.decode.spill import Spill, scratch_error
from datapath.formats import SNIFF_BYTES, ImageFormat, sniff
from datapath.streams import Peekable
from datapath.target import RawWriter
from datapath.target.nofollow import ensure_dir, open_fresh

if TYPE_CHECKING:
    from datapath.decode.xz_parallel import XzBlocks
    from datapath.verify import WriteDigest

# Handlers for compression, archives, vdi and vmdk are imported where first needed: importing
# every codec up front cost ~30 ms of each import's start-up (python -X importtime), ~4% of a
# 0.8 s qcow2 import.

SCRATCH_NAME = "cdi-scratch.img"
MAX_LAYERS = 4  # gz inside xz inside zst... more than this is an attack, not an image
# Decoders whose memory is counted in tens of MiB (docs/importer.md, memory table): one per
# chain, so their ceilings never add up (no real image is xz inside zstd).
_HEAVY_LAYERS = frozenset({ImageFormat.XZ, ImageFormat.ZSTD})


@dataclass
class DecodeResult:
    format_chain: list[str] = field(default_factory=list)
    image_format: ImageFormat = ImageFormat.RAW
    virtual_size: int = 0
    bytes_written: int = 0
    scratch_path: str | None = None
    scratch_bytes: int = 0  # bytes staged on scratch (a qemu-img input or a decoder's spill)


@dataclass(frozen=True)
class DecodePlan:
    content_type: ContentType
    capacity: int | None  # usable bytes in the target
    writer: RawWriter | None  # the target, for raw content
    archive_dir: str | None  # the target, for archive content
    scratch_dir: str  # where images that need qemu-img are staged
    stream_images: bool = True  # decode qcow2/vdi/vmdk in one pass; False after a fallback
    spill_limit: int = 64 * 1024 * 1024  # out-of-order image data held in memory, then...
    spill_to_scratch: bool = True  # ...in a sparse file in scratch_dir (False: memory only)
    source_size: int | None = None  # bytes on the wire, when known (Content-Length)
    before_random_writes: Callable[[], None] | None = None  # e.g. zero a block device first
    resume_offset: int = 0  # continue a raw image at this offset (datapath.checkpoint)
    # told each raw piece written and the position after it (datapath.checkpoint.Checkpointer)
    checkpointer: Callable[[bytes, int], None] | None = None
    tar_member: str | None = None  # registry layer: decode the one file under this prefix
    # a verified volume's archive: each extracted file's digest, by path (datapath.verify)
    tree_digests: dict[str, WriteDigest] | None = None


Handler = Callable[[Iterator[bytes], DecodePlan, DecodeResult], DecodeResult]


def peel(chunks: Iterator[bytes], chain: list[str]) -> tuple[ImageFormat, Peekable]:
    """Strip compression layers; return the innermost format and its stream."""
    stream = Peekable(chunks)
    heavy = 0
    for _ in range(MAX_LAYERS + 1):
        fmt = sniff(stream.peek(SNIFF_BYTES))
        chain.append(fmt.value)
        if not fmt.is_compression:
            return fmt, stream
        heavy += fmt in _HEAVY_LAYERS
        if heavy > 1:
            raise UnsupportedFormat(f"xz or zstd nested in xz or zstd is not supported: {chain}")
        from datapath.decode.decompress import decompress

        stream = Peekable(decompress(fmt, stream))
    raise UnsupportedFormat(f"more than {MAX_LAYERS} nested compression layers: {chain}")


def decode_into(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """Decode into the target; ``result`` is filled as we go, so a failure still reports
    the format chain found so far."""
    if plan.resume_offset:
        assert plan.writer is not None
        result.format_chain.append(ImageFormat.RAW.value)
        plan.writer.position = plan.resume_offset
        return _write_raw(chunks, plan, plan.writer, result)
    return _ENVELOPES[envelope_of(plan)](chunks, plan, result)


def envelope_of(plan: DecodePlan) -> str:
    """The name of the envelope handler the plan asks for."""
    if plan.tar_member is not None:
        return "tar_member"
    return _ENVELOPE_OF[plan.content_type]


def _sniffed(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """kubevirt: whatever the first bytes say, peeled and decoded by ``_FORMATS``."""
    if plan.writer is not None:
        xz, chunks = _raw_xz_blocks(chunks)
        if xz is not None:
            result.format_chain += [ImageFormat.XZ.value, ImageFormat.RAW.value]
            return _write_xz_blocks(xz, plan.writer, result)
    fmt, stream = peel(chunks, result.format_chain)
    result.image_format = fmt
    return _FORMATS.get(fmt, _raw)(stream, plan, result)


def _passthrough(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """blockdevice-clone: the bytes as they are, never sniffed; zero pages still become holes
    (or are zeroed on a device not known to read zeros)."""
    result.format_chain.append(ImageFormat.RAW.value)
    return _raw(chunks, plan, result)


def _sparse(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """blockdevice-clone-sparse: our cloner's data extents (``datapath.decode.sparseraw``)."""
    from datapath.decode.sparseraw import write_sparse

    assert plan.writer is not None
    result.format_chain.append(ImageFormat.RAW.value)
    result.virtual_size = write_sparse(chunks, plan.writer)
    result.bytes_written = plan.writer.bytes_written
    return result


def _archive(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """archive and filesystem-clone: a tar (possibly compressed) extracted into the volume."""
    fmt, stream = peel(chunks, result.format_chain)
    result.image_format = fmt
    if fmt is not ImageFormat.TAR or plan.archive_dir is None:
        raise UnsupportedFormat(
            f"content type {plan.content_type} needs a tar archive, got {fmt.value}"
        )
    from datapath.decode.archive import extract_tar

    result.bytes_written = extract_tar(
        stream, plan.archive_dir, plan.capacity, digests=plan.tree_digests
    )
    return result


def _tar_member(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """A registry layer: peel to the tar, take the one file under the prefix, sniff again. The
    layer is read to its end afterwards, so a second disk in it is still found."""
    from datapath.decode.envelopes import tar_member

    assert plan.tar_member is not None
    fmt, stream = peel(chunks, result.format_chain)
    if fmt is not ImageFormat.TAR:
        raise UnsupportedFormat(f"an image layer must be a tar archive, got {fmt.value}")
    member = tar_member(stream, plan.tar_member)
    _sniffed(member, plan, result)
    for _ in member:  # what the decoder left unread, then the rest of the layer
        pass
    return result


def _raw(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """Raw, ISO and (CDI-compatible) a tar in kubevirt mode: written as they are."""
    assert plan.writer is not None
    return _write_raw(chunks, plan, plan.writer, result)


def _text(chunks: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    raise UnsupportedFormat(
        "the source is a text document (an HTML or error page?), not a disk image"
    )


def _image(stream: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    """qcow2, vdi, vmdk: streamed into the target when the plan allows, else via scratch. Data
    that comes before its table waits in the spill (memory, then a scratch file), so even a
    disordered image takes one pass; only what was out of order touches scratch."""
    assert isinstance(stream, Peekable)
    with _spill_for(plan) as spill:
        decoder = _streaming_decoder(result.image_format, stream, plan, result, spill)
        if decoder is not None and plan.stream_images and plan.writer is not None:
            try:
                return _stream_image(decoder, stream, plan, plan.writer, result)
            finally:
                result.scratch_bytes += spill.scratch_bytes
    return _to_scratch(stream, plan, result)


def _spill_for(plan: DecodePlan) -> Spill:
    if not plan.spill_to_scratch:
        return Spill(memory_limit=plan.spill_limit)
    return Spill(  # makes the scratch folder only if something spills
        memory_limit=plan.spill_limit,
        scratch_dir=plan.scratch_dir,
        file_limit=None if plan.capacity is None else scratch_ceiling(plan.capacity),
    )


def _write_raw(
    chunks: Iterator[bytes], plan: DecodePlan, writer: RawWriter, result: DecodeResult
) -> DecodeResult:
    # Source offset == target offset only without compression: only then can we checkpoint.
    checkpointer = plan.checkpointer if len(result.format_chain) == 1 else None
    for piece in chunks:
        writer.write(piece)
        if checkpointer is not None:
            checkpointer(piece, writer.position)
    result.virtual_size = writer.position
    result.bytes_written = writer.bytes_written
    return result


def _raw_xz_blocks(chunks: Iterator[bytes]) -> tuple[XzBlocks | None, Iterator[bytes]]:
    """The blocks of an outermost multi-block .xz whose content sniffs as raw, else None and
    the untouched stream for ``peel``. A first block shorter than the sniff window goes to
    ``peel`` too, which sniffs across blocks."""
    stream = Peekable(chunks)
    if sniff(stream.peek(SNIFF_BYTES)) is not ImageFormat.XZ:
        return None, stream
    from datapath.decode.xz_parallel import XzBlocks

    xz = XzBlocks(stream)
    first = xz.first_size()
    if first is None or first < SNIFF_BYTES or sniff(xz.head(SNIFF_BYTES)) is not ImageFormat.RAW:
        return None, xz.rest()
    return xz, iter(())


def _write_xz_blocks(xz: XzBlocks, writer: RawWriter, result: DecodeResult) -> DecodeResult:
    """Block headers give each block's offset in the image before it is decoded, so each pool
    thread writes its block in place through its own writer lane, in whatever order blocks
    finish (issue 2: nothing decoded waits in memory for an older block). The blocks tile the
    image exactly, so each lane zeroing its own skipped ranges (``zero_fill``, block devices)
    leaves no stale byte: no ``before_random_writes`` pass is needed."""
    from datapath.decode.xz_parallel import decode_positioned, default_workers

    lanes = [writer.lane() for _ in range(default_workers())]
    try:
        size = decode_positioned(xz.blocks(), lanes, writer.ensure_room)
        for lane in lanes:
            writer.absorb(lane)  # waits for its writes in flight; raises the first that failed
    finally:
        for lane in lanes:
            lane.close()  # no writer thread outlives this, nor its O_DIRECT descriptor
    writer.position = size
    result.virtual_size = size
    result.bytes_written = writer.bytes_written
    return result


def _vet_qcow2_header(stream: Peekable, capacity: int | None) -> None:
    """Refuse a qcow2 whose header is unsafe (backing or data file, encryption, hostile
    tables) or too big for the target before downloading the rest; qemu-img checks again."""
    cluster = peek_cluster_size(stream.peek(SNIFF_BYTES)) or SNIFF_BYTES
    parse_header(stream.peek(cluster), max_virtual_size=capacity)


class StreamDecoder(Protocol):
    """What the qcow2, vdi and vmdk stream decoders have in common (sans-I/O)."""

    virtual_size: int | None

    def feed(self, data: bytes) -> Iterable[Write]: ...

    def finish(self) -> Iterable[Write]: ...


def _streaming_decoder(
    fmt: ImageFormat, stream: Peekable, plan: DecodePlan, result: DecodeResult, spill: Spill
) -> StreamDecoder | None:
    """Vet the header (on every path: qemu-img checks again on the scratch path) and return
    the stream decoder for ``fmt``, or None for formats only qemu-img converts."""
    make = _DECODERS.get(fmt)
    if make is None:
        return None
    # Content-Length is the image's size only when nothing was peeled off it.
    file_size = plan.source_size if len(result.format_chain) == 1 else None
    return make(stream, plan, file_size, spill)


def _qcow2(
    stream: Peekable, plan: DecodePlan, file_size: int | None, spill: Spill
) -> StreamDecoder:
    _vet_qcow2_header(stream, plan.capacity)
    return Qcow2StreamDecoder(max_virtual_size=plan.capacity, file_size=file_size, spill=spill)


def _vdi(stream: Peekable, plan: DecodePlan, file_size: int | None, spill: Spill) -> StreamDecoder:
    from datapath.decode import vdi

    vdi.parse_header(stream.peek(SNIFF_BYTES), max_virtual_size=plan.capacity)
    return vdi.VdiStreamDecoder(max_virtual_size=plan.capacity, file_size=file_size, spill=spill)


def _vmdk(stream: Peekable, plan: DecodePlan, file_size: int | None, spill: Spill) -> StreamDecoder:
    from datapath.decode import vmdk

    vmdk.parse_header(stream.peek(vmdk.HEAD_BYTES), max_virtual_size=plan.capacity)
    return vmdk.VmdkStreamDecoder(max_virtual_size=plan.capacity, file_size=file_size, spill=spill)


def _stream_image(
    decoder: StreamDecoder,
    stream: Peekable,
    plan: DecodePlan,
    writer: RawWriter,
    result: DecodeResult,
) -> DecodeResult:
    """An image straight into the target, no scratch (issue 4). A layout the decoder cannot
    stream raises LayoutNotStreamable; the phase machine then retries through scratch."""
    if plan.before_random_writes is not None:
        plan.before_random_writes()
        writer.zero_fill = False  # the whole range reads as zeros now
    # The decoder already leaves out zero clusters and zero pages: no second zero scan.
    for piece in stream:
        for offset, data in decoder.feed(piece):
            writer.write_data_at(offset, data)
    for offset, data in decoder.finish():
        writer.write_data_at(offset, data)
    result.virtual_size = decoder.virtual_size or 0
    result.bytes_written = writer.bytes_written
    return result


def _to_scratch(stream: Iterator[bytes], plan: DecodePlan, result: DecodeResult) -> DecodeResult:
    try:
        path = os.path.join(ensure_dir(plan.scratch_dir), SCRATCH_NAME)
        fd = open_fresh(path)
    except OSError as exc:
        raise scratch_error(exc) from exc
    result.scratch_path = path
    # An image file is at most its virtual size plus metadata; more is a decompression bomb.
    limit = None if plan.capacity is None else scratch_ceiling(plan.capacity)
    try:
        # Buffered on purpose: qemu-img reads the scratch file right after, from page cache.
        # No zero scan: these formats are already sparse inside (grains, blocks).
        writer = RawWriter(fd, limit, zero_fill=False)
        for piece in stream:
            writer.write_data_at(writer.position, piece)
            writer.position += len(piece)
        writer.finish(writer.position, preallocate=False, block=False)
        result.bytes_written = writer.bytes_written
        result.scratch_bytes = writer.position
    finally:
        os.close(fd)
    return result


_ENVELOPES: dict[str, Handler] = {
    "sniffed": _sniffed,
    "passthrough": _passthrough,
    "sparse": _sparse,
    "archive": _archive,
    "tar_member": _tar_member,
}
_ENVELOPE_OF: dict[ContentType, str] = {
    ContentType.KUBEVIRT: "sniffed",
    ContentType.ARCHIVE: "archive",
    ContentType.BLOCKDEVICE_CLONE: "passthrough",
    ContentType.BLOCKDEVICE_CLONE_SPARSE: "sparse",
    ContentType.FILESYSTEM_CLONE: "archive",
}
_FORMATS: dict[ImageFormat, Handler] = {  # anything else (raw, tar in kubevirt mode): _raw
    ImageFormat.TEXT: _text,
    ImageFormat.QCOW2: _image,
    ImageFormat.VDI: _image,
    ImageFormat.VMDK: _image,
    ImageFormat.VHD: _to_scratch,
    ImageFormat.VHDX: _to_scratch,
}
_DECODERS: dict[ImageFormat, Callable[[Peekable, DecodePlan, int | None, Spill], StreamDecoder]] = {
    ImageFormat.QCOW2: _qcow2,
    ImageFormat.VDI: _vdi,
    ImageFormat.VMDK: _vmdk,
}
