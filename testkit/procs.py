"""Child processes of the harness, each in its own process group with its log in a file.

Every component (etcd, the Kubernetes servers, the node agent, the provisioner) is started with
``start_new_session=True`` so that stopping it signals its whole group: nothing it forked is
left behind. Stopping is SIGTERM, a grace period, then SIGKILL. Each also gets a parent-death
signal (util-linux ``setpriv --pdeathsig``), so a harness that is itself killed (a CI timeout,
a SIGKILL) still takes its cluster down with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


class ComponentDied(RuntimeError):
    """A component exited while the harness still needed it."""


class ManagedProcess:
    """One long-running component started by the harness."""

    def __init__(
        self, name: str, argv: list[str], log_path: Path, *, env: dict[str, str] | None = None
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            ["setpriv", "--pdeathsig", "TERM", "--", *argv],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None:
            raise ComponentDied(f"{self.name} exited with {code}; log tail:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL what is left."""
        _signal_group(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(self.proc.pid, 5.0)
        self._log.close()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(pgid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def kill_processes_with_env(name: str, value: str) -> int:
    """SIGKILL every process whose environment holds ``name=value``; returns how many.

    The node agent marks each container with such a variable, so a teardown can find a
    container even if it left its process group or outlived a crashed agent.
    """
    needle = f"{name}={value}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed
