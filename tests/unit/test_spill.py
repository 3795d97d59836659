"""The spill area on its own: memory first, then a sparse scratch file at the source offsets,
typed errors at its bounds, and nothing left behind.

Real files in a pytest temporary directory; the decoders' use of it is pinned by the decoder
contract suite (tests/unit/test_decoder_contract.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.api.errors import TargetError, UnsafeImage
from cdi.api.quantity import scratch_ceiling
from datapath.decode.rawpieces import LayoutNotStreamable
from datapath.decode.spill import (
    REPAY_SLICE,
    Spill,
    SpillLimitExceeded,
    repaid_writes,
)

MiB = 1 << 20


def test_memory_spill_keeps_takes_back_and_trims() -> None:
    spill = Spill(memory_limit=100)
    spill.add(0, b"abc")
    spill.add(3, b"def")  # joins the segment before it
    spill.add(10, memoryview(b"XYZ"))
    assert len(spill) == 2 and spill.size == spill.memory == 9
    assert spill.prefix(0, 13) == b"abcdef"  # stops at the gap
    assert spill.prefix(1, 4) == b"bcd" and spill.prefix(7, 9) == b""
    spill.discard(2, 11)
    assert spill.prefix(0, 20) == b"ab" and spill.prefix(11, 20) == b"YZ"
    spill.discard(0, 1)
    spill.discard(12, 13)
    assert (spill.prefix(1, 2), spill.prefix(11, 12), spill.size) == (b"b", b"Y", 2)
    assert spill.memory_peak == 9 and spill.scratch_bytes == 0 and spill.path is None


def test_discarding_the_middle_splits_a_segment() -> None:
    spill = Spill()
    spill.add(100, b"0123456789")
    spill.discard(103, 106)
    assert (spill.prefix(100, 110), spill.prefix(106, 110), spill.size) == (b"012", b"6789", 7)


def test_adds_never_go_back() -> None:
    spill = Spill()
    spill.add(10, b"x")
    with pytest.raises(RuntimeError):
        spill.add(5, b"y")


def test_past_the_memory_bound_without_scratch_is_not_streamable() -> None:
    spill = Spill(memory_limit=10)
    spill.add(0, b"a" * 10)
    with pytest.raises(SpillLimitExceeded) as info:
        spill.add(10, b"b")
    assert isinstance(info.value, LayoutNotStreamable) and not info.value.transient


def test_past_the_memory_bound_goes_to_a_sparse_file_at_the_source_offset(tmp_path: Path) -> None:
    with Spill(memory_limit=MiB, scratch_dir=str(tmp_path)) as spill:
        spill.add(0, b"m" * MiB)  # fills memory exactly
        assert spill.path is None  # no file until memory is full
        far = 64 * MiB
        spill.add(far, b"f" * 8192)
        spill.add(far + 8192, b"g" * 4096)  # joins the file segment
        assert spill.path is not None and os.path.dirname(spill.path) == str(tmp_path)
        st = os.stat(spill.path)
        assert st.st_mode & 0o777 == 0o600
        assert st.st_size == far + 12288 and st.st_blocks * 512 <= 64 * 1024  # sparse
        assert spill.scratch_bytes == 12288 and spill.memory_peak == MiB
        assert spill.prefix(far + 4096, far + 16384) == b"f" * 4096 + b"g" * 4096
        spill.discard(0, MiB)  # memory frees up: the next add lands in memory again
        spill.add(far + 12288, b"h")
        assert spill.memory == 1 and spill.prefix(far + 12287, far + 12289) == b"gh"
        spill.clear()
        assert os.stat(spill.path).st_size == 0 and spill.size == 0
        path = spill.path
    assert not os.path.exists(path) and os.listdir(tmp_path) == []


def test_file_ceiling_refuses_a_bomb(tmp_path: Path) -> None:
    with Spill(memory_limit=0, scratch_dir=str(tmp_path), file_limit=MiB) as spill:
        spill.add(MiB - 10, b"x" * 10)
        with pytest.raises(UnsafeImage, match="bomb"):
            spill.add(MiB, b"y")
    assert scratch_ceiling(8 * MiB) == 9 * MiB + 64 * MiB


def test_scratch_file_is_never_a_planted_symlink(tmp_path: Path) -> None:
    """Names are random and opened with O_EXCL|O_NOFOLLOW: whatever sits in the directory
    (a symlink to a file we must not write) stays untouched."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    for i in range(4):
        (tmp_path / f"cdi-spill-{i}").symlink_to(victim)
    with Spill(memory_limit=0, scratch_dir=str(tmp_path)) as spill:
        spill.add(0, b"data")
        assert spill.path is not None and not os.path.islink(spill.path)
    assert victim.read_bytes() == b"keep"


def test_scratch_dir_is_made_only_when_something_spills(tmp_path: Path) -> None:
    with Spill(memory_limit=4, scratch_dir=str(tmp_path / "scratch")) as spill:
        spill.add(0, b"mem")
        assert not (tmp_path / "scratch").exists()  # held in memory: no folder made
        spill.add(3, b"file")
        assert (tmp_path / "scratch").is_dir()


def test_a_scratch_dir_that_cannot_be_made_is_a_typed_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    spill = Spill(memory_limit=0, scratch_dir=str(tmp_path / "file" / "scratch"))
    with pytest.raises(TargetError, match=r"scratch space .*/file/scratch"):
        spill.add(0, b"x")
    spill.close()


def test_owed_data_comes_back_in_slices_and_survives_an_abandoned_reader(tmp_path: Path) -> None:
    with Spill(memory_limit=0, scratch_dir=str(tmp_path)) as spill:
        data = bytes(range(256)) * (12 * MiB // 256)
        spill.add(4096, data)
        assert spill.owe(4096, 4096 + len(data), 0) == len(data)
        assert spill.owe(0, 10, 0) == 0 and len(spill.owed) == 1  # not held: not owed
        reader = repaid_writes(spill, 64 * MiB)
        first = next(reader)  # a slice is read...
        del reader  # ...but its writer failed: the slice is still owed
        writes = list(repaid_writes(spill, 64 * MiB))
        assert first == writes[0] and max(len(w) for _, w in writes) <= REPAY_SLICE
        assert b"".join(w for _, w in writes) == data and spill.size == 0


def test_clear_waits_for_what_is_owed() -> None:
    spill = Spill()
    spill.add(0, b"abcdef")
    spill.owe(2, 4, 100)
    spill.clear()
    assert spill.size == 6
    assert list(spill.repay()) == [(100, b"cd")]
    assert spill.size == 0 and len(spill) == 0
