"""The importer's size detection (a clone's ``size-detection`` pod, issue 27): real files,
real qemu-img, the whole entry point with its termination message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cdi.api.errors import InvalidImage, SourceNotFound
from cdi.api.termination import TerminationMessage
from importer.size_detection import detect_size
from tests.component.conftest import run

MiB = 1024 * 1024


async def test_a_raw_disk_img_measures_its_size(tmp_path: Path) -> None:
    disk = tmp_path / "disk.img"
    with open(disk, "wb") as fh:
        fh.write(b"#!/bin/sh text-looking first bytes\n")  # raw whatever its first bytes
        fh.truncate(24 * MiB)
    result = await detect_size(str(disk))
    assert result.succeeded and result.virtual_size == 24 * MiB
    assert result.format_chain == ("raw",)


async def test_a_qcow2_disk_img_measures_its_virtual_size_not_its_file_size(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk.img"
    run("qemu-img", "create", "-f", "qcow2", disk, "100M")
    result = await detect_size(str(disk))
    assert result.virtual_size == 100 * MiB and result.format_chain == ("qcow2",)


async def test_no_image_or_a_link_is_a_typed_failure(tmp_path: Path) -> None:
    with pytest.raises(SourceNotFound):
        await detect_size(str(tmp_path / "disk.img"))
    os.symlink("/etc/hostname", tmp_path / "link.img")
    with pytest.raises(InvalidImage):
        await detect_size(str(tmp_path / "link.img"))


def _entry_point(image: Path, term: Path) -> int:
    """``python -m importer`` as the pod runs it, with the pod's variables."""
    env = {
        **os.environ,
        "IMPORTER_SIZE_DETECTION_PATH": str(image),
        "IMPORTER_TERMINATION_PATH": str(term),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "importer"], env=env, capture_output=True, check=False
    )
    return proc.returncode


def test_the_entry_point_writes_the_answer_as_its_termination_message(tmp_path: Path) -> None:
    disk = tmp_path / "disk.img"
    disk.write_bytes(b"\0" * MiB)
    term = tmp_path / "termination-log"
    assert _entry_point(disk, term) == 0
    message = TerminationMessage.from_json(term.read_text())
    assert message.succeeded and message.virtual_size == MiB
    assert _entry_point(tmp_path / "missing.img", term) == 1
    assert TerminationMessage.from_json(term.read_text()).reason == "SourceNotFound"
