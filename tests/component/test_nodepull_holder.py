"""Node pull's importer side against the real static holder (``deploy/images/holder/holder.c``,
compiled by the harness): the holder runs chrooted in a containerDisk root filesystem (``unshare
--root``, as the test node runs a pulled image), the importer finds it through ``ready`` and
imports ``/proc/<pid>/root/disk/<file>`` through the shared data path, byte-identical, with no
scratch; a symbolic link there is refused before a byte is read; and the holder goes away
when the importer says ``done`` or dies."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdi.api.termination import TerminationMessage
from datapath import TargetSpec
from importer.__main__ import holder_session
from importer.config import ImportConfig, build_plan
from importer.holder import READY_NAME
from importer.runner import run_import
from importer.sources.registry_options import NodePullOptions
from testkit.runtime import holder_binary
from tests.component.conftest import ImageFactory, same_content


@dataclass
class Holder:
    rootfs: Path
    shared: Path
    proc: subprocess.Popen[bytes]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 10
        while not (self.shared / READY_NAME).exists():
            assert self.proc.poll() is None, "the holder exited early"
            assert time.monotonic() < deadline, "the holder wrote no ready file"
            time.sleep(0.02)

    def exited(self, timeout: float = 5) -> int:
        return self.proc.wait(timeout=timeout)


Start = Callable[[], Holder]


@pytest.fixture
def containerdisk(tmp_path: Path) -> Iterator[Start]:
    """A root filesystem with ``disk/`` and ``shared/``, the holder running chrooted in it."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "disk").mkdir(parents=True)
    shared = rootfs / "shared"
    shared.mkdir()
    holder = shared / "cdi-holder"
    shutil.copyfile(holder_binary(), holder)
    holder.chmod(0o555)
    started: list[Holder] = []

    def start() -> Holder:
        unshare = shutil.which("unshare") or "/usr/bin/unshare"
        argv = [unshare, f"--root={rootfs}", "--wd=/", "--", "/shared/cdi-holder"]
        env = {"TEST_KUBEVIRT_IO_TEST": "holder", "PATH": "/bin"}
        started.append(Holder(rootfs, shared, subprocess.Popen(argv, env=env)))
        return started[-1]

    yield start
    for h in started:
        if h.proc.poll() is None:
            h.proc.kill()
            h.proc.wait()


async def _import(holder: Holder, target: Path) -> TerminationMessage:
    source = NodePullOptions("docker://127.0.0.1:5000/disks/x:v1", str(holder.shared), 10.0)
    plan = build_plan(source, TargetSpec(path=str(target), block=False), scratch_dir=None)
    with holder_session(str(holder.shared)):
        return await run_import(ImportConfig(plan=plan, source=source))


@pytest.mark.parametrize("kind", ["qcow2", "raw"])
async def test_node_pull_reads_the_disk_through_the_holder(
    containerdisk: Start, images: ImageFactory, tmp_path: Path, kind: str
) -> None:
    image = images.make(kind, "gz" if kind == "raw" else None)
    holder = containerdisk()
    shutil.copyfile(image.path, holder.rootfs / "disk" / image.path.name)
    holder.wait_ready()
    target = tmp_path / "disk.img"
    result = await _import(holder, target)
    assert result.succeeded, result
    assert same_content(target, image.reference)
    assert result.scratch_bytes == 0 and not result.scratch_used
    assert result.labels == {"test.kubevirt.io/test": "holder"}, "from the holder's environ"
    assert holder.exited() == 0, "done ends the holder"


async def test_a_symlink_to_a_host_file_is_refused_before_reading(
    containerdisk: Start, tmp_path: Path
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_bytes(b"never read\n" * 1000)
    holder = containerdisk()
    os.symlink(secret, holder.rootfs / "disk" / "disk.img")
    holder.wait_ready()
    target = tmp_path / "disk.img"
    result = await _import(holder, target)
    assert result.reason == "UnsafeImage", result
    assert "symbolic link" in result.message
    assert result.bytes_read == 0 and not target.exists()
    assert holder.exited() == 0, "a failed import also ends the holder"


async def test_two_files_fail_with_cdis_message(containerdisk: Start, tmp_path: Path) -> None:
    holder = containerdisk()
    for name in ("a.img", "b.img"):
        (holder.rootfs / "disk" / name).write_bytes(b"x" * 4096)
    holder.wait_ready()
    result = await _import(holder, tmp_path / "disk.img")
    assert result.reason == "InvalidImage", result
    assert result.message == "image directory contains more than one file: disk/a.img, disk/b.img"


def test_the_holder_exits_when_the_importer_dies(containerdisk: Start, tmp_path: Path) -> None:
    """SIGKILL leaves no done file; the kernel's release of the importer lock ends the holder,
    so the pod still completes."""
    holder = containerdisk()
    holder.wait_ready()
    code = (
        "import sys, time; from importer.holder import ImporterLock; "
        "ImporterLock(sys.argv[1]); print('locked', flush=True); time.sleep(60)"
    )
    importer = subprocess.Popen(
        [sys.executable, "-c", code, str(holder.shared)], stdout=subprocess.PIPE
    )
    assert importer.stdout is not None and importer.stdout.readline() == b"locked\n"
    time.sleep(0.5)
    assert holder.proc.poll() is None, "the holder waits while the importer lives"
    importer.send_signal(signal.SIGKILL)
    importer.wait()
    assert holder.exited() == 0
    assert not (holder.shared / "done").exists()
