"""A VM for the test node: the launcher image boots a real kernel on the pod's disk.

The volume handoff is only proven when something that is not ours reads the disk the way a VM
does. So the testkit node maps the launcher image (``images.yaml``: ``*vm-launcher*``) to
``python -m testkit.vm launch``, which runs ``qemu-system-x86_64`` (TCG, no KVM needed) with:

- Debian's kernel (``linux-image-amd64``, from ``/boot``) and an initramfs built here from
  ``busybox-static`` plus the few kernel modules a virtio disk with ext4 needs (taken from
  ``/lib/modules`` with their dependencies from ``modules.dep``). ``scripts/setup.sh --test``
  installs the packages. The initramfs is built once and cached outside the tree
  (``~/.cache/cdi-py/vm/<hash>/``, ``$XDG_CACHE_HOME`` honoured; the hash covers the kernel
  release, busybox and the init script), under a lock, so concurrent launches share it;
- the pod's volume as a read-only virtio disk: ``disk.img`` of a filesystem volume (the path
  names the file or its directory) or the block device itself, raw, as KubeVirt attaches it.

The guest's ``/init`` mounts the disk read-only and prints the marker file between two fixed
lines on the serial console (the launcher's stdout, so the pod log); the launcher copies what
is between them to the termination message and exits 0, or exits 1 when the guest printed
none (no disk, not ext4, no marker). ``python -m testkit.vm build`` builds the initramfs ahead.
"""

from __future__ import annotations

import argparse
import fcntl
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

BUSYBOX = Path("/bin/busybox")
BEGIN = "CDI-VM-MARKER-BEGIN"
END = "CDI-VM-MARKER-END"
# The modules a virtio-pci disk holding ext4 needs on Debian's kernel (dependencies added).
ROOT_MODULES = ("virtio_pci", "virtio_blk", "crc32c_generic", "ext4")
BOOT_TIMEOUT = 180.0

INIT = f"""#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod /modules/$m 2>/dev/null; done
i=0
while [ ! -b /dev/vda ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
marker=$(sed -n 's/.*cdi.marker=\\([^ ]*\\).*/\\1/p' /proc/cmdline)
if mount -t ext4 -o ro,noload /dev/vda /mnt; then
  echo {BEGIN}
  cat "/mnt/$marker"
  echo {END}
  umount /mnt
else
  echo "no ext4 filesystem on /dev/vda"
fi
poweroff -f
"""


class VmError(RuntimeError):
    """The VM cannot be built or started here (missing packages, no disk)."""


@dataclass(frozen=True)
class Boot:
    kernel: Path
    initramfs: Path


def kernel_release(boot: Path = Path("/boot"), modules: Path = Path("/lib/modules")) -> str:
    """The newest installed kernel that has its modules (the initramfs needs them)."""
    releases = [k.name.removeprefix("vmlinuz-") for k in boot.glob("vmlinuz-*")]
    usable = [r for r in releases if (modules / r / "modules.dep").exists()]
    if not usable:
        raise VmError("no kernel in /boot: run scripts/setup.sh --test (linux-image-amd64)")
    return max(usable, key=_version_key)


def _version_key(release: str) -> list[tuple[int, int | str]]:
    return [(0, int(n)) if n.isdigit() else (1, n) for n in re.split(r"[.-]", release)]


def module_closure(release: str, roots: tuple[str, ...] = ROOT_MODULES) -> list[str]:
    """Module paths (relative to /lib/modules/<release>) of ``roots`` and what they depend
    on, dependencies first."""
    base = Path("/lib/modules") / release
    deps: dict[str, list[str]] = {}
    for line in (base / "modules.dep").read_text().splitlines():
        mod, _, rest = line.partition(":")
        deps[mod] = rest.split()
    by_name = {Path(m).name.split(".ko")[0].replace("-", "_"): m for m in deps}
    order: list[str] = []

    def visit(mod: str) -> None:
        if mod in order:
            return
        for dep in deps.get(mod, []):
            visit(dep)
        order.append(mod)

    for root in roots:
        if root not in by_name:
            raise VmError(f"kernel module {root} not found for {release}")
        visit(by_name[root])
    return order


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cdi-py" / "vm"


def build_key(release: str) -> str:
    if not BUSYBOX.exists():
        raise VmError("no /bin/busybox: run scripts/setup.sh --test (busybox-static)")
    digest = hashlib.sha256(f"{release}\n{INIT}\n".encode())
    digest.update(hashlib.sha256(BUSYBOX.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _write_initramfs(release: str, out: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="cdi-vm-") as tmp:
        root = Path(tmp)
        for d in ("bin", "proc", "sys", "dev", "mnt", "modules"):
            (root / d).mkdir()
        shutil.copy2(BUSYBOX, root / "bin" / "busybox")
        (root / "init").write_text(INIT)
        (root / "init").chmod(0o755)
        names = []
        for mod in module_closure(release):
            name = Path(mod).name
            shutil.copy2(Path("/lib/modules") / release / mod, root / "modules" / name)
            names.append(name)
        (root / "modules.order").write_text("\n".join(names) + "\n")
        files = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
        cpio = subprocess.run(
            ["cpio", "--quiet", "-o", "-H", "newc", "--owner=0:0"],
            input="\n".join(files).encode(),
            cwd=root,
            capture_output=True,
            check=True,
        ).stdout
        out.write_bytes(gzip.compress(cpio, compresslevel=6))


def build(cache: Path | None = None) -> Boot:
    """The kernel and the (cached) initramfs; built under a lock when missing."""
    release = kernel_release()
    kernel = Path("/boot") / f"vmlinuz-{release}"
    where = (cache or cache_root()) / build_key(release)
    image = where / "initramfs.gz"
    if image.exists():
        return Boot(kernel, image)
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not image.exists():
            partial = where / "initramfs.gz.partial"
            _write_initramfs(release, partial)
            partial.rename(image)
    return Boot(kernel, image)


def disk_path(path: str) -> str:
    """The raw disk of a pod volume: a block device, a file, or ``disk.img`` in a directory."""
    p = Path(path)
    if p.is_dir():
        p = p / "disk.img"
    if not p.exists():
        raise VmError(f"no disk at {p}")
    return str(p)


def qemu_argv(boot: Boot, disk: str, marker: str, memory_mib: int = 256) -> list[str]:
    return [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-cpu",
        "max",
        "-m",
        str(memory_mib),
        "-nographic",
        "-nodefaults",
        "-no-reboot",
        "-serial",
        "stdio",
        "-kernel",
        str(boot.kernel),
        "-initrd",
        str(boot.initramfs),
        "-append",
        f"console=ttyS0 panic=-1 quiet loglevel=3 cdi.marker={marker}",
        "-drive",
        f"file={disk},format=raw,if=virtio,readonly=on,cache=none,aio=threads",
    ]


def between_markers(console: str) -> str | None:
    """The text the guest printed between the marker lines (terminal escapes may precede
    them on the serial console)."""
    found = re.search(rf"{BEGIN}\r?\n(.*?)\r?\n{END}", console, re.S)
    return found.group(1).replace("\r\n", "\n") if found else None


def launch(disk: str, marker: str, termination_log: Path, timeout: float) -> int:
    boot = build()
    argv = qemu_argv(boot, disk_path(disk), marker)
    print("launching:", " ".join(argv), flush=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    console: list[str] = []
    try:
        for line in proc.stdout:
            console.append(line)
            sys.stdout.write(line)
            sys.stdout.flush()
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
    text = between_markers("".join(console))
    if text is None:
        termination_log.write_text("the guest printed no marker\n")
        return 1
    termination_log.write_text(text + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find) the cached initramfs and print its path")
    run = sub.add_parser("launch", help="boot the VM on a disk and print the marker file")
    run.add_argument("--disk", required=True, help="block device, disk file or its directory")
    run.add_argument("--marker", default="marker.txt", help="file on the disk's filesystem")
    run.add_argument("--termination-log", type=Path, default=Path("/dev/termination-log"))
    run.add_argument("--timeout", type=float, default=BOOT_TIMEOUT)
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(build().initramfs)
            return 0
        return launch(args.disk, args.marker, args.termination_log, args.timeout)
    except VmError as exc:
        print(f"vm: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
