"""Node pull: the containerDisk's one ``disk/`` file, read from the side container's root.

With ``pullMethod: node`` the kubelet pulled the image and runs it as the pod's ``server``
container with ``cdi-holder`` as its command (``importer.holder``); the pod shares one process
namespace, so the holder's root filesystem is visible to us at ``/proc/<pid>/root`` (Kubernetes
documents this for ``shareProcessNamespace``). No registry, no network, no scratch: the file is
a local, seekable, replayable source fed to the same data path as a pod pull's disk bytes
(sniffed: qcow2, vmdk, vdi, raw, ISO, compressed).

The image is tenant-made, and ``/proc/<pid>/root`` is only the start of a path: a symbolic link
met below it resolves in *our* root (an absolute ``disk/disk.img -> /etc/shadow`` would read the
importer's file). So the walk never follows one: ``disk`` is opened with
``O_DIRECTORY|O_NOFOLLOW`` relative to the root's descriptor, its entries are ``lstat``-ed, and
the member is opened with ``O_NOFOLLOW`` relative to ``disk``'s descriptor and checked to be a
regular file with ``fstat`` before one byte is read. CDI's rules and messages hold: exactly one
file (none, several, a directory: ``RegistryImageInvalid``, as for a pod pull); a symbolic link
or any other non-regular member is ``UnsafeImage``.

The image's ``KUBEVIRT_IO_`` variables become labels as with a pod pull: the runtime gave the
holder the image config's environment, which ``/proc/<pid>/environ`` shows. The digest is not
ours to report here: the kubelet's ``imageID`` of the ``server`` container is (the controller
copies it).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import stat
from collections.abc import AsyncIterator
from dataclasses import dataclass

from cdi.api.errors import SourceUnavailable, UnsafeImage
from datapath.sources import SourceInfo
from datapath.streams import CHUNK_SIZE
from importer.holder import ReadyWait, wait_ready
from importer.registry.errors import RegistryImageInvalid
from importer.registry.layers import DISK_DIR, EMPTY, SEVERAL, SUBDIR
from importer.registry.manifest import config_labels
from importer.sources.registry_options import NodePullOptions

log = logging.getLogger("importer.containerdisk")
MAX_ENVIRON_BYTES = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class DiskFile:
    """The open disk file: its descriptor, name under ``disk/`` and status."""

    fd: int
    name: str
    size: int
    mtime_ns: int


def _only_member(disk_fd: int) -> str:
    """The one entry of ``disk/``, judged without following anything."""
    files: list[str] = []
    for name in sorted(os.listdir(disk_fd)):
        st = os.stat(name, dir_fd=disk_fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            raise RegistryImageInvalid(SUBDIR)
        files.append(name)
    if not files:
        raise RegistryImageInvalid(EMPTY)
    if len(files) > 1:
        listed = ", ".join(f"{DISK_DIR}/{n}" for n in files[:4])
        raise RegistryImageInvalid(f"{SEVERAL}: {listed}")
    return files[0]


def _refuse(name: str, mode: int) -> UnsafeImage:
    kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
    return UnsafeImage(
        f"{DISK_DIR}/{name} in the containerDisk is {kind}: only a regular file is imported"
    )


def _open_member(disk_fd: int, name: str) -> DiskFile:
    st = os.stat(name, dir_fd=disk_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(name, st.st_mode)
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=disk_fd)
    except OSError as exc:  # ELOOP: it became a link meanwhile
        if exc.errno == errno.ELOOP:
            raise _refuse(name, stat.S_IFLNK) from exc
        raise SourceUnavailable(f"cannot open {DISK_DIR}/{name}: {exc.strerror}") from exc
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise _refuse(name, st.st_mode)
    return DiskFile(fd, name, st.st_size, st.st_mtime_ns)


def open_disk(root: str) -> DiskFile:
    """The regular file that is the only entry of ``<root>/disk/``, open for reading, reached
    without following any symbolic link below ``root`` (``root`` itself, e.g.
    ``/proc/<pid>/root``, is followed)."""
    try:
        root_fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise SourceUnavailable(f"cannot open the containerDisk's root: {exc.strerror}") from exc
    try:
        try:
            disk_fd = os.open(DISK_DIR, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
        except FileNotFoundError as exc:
            raise RegistryImageInvalid(EMPTY) from exc
        except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where the folder should be
            raise UnsafeImage(
                f"{DISK_DIR} in the containerDisk is not a directory (a link or a file)"
            ) from exc
        try:
            return _open_member(disk_fd, _only_member(disk_fd))
        finally:
            os.close(disk_fd)
    finally:
        os.close(root_fd)


def environ_labels(proc_dir: str) -> dict[str, str]:
    """PVC labels from the ``KUBEVIRT_IO_`` variables of a process's environment."""
    try:
        with open(os.path.join(proc_dir, "environ"), "rb") as fh:
            data = fh.read(MAX_ENVIRON_BYTES)
    except OSError as exc:
        log.warning("cannot read the containerDisk's environment: %s", exc.strerror)
        return {}
    env = [item.decode("utf-8", "replace") for item in data.split(b"\0") if item]
    return config_labels({"config": {"Env": env}})


class NodePullSource:
    """The disk file of the containerDisk the kubelet runs beside us."""

    def __init__(self, options: NodePullOptions) -> None:
        self.options = options
        self.disk: DiskFile | None = None
        self._labels: dict[str, str] = {}

    @property
    def labels(self) -> dict[str, str]:
        return dict(self._labels)

    @property
    def digest(self) -> None:
        """None: the digest the node pulled is the kubelet's ``imageID``, which the controller
        reads; never one this pod reports."""
        return None

    async def probe(self) -> SourceInfo:
        if self.disk is None:
            self.disk = await asyncio.to_thread(self._find)
        disk = self.disk
        return SourceInfo(
            size=disk.size,
            ranges=True,
            validator=f"node:{disk.size}:{disk.mtime_ns}",
            replayable=True,
        )

    def _find(self) -> DiskFile:
        wait = ReadyWait(self.options.ready_timeout)
        pid = wait_ready(self.options.shared_dir, wait)
        proc_dir = os.path.join(self.options.proc, str(pid))
        disk = open_disk(os.path.join(proc_dir, "root"))
        self._labels = environ_labels(proc_dir)
        log.info(
            "node pull: reading %s/%s (%d bytes) of pid %d", DISK_DIR, disk.name, disk.size, pid
        )
        return disk

    async def stream(self, start: int = 0) -> AsyncIterator[bytes]:
        if self.disk is None:
            await self.probe()
        assert self.disk is not None
        fd, offset = self.disk.fd, start
        while chunk := await asyncio.to_thread(os.pread, fd, CHUNK_SIZE, offset):
            offset += len(chunk)
            yield chunk

    async def close(self) -> None:
        if self.disk is not None:
            os.close(self.disk.fd)
            self.disk = None
