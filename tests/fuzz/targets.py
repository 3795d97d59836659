"""Fuzz targets: feed arbitrary bytes to one parser and accept only typed outcomes.

A target returns normally when the parser either decodes the input or refuses it with a
``WorkerError`` (the typed errors every worker turns into a termination message). Anything
else - an ``IndexError``, a ``struct.error``, a ``MemoryError``, an assertion - propagates and
libFuzzer records the input as a crash. Hangs and memory growth are caught by libFuzzer's
``-timeout`` and ``-rss_limit_mb`` (set in ``__main__``).

The first input byte chooses the chunk size the stream is cut into, so the decoders' chunk
boundary handling is fuzzed along with their tables. Decoded writes are counted, not kept, and
each decoder is told a virtual-size ceiling, as the importer tells it the volume's capacity.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator

from cdi.api.errors import WorkerError

MAX_VIRTUAL = 64 << 20  # the "volume" each decoder is told it writes into
TAR_CAPACITY = 1 << 20
_CHUNKS = (1, 7, 512, 4096, 65536, 1 << 20)


def _chunks(data: bytes) -> Iterator[bytes]:
    if not data:
        return
    body = data[1:]
    # Tiny chunks for small inputs; never more than 512 of them (a 1 MiB VDI fed byte by byte
    # under instrumentation takes minutes: a harness artefact, not a hang).
    step = max(_CHUNKS[data[0] % len(_CHUNKS)], len(body) // 512)
    for pos in range(0, len(body), step):
        yield body[pos : pos + step]


def _drain(writes: Iterable[tuple[int, bytes | memoryview]]) -> None:
    for offset, piece in writes:
        if offset < 0 or offset + len(piece) > MAX_VIRTUAL:
            raise AssertionError(f"write outside the volume: {offset}+{len(piece)}")


def _decode(make: Callable[[], object], data: bytes) -> None:
    decoder = make()
    try:
        for chunk in _chunks(data):
            _drain(decoder.feed(chunk))  # type: ignore[attr-defined]
        _drain(decoder.finish())  # type: ignore[attr-defined]
    except WorkerError:
        pass


def qcow2(data: bytes) -> None:
    from datapath.decode.qcow2 import Qcow2StreamDecoder

    _decode(lambda: Qcow2StreamDecoder(max_virtual_size=MAX_VIRTUAL), data)


def vmdk(data: bytes) -> None:
    from datapath.decode.vmdk import VmdkStreamDecoder

    _decode(lambda: VmdkStreamDecoder(max_virtual_size=MAX_VIRTUAL), data)


def vdi(data: bytes) -> None:
    from datapath.decode.vdi import VdiStreamDecoder

    _decode(lambda: VdiStreamDecoder(max_virtual_size=MAX_VIRTUAL), data)


def tar(data: bytes) -> None:
    """Extract into a fresh folder, then check nothing escaped it (no link leads outside)."""
    from datapath.decode.archive import extract_tar

    root = tempfile.mkdtemp(prefix="fuzz-tar-", dir=_scratch())
    dest = os.path.join(root, "vol")
    os.mkdir(dest)
    try:
        try:
            extract_tar(_chunks(data), dest, TAR_CAPACITY)
        except WorkerError:
            pass
        _assert_contained(root, dest)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _scratch() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _assert_contained(root: str, dest: str) -> None:
    if sorted(os.listdir(root)) != ["vol"]:
        raise AssertionError(f"extraction wrote beside the volume: {os.listdir(root)}")
    real_dest = os.path.realpath(dest)
    for folder, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                resolved = os.path.realpath(path)
                if resolved != real_dest and not resolved.startswith(real_dest + os.sep):
                    raise AssertionError(f"link {path} resolves outside the volume: {resolved}")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "qcow2": qcow2,
    "vmdk": vmdk,
    "vdi": vdi,
    "tar": tar,
}
# libFuzzer's -max_len per target: big enough for the seeds (a VDI block is 1 MiB).
MAX_LEN = {"qcow2": 1 << 17, "vmdk": 1 << 16, "vdi": (1 << 20) + 8192, "tar": 1 << 15}
