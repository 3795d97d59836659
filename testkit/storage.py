"""Real volumes on this machine: sparse image files, loop devices and ext4 filesystems.

The provisioner builds every PersistentVolume from these steps so that capacity, filesystem
overhead and block-device sizes in tests are the kernel's, not a simulation. Each helper shells
out to util-linux / e2fsprogs (installed by scripts/setup.sh) and raises ``StorageError`` with
the tool's stderr when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


class StorageError(RuntimeError):
    """A storage tool (losetup, mkfs, mount, ...) failed."""


def run(*argv: str) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise StorageError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def create_sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


def sparse_copy(src: Path, dst: Path) -> None:
    """Copy an image keeping its holes (a clone costs what the source actually uses)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    run("cp", "--sparse=always", str(src), str(dst))


def copy_consistent(src: Path, dst: Path, mounted_at: Path | None) -> None:
    """Sparse-copy the image of a volume in use: a filesystem volume (``mounted_at``) is frozen
    while copying, a block volume's loop devices are flushed first, so the copy holds every
    write completed before the call (a clone, or a snapshot's point in time). The copy goes to
    a temporary name first: ``dst`` exists only once it is whole."""
    tmp = dst.with_name(f".{dst.name}.partial")
    if mounted_at is None:
        for device in loop_devices_of(src):
            run("blockdev", "--flushbufs", device)
        sparse_copy(src, tmp)
    else:
        run("fsfreeze", "--freeze", str(mounted_at))
        try:
            sparse_copy(src, tmp)
        finally:
            run("fsfreeze", "--unfreeze", str(mounted_at))
    tmp.replace(dst)


def set_mtime_ns(path: Path, ns: int) -> None:
    os.utime(path, ns=(ns, ns))


def make_ext4(image: Path) -> None:
    # -m 0: no blocks reserved for root, so the usable size is close to the requested size.
    run(
        "mkfs.ext4",
        "-q",
        "-F",
        "-m",
        "0",
        "-E",
        "lazy_itable_init=1,lazy_journal_init=1",
        str(image),
    )


def attach_loop(image: Path) -> str:
    return run("losetup", "--find", "--show", str(image)).strip()


def loop_devices_of(image: Path) -> list[str]:
    """Loop devices currently backed by ``image``."""
    out = run("losetup", "--associated", str(image))
    return [line.split(":", 1)[0] for line in out.splitlines() if line.strip()]


def detach_loop(device: str) -> None:
    run("losetup", "--detach", device)


def mount(device: str, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    run("mount", device, str(target))
    os.chmod(target, 0o777)  # any pod user may write, as with most dynamic provisioners


def unmount(target: Path) -> None:
    try:
        run("umount", str(target))
    except StorageError:
        run("umount", "--lazy", str(target))


def is_mountpoint(path: Path) -> bool:
    return str(path) in mountpoints_under(path)


def mountpoints_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` in this mount namespace, deepest first."""
    prefix = str(root).rstrip("/")
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=len, reverse=True)


def grow(image: Path, size: int, device: str | None) -> None:
    """Grow an image file in place and tell its loop device (if any) about the new size."""
    with open(image, "r+b") as f:
        f.truncate(size)
    if device:
        run("losetup", "--set-capacity", device)


def check_ext4(target: str) -> None:
    """``e2fsck -f -y``: exit 1 means it fixed something (e.g. replayed a journal), fine."""
    proc = subprocess.run(
        ["e2fsck", "-f", "-y", target], capture_output=True, text=True, check=False
    )
    if proc.returncode not in (0, 1):
        raise StorageError(f"e2fsck {target}: exit {proc.returncode}: {proc.stdout.strip()}")


def resize_ext4_offline(target: str) -> None:
    """Grow an unmounted ext4 (image file or device) to fill its container."""
    check_ext4(target)
    run("resize2fs", target)


def resize_ext4_online(device: str) -> bool:
    """Grow a mounted ext4; False where the kernel refuses (no CAP_SYS_RESOURCE, as in some
    sandboxes), so the caller can fall back to an offline resize."""
    proc = subprocess.run(["resize2fs", device], capture_output=True, text=True, check=False)
    return proc.returncode == 0


def release_all_under(root: Path) -> None:
    """Unmount everything below ``root`` and detach loop devices backed by files below it.

    The harness calls this at teardown so no mount or loop device outlives a cluster, even if
    the provisioner died before it could clean up.
    """
    for point in mountpoints_under(root):
        try:
            unmount(Path(point))
        except StorageError:
            pass
    try:
        listing = json.loads(run("losetup", "--list", "--json") or "{}")
    except (StorageError, ValueError):
        return
    prefix = str(root).rstrip("/") + "/"
    for dev in listing.get("loopdevices", []):
        back = str(dev.get("back-file") or "")
        if back.startswith(prefix):
            try:
                detach_loop(str(dev["name"]))
            except StorageError:
                pass
