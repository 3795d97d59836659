"""qemu-img runs as an asyncio child: a timeout or a cancellation kills and reaps it."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from cdi.api.errors import TargetError
from datapath import qemu
from datapath.formats import ImageFormat
from tests.component.conftest import MiB
from tests.component.test_processor_healthz import vhdx_image


def qemu_children_on(path: Path) -> list[int]:
    """Processes whose command line names ``path`` (a reaped child has none)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if str(path).encode() in fh.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


async def test_convert_past_its_timeout_is_killed_with_a_typed_error(tmp_path: Path) -> None:
    image, _ = vhdx_image(tmp_path, 64 * MiB)
    out = tmp_path / "out.raw"
    with pytest.raises(TargetError, match="longer than"):
        await qemu.convert(
            str(image), ImageFormat.VHDX, str(out), block=False, zeroed=False, seconds=0.001
        )
    assert qemu_children_on(out) == []


async def test_cancelled_convert_leaves_no_qemu_img_behind(tmp_path: Path) -> None:
    image, _ = vhdx_image(tmp_path, 64 * MiB)
    out = tmp_path / "out.raw"
    job = asyncio.ensure_future(
        qemu.convert(str(image), ImageFormat.VHDX, str(out), block=False, zeroed=False)
    )
    for _ in range(100):  # until qemu-img has started
        await asyncio.sleep(0.005)
        if qemu_children_on(out):
            break
    assert qemu_children_on(out), "qemu-img never started"
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert qemu_children_on(out) == []
