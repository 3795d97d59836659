"""What a worker was told to fill, and how it is opened and sized.

Opening is separate from writing (``writer``) because the phase machine opens, closes and
reopens the target around qemu-img, and because sizing follows CDI's rules (usable space after
the filesystem overhead, a block device's own size), which the writer does not need to know.
These calls block (open, ioctl, fstatvfs): the processor runs them off the event loop.
"""

from __future__ import annotations

import fcntl
import math
import os
import stat
import struct
from dataclasses import dataclass

from cdi.api.errors import InvalidConfig, TargetError
from datapath.target.nofollow import open_fresh, open_regular

_BLKGETSIZE64 = 0x80081272


@dataclass(frozen=True)
class TargetSpec:
    """What the worker was told to fill."""

    path: str
    block: bool
    size: int | None = None  # requested bytes; None = the image's own size (CLI only)
    filesystem_overhead: float = 0.0
    preallocate: bool = False
    zeroed: bool = False  # a block device known to read zeros (e.g. freshly provisioned)
    # (uid, gid) a finished disk.img is given when the process may chown (root): a pod's
    # runAsUser/fsGroup 107 leaves it so on a kubelet, and a VM runtime expects it.
    owner: tuple[int, int] | None = None


def block_device_size(fd: int) -> int:
    buf = fcntl.ioctl(fd, _BLKGETSIZE64, b"\x00" * 8)
    return int(struct.unpack("<Q", buf)[0])


def usable_space(available: int, overhead: float) -> int:
    """CDI's GetUsableSpace: room for the image once the filesystem takes its share, rounded
    down to MiB. The inverse of the renderer's ``size / (1 - overhead)`` PVC request."""
    if not overhead:
        return available
    mib = 1024 * 1024
    return (math.ceil((1 - overhead) * available) // mib) * mib


def open_target(spec: TargetSpec, *, truncate: bool = True) -> tuple[int, int | None]:
    """Open the target for writing; return (fd, capacity). A file is truncated to zero first,
    so anything not written is a hole and nothing from an earlier attempt survives (unless
    an interrupted import is being resumed)."""
    try:
        if spec.block:
            st = os.stat(spec.path)
            if not stat.S_ISBLK(st.st_mode):
                raise InvalidConfig(f"{spec.path} is not a block device")
            fd = os.open(spec.path, os.O_WRONLY | os.O_CLOEXEC)
            return fd, block_device_size(fd)
        # Never through a link or onto a FIFO a tenant planted at the name (nofollow.py).
        fd = open_fresh(spec.path, 0o660) if truncate else open_regular(spec.path, os.O_WRONLY)
    except FileNotFoundError as exc:
        raise InvalidConfig(f"target {spec.path} does not exist: {exc.strerror}") from exc
    except OSError as exc:
        raise TargetError(f"cannot open target {spec.path}: {exc.strerror}") from exc
    if spec.size is None:
        return fd, None
    # The claim was sized as image / (1 - overhead): the image gets the claim minus the
    # overhead, and never more than the filesystem really has free (statfs already excludes
    # its metadata, so the overhead is not taken from it a second time, unlike CDI).
    usable = usable_space(spec.size, spec.filesystem_overhead)
    if spec.filesystem_overhead:
        vfs = os.fstatvfs(fd)
        usable = min(usable, (vfs.f_bavail * vfs.f_frsize) // (1 << 20) * (1 << 20))
    return fd, usable
