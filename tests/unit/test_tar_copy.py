"""Archive members' data copied in large pieces (``datapath.decode.tarcopy``): files of every
size arrive identical however the stream is cut, with the members around them intact; a PAX
sparse member keeps its holes; a sparse map that writes past the file's size is refused."""

from __future__ import annotations

import io
import os
import random
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from cdi.api.errors import InvalidImage
from datapath.decode.archive import extract_tar

MiB = 1 << 20


def cut(data: bytes, size: int) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def files() -> dict[str, bytes]:
    rng = random.Random(5)
    return {"empty": b"", "tiny": b"x", "odd": rng.randbytes(10_241), "big": rng.randbytes(3 * MiB)}


def archive(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"dir/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("size", [513, 10_240, 65_537, 4 * MiB])
def test_files_arrive_identical_however_the_stream_is_cut(tmp_path: Path, size: int) -> None:
    members = files()
    written = extract_tar(cut(archive(members), size), str(tmp_path), None)
    assert written == sum(len(d) for d in members.values())
    for name, data in members.items():
        assert (tmp_path / "dir" / name).read_bytes() == data


def sparse_member(name: str, realsize: int, spans: list[tuple[int, bytes]]) -> bytes:
    """A PAX 1.0 sparse member as GNU tar -S (and our cloner) writes it."""
    text = f"{len(spans)}\n" + "".join(f"{o}\n{len(d)}\n" for o, d in spans)
    head = text.encode() + bytes(-len(text) % 512)
    body = head + b"".join(d for _, d in spans)
    info = tarfile.TarInfo(f"GNUSparseFile.0/{name}")
    info.size = len(body)
    info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
                        "GNU.sparse.name": name, "GNU.sparse.realsize": str(realsize)}  # fmt: skip
    header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    return header + body + bytes(-len(body) % 512) + bytes(1024)


def test_a_sparse_member_keeps_its_holes(tmp_path: Path) -> None:
    island = random.Random(2).randbytes(MiB)
    image = sparse_member("disk.img", 64 * MiB, [(8 * MiB, island), (63 * MiB, b"end")])
    extract_tar(cut(image, 100_000), str(tmp_path), None)
    disk = tmp_path / "disk.img"
    data = disk.read_bytes()
    assert len(data) == 64 * MiB
    assert data[8 * MiB : 9 * MiB] == island and data[63 * MiB : 63 * MiB + 3] == b"end"
    assert data.count(0) == 64 * MiB - len(island) - 3 + island.count(0)
    assert os.stat(disk).st_blocks * 512 < 4 * MiB


def test_a_sparse_map_past_the_files_size_is_refused(tmp_path: Path) -> None:
    image = sparse_member("disk.img", 4096, [(8 * MiB, b"far away")])
    with pytest.raises(InvalidImage, match="past its size"):
        extract_tar(iter([image]), str(tmp_path), 1 << 30)
