"""The one-command try-out, run as a new user runs it: ``bash scripts/tryout.sh`` in a fresh
copy of the repository, in a pseudo-terminal. Its printed example, pasted into a shell, makes a
DataVolume that reaches Succeeded; Ctrl-C on the terminal then leaves no mount, loop device,
process or state directory behind.

The fresh copy holds exactly the files ``git`` knows (tracked plus not-ignored new ones, so a
change under test is included): no ``.venv``, no ``hack/kube/_build``. The script makes both
(the Kubernetes binaries come from the build cache that ``hack/kube/build.sh`` keeps outside
the tree, as they would on a developer's second clone).
"""

from __future__ import annotations

import os
import pty
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.waiting import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
READY = "Ctrl-C here stops everything"


def fresh_copy(dest: Path) -> Path:
    listing = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listing.decode().split("\0")):
        src = REPO / name
        if not src.is_symlink() and not src.exists():
            continue  # deleted in the working tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), target)
        else:
            shutil.copy2(src, target)
    return dest


class Terminal:
    """A child process on a pseudo-terminal; everything it prints is collected."""

    def __init__(self, argv: list[str], cwd: Path) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: its own session, the pty as controlling terminal
            os.chdir(cwd)
            os.execvp(argv[0], argv)
        self.output = bytearray()
        self.exit_code: int | None = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:
                return
            if not data:
                return
            self.output += data

    @property
    def text(self) -> str:
        return self.output.decode(errors="replace").replace("\r\n", "\n")

    def ctrl_c(self) -> None:
        os.write(self.fd, b"\x03")

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.reader.join(5)
                self.exit_code = os.waitstatus_to_exitcode(status)
                return self.exit_code
            time.sleep(0.2)
        os.killpg(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"the try-out did not stop in {timeout} s:\n{self.text[-3000:]}")


@pytest.fixture
def tryout(tmp_path: Path) -> Iterator[Terminal]:
    clone = fresh_copy(tmp_path / "cdi-py")
    term = Terminal(["bash", "scripts/tryout.sh", "--image-port", "0"], clone)
    try:
        yield term
    finally:
        if term.exit_code is None:  # the test failed before stopping it: still clean up
            term.ctrl_c()
            term.wait(90)


def leftovers(state: Path, clone: Path) -> list[str]:
    """Mounts, loop devices and processes that still refer to the try-out's paths."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        found += [f"mount {ln.split()[4]}" for ln in fh if str(state) in ln or str(clone) in ln]
    loops = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=True).stdout
    found += [f"loop {ln}" for ln in loops.splitlines() if str(state) in ln]
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = Path(f"/proc/{entry}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if str(clone) in cmdline or str(state) in cmdline or str(state) in environ:
            found.append(f"process {entry}: {cmdline[:200]}")
    return found


def test_tryout_from_a_fresh_copy_runs_its_example_and_ctrl_c_leaves_nothing_behind(
    tryout: Terminal, tmp_path: Path
) -> None:
    wait_until(lambda: READY in tryout.text, "the try-out to print its instructions", 540, 1)
    out = tryout.text
    state = Path(re.search(r"^kubeconfig: (\S+)$", out, re.M).group(1)).parent  # type: ignore[union-attr]
    assert state.is_dir()
    # Paste what it printed, up to the watch (which would not return), into a shell.
    pasted = out[out.index("export KUBECONFIG=") : out.index("kubectl get dv example-import-dv -w")]
    shell = subprocess.run(["bash", "-c", pasted], capture_output=True, text=True, check=False)
    assert shell.returncode == 0, shell.stderr
    assert "datavolume.cdi.kubevirt.io/example-import-dv created" in shell.stdout, shell.stdout
    assert re.search(r"cdi-controller-\S+\s+1/1\s+Running", shell.stdout), shell.stdout

    def phase() -> str | None:
        query = (
            pasted.split("\n", 1)[0]
            + "\n"
            + ("kubectl get dv example-import-dv -o jsonpath='{.status.phase}'")
        )
        got = subprocess.run(["bash", "-c", query], capture_output=True, text=True).stdout
        return got if got in ("Succeeded", "Failed") else None

    assert wait_until(phase, "the example DataVolume to finish", 120, 1) == "Succeeded"

    tryout.ctrl_c()
    assert tryout.wait(90) == 0, tryout.text[-3000:]
    assert "cdi-py try-out: stopped" in tryout.text
    assert not state.exists()
    assert leftovers(state, tmp_path / "cdi-py") == []
