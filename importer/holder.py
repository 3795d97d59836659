"""The importer's half of the node-pull handshake with ``cdi-holder`` (``deploy/images/holder``).

With ``pullMethod: node`` the kubelet pulls the containerDisk and runs it as the pod's
``server`` container, whose command is the static ``cdi-holder`` from the shared emptyDir
(``/shared``). Three files there make the protocol, each written by one side only:

- ``cdi-holder``: copied from the importer image by the init container (``python -m importer
  install-holder``, ``install_holder``), written under a temporary name and renamed, mode 0555;
- ``ready``: the holder's pid, renamed into place by the holder when it starts;
- ``importer.lock``: the importer's lock (``ImporterLock``), taken under a temporary name and
  renamed, so the holder only ever sees a held lock; the kernel drops it when the importer dies,
  however it dies, and the holder then exits, so the pod always ends;
- ``done``: created by the importer when it is finished, successful or not (``signal_done``).

``wait_ready`` reads the pid with a bounded wait; the source (``importer.sources.containerdisk``)
then reads ``/proc/<pid>/root/disk/``. Nothing here trusts the files' content beyond a pid
that must name a live process.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from cdi.api.errors import InvalidConfig
from importer.registry.errors import ImagePullFailed

HOLDER_NAME = "cdi-holder"
HOLDER_BINARY = "/usr/local/libexec/cdi-holder"  # in the importer image (Containerfile)
HOLDER_BINARY_ENV = "IMPORTER_HOLDER_BINARY"  # another place for it (the test node)
READY_NAME = "ready"
DONE_NAME = "done"
LOCK_NAME = "importer.lock"
MAX_PID_BYTES = 32


def install_holder(source: str, dest: str) -> None:
    """Copy the holder binary to ``dest`` (the init container's whole job)."""
    folder, name = os.path.split(dest)
    tmp = os.path.join(folder, f".{name}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as src:
        fd = os.open(tmp, flags, 0o555)
        with os.fdopen(fd, "wb") as out:
            while piece := src.read(1 << 20):
                out.write(piece)
    os.replace(tmp, dest)


class ImporterLock:
    """The lock whose release tells the holder the importer is gone."""

    def __init__(self, shared_dir: str) -> None:
        path = os.path.join(shared_dir, LOCK_NAME)
        tmp = os.path.join(shared_dir, f".{LOCK_NAME}.{os.getpid()}")
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.fd = os.open(tmp, flags, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        os.replace(tmp, path)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def signal_done(shared_dir: str) -> None:
    """Tell the holder to exit (idempotent)."""
    fd = os.open(
        os.path.join(shared_dir, DONE_NAME), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644
    )
    os.close(fd)


@dataclass(frozen=True)
class ReadyWait:
    """How long to wait for the holder's pid, and how often to look."""

    timeout: float = 600.0
    interval: float = 0.2


def read_pid(shared_dir: str) -> int | None:
    """The pid in ``ready``, or None while there is none (or only part of one)."""
    try:
        fd = os.open(os.path.join(shared_dir, READY_NAME), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        text = os.read(fd, MAX_PID_BYTES + 1)
    finally:
        os.close(fd)
    value = text.strip()
    if len(text) > MAX_PID_BYTES or not value.isdigit() or int(value) < 1:
        raise InvalidConfig(f"{READY_NAME} in the shared volume does not hold a process id")
    return int(value)


def wait_ready(
    shared_dir: str,
    wait: ReadyWait,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """The holder's pid once it is written and names a live process (blocking; run it on a
    thread). Past ``wait.timeout``: ``ImagePullFailed`` (transient: the image was not pulled,
    or not yet; the controller tries again with a new pod)."""
    deadline = clock() + wait.timeout
    while True:
        pid = read_pid(shared_dir)
        if pid is not None:
            if not os.path.isdir(f"/proc/{pid}"):
                raise InvalidConfig(f"the containerDisk holder (pid {pid}) is not running")
            return pid
        if clock() >= deadline:
            raise ImagePullFailed(
                f"the containerDisk container did not start within {wait.timeout:.0f}s"
            )
        sleep(wait.interval)
