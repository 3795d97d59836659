"""Opening files inside a tenant's volume without letting the volume redirect us.

Everything in a volume may have been put there by the tenant: an earlier pod, an archive, a
previous attempt. A ``disk.img``, scratch file, checkpoint or ``.cdi-scratch`` folder planted as
a symlink would make a plain ``open`` write wherever it points (another file in the pod, a
mounted Secret); a FIFO would make ``open(O_WRONLY)`` hang. So files we create are created
fresh: whatever sits at the name is removed, and the new file is made with
``O_CREAT|O_EXCL|O_NOFOLLOW`` (the kernel refuses to follow a link in the last component, and
``O_EXCL`` refuses anything that reappeared). Files we reopen must be regular files reached
without a link (``O_NOFOLLOW|O_NONBLOCK``, then ``fstat``). Folders we make are real folders,
not links. The volume's mount point itself comes from the kubelet and is trusted.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat

from cdi.api.errors import TargetError

_BASE = os.O_CLOEXEC | os.O_NOFOLLOW


def remove_entry(path: str) -> None:
    """Remove whatever non-directory entry sits at ``path`` (a link is removed, not followed)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISDIR(os.lstat(path).st_mode):
            raise TargetError(f"{path} is a directory, not a file", transient=False)
        os.unlink(path)


def open_fresh(path: str, mode: int = 0o600, flags: int = os.O_WRONLY) -> int:
    """Create ``path`` as a new, empty regular file, replacing whatever had that name."""
    remove_entry(path)
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL | _BASE, mode)
    except FileExistsError as exc:  # someone raced us to the name: not ours to write
        raise TargetError(f"{path} reappeared while it was being created", transient=False) from exc


def open_regular(path: str, flags: int = os.O_RDONLY) -> int:
    """Open an existing regular file that is not reached through a symlink."""
    try:
        fd = os.open(path, flags | _BASE | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # a symlink; a FIFO without a reader
            raise TargetError(f"{path} is not a regular file", transient=False) from exc
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TargetError(f"{path} is not a regular file", transient=False)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    return fd


def ensure_dir(path: str, mode: int = 0o700) -> str:
    """A real directory at ``path`` (made if missing; a link or file there is replaced)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        os.unlink(path)  # a planted link or file: never follow it
        st = None
    if st is None:
        os.mkdir(path, mode)
    return path
