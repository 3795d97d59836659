"""Real image pulls for the testkit node: an image its map does not know is pulled and run.

The node maps the product's images to local commands (``testkit.images``). A tenant's image,
such as the containerDisk of a registry node pull, has no local stand-in: it is pulled the way
a kubelet's runtime pulls it, with real tools from Debian's packages, and its command runs
chrooted in the unpacked root filesystem:

1. ``skopeo inspect --raw docker://<ref>``: the manifest (or index) the tag names now; its
   sha256 is the digest the node reports as ``imageID`` (``<repo>@sha256:<hex>``, as a
   kubelet reports the repo digest);
2. ``skopeo copy docker://<repo>@<digest> oci:<cache>/layout:<hex>`` (the node's platform is
   picked from an index, as a runtime picks it), then ``umoci unpack`` into
   ``<cache>/bundles/<hex>``, once per digest;
3. the container's command (the pod's, else the image config's ENTRYPOINT and CMD) runs as
   ``env PATH=<image PATH> unshare --root=<rootfs> --wd=<WORKDIR> -- argv`` inside the node's
   usual mount-namespace wrapper, with the pod's volume mounts bound *inside* the rootfs
   (``/shared`` at ``<rootfs>/shared``). The wrapper itself keeps the node's PATH. The pod shares
   the host's pid namespace (every testkit container does), so ``/proc/<pid>/root`` of the
   chrooted process is its root filesystem, as ``shareProcessNamespace`` makes it in a pod.

Registries on loopback (127.0.0.0/8, ``localhost``) and those passed as ``insecure`` are used
without TLS verification (and over plain http), as Docker's default ``insecure-registries`` and
a ``registries.conf`` entry with ``insecure = true`` would; no other registry is contacted (the
tests talk to loopback only), so an image from one is an ``ErrImagePull``. Pulls run on a
thread: the node loop sees ``ContainerCreating`` "Pulling image" meanwhile (and starts the
pod's next container only after it), then ``ErrImagePull`` with the tool's message for a
failure, then ``ImagePullBackOff`` until the back-off has passed, as a kubelet reports them.
``imagePullPolicy: Always`` resolves the tag again at every container start (a DataImportCron's
node-pull poller must see a re-pushed tag); the other policies behave as ``IfNotPresent`` (a
tag is resolved once per node run).

``holder_binary`` compiles the node-pull holder (``deploy/images/holder/holder.c``) with the
machine's C compiler, once per source version (cached), for the importer image's stand-in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.containers import LaunchSpec
from testkit.images import REPO_ROOT, Image, strip_reference
from testkit.podenv import BASE_PATH, NotReady

HOLDER_SOURCE = REPO_ROOT / "deploy/images/holder/holder.c"
HOLDER_CACHE = Path.home() / ".cache/cdi-py/holder"
PULL_TIMEOUT = 900.0
BACKOFF_START, BACKOFF_MAX = 2.0, 20.0


def holder_binary(cache: Path = HOLDER_CACHE, source: Path = HOLDER_SOURCE) -> Path:
    """The static holder, compiled once per version of its source."""
    tag = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    binary = cache / tag / "cdi-holder"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    tmp = binary.with_name(f".cdi-holder.{os.getpid()}")
    argv = ["cc", "-static", "-Os", "-Wall", "-o", str(tmp), str(source)]
    subprocess.run(argv, check=True, capture_output=True, timeout=120)
    tmp.replace(binary)
    return binary


@dataclass(frozen=True)
class PulledImage:
    image: Image  # ENTRYPOINT, CMD, Env, WorkingDir of the image config
    rootfs: Path
    image_id: str  # <repo>@sha256:<manifest digest>


class PullFailed(Exception):
    """skopeo or umoci refused; the message is the kubelet-style one."""


def registry_host(ref: str) -> str:
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name.strip("[]") == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _run(argv: list[str], ref: str) -> bytes:
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=PULL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise PullFailed(f'Failed to pull image "{ref}": timed out') from exc
    if proc.returncode:
        lines = proc.stderr.decode(errors="replace").strip().splitlines() or ["failed"]
        raise PullFailed(f'Failed to pull image "{ref}": {lines[-1][:400]}')
    return proc.stdout


def _config_image(layout: Path, tag: str) -> Image:
    """The image config of ``tag`` in an OCI layout, as the node map's ``Image``."""
    index = json.loads((layout / "index.json").read_text())
    blobs = layout / "blobs" / "sha256"
    for entry in index["manifests"]:
        if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            manifest = json.loads((blobs / entry["digest"].split(":", 1)[1]).read_text())
            break
    else:
        raise PullFailed(f"pulled image {tag} is missing from the node's layout")
    config: dict[str, Any] = json.loads(
        (blobs / manifest["config"]["digest"].split(":", 1)[1]).read_text()
    )
    conf = config.get("config") or {}
    pairs = (str(item).partition("=") for item in conf.get("Env") or [])
    env = {name: value for name, sep, value in pairs if sep}
    return Image(
        entrypoint=tuple(conf.get("Entrypoint") or ()),
        cmd=tuple(conf.get("Cmd") or ()),
        env=env,
        workdir=conf.get("WorkingDir") or "/",
    )


def _backoff(ref: str, error: str) -> str:
    """The kubelet's back-off message (1.30+ carries the last error)."""
    return f'Back-off pulling image "{ref}": ErrImagePull: {error}'


class ImageRuntime:
    """Pulls, unpacks and caches images under ``cache``; one instance per node."""

    def __init__(self, cache: Path, insecure: tuple[str, ...] = ()) -> None:
        self.cache = cache
        self.insecure = insecure
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="pull")
        self._lock = threading.Lock()
        self._pulls: dict[str, Future[PulledImage]] = {}
        self._failed: dict[str, tuple[float, float, str]] = {}  # ref -> until, backoff, message

    def _tls_flag(self, ref: str) -> list[str]:
        host = registry_host(ref)
        return [] if not (loopback(host) or host in self.insecure) else ["--tls-verify=false"]

    def pull(self, ref: str) -> PulledImage:
        """Pull and unpack ``ref`` (blocking)."""
        repo = strip_reference(ref)
        host = registry_host(ref)
        if not (loopback(host) or host in self.insecure):
            # Tests talk to 127.0.0.0/8 only: no pull from the internet, ever.
            raise PullFailed(
                f'Failed to pull image "{ref}": the test node pulls only from loopback '
                "registries and those passed with --insecure-registry"
            )
        raw = _run(["skopeo", "inspect", "--raw", *self._tls_flag(ref), f"docker://{ref}"], ref)
        hexd = hashlib.sha256(raw).hexdigest()
        layout, bundle = self.cache / "layout", self.cache / "bundles" / hexd
        if not bundle.exists():
            self.cache.mkdir(parents=True, exist_ok=True)
            src = f"docker://{repo}@sha256:{hexd}"
            tls = [f"--src-{f.removeprefix('--')}" for f in self._tls_flag(ref)]
            _run(["skopeo", "copy", "-q", *tls, src, f"oci:{layout}:{hexd}"], ref)
            bundle.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=bundle.parent) as work:
                tmp = Path(work) / "b"
                _run(["umoci", "unpack", "--image", f"{layout}:{hexd}", str(tmp)], ref)
                tmp.replace(bundle)
        image = _config_image(layout, hexd)
        return PulledImage(image, bundle / "rootfs", f"{repo}@sha256:{hexd}")

    def get(self, ref: str, always: bool = False) -> PulledImage:
        """The pulled image, or ``NotReady`` with the kubelet's waiting reason. ``always``
        (``imagePullPolicy: Always``): the pull is used for this start only, the next start
        resolves the tag again (unpacked bundles stay cached by digest)."""
        with self._lock:
            failed = self._failed.get(ref)
            future = self._pulls.get(ref)
            if future is None:
                if failed and time.monotonic() < failed[0]:
                    raise NotReady("ImagePullBackOff", _backoff(ref, failed[2]))
                future = self._pulls[ref] = self._pool.submit(self.pull, ref)
        if not future.done():
            if failed:  # a retry: the kubelet keeps showing the back-off meanwhile
                raise NotReady("ImagePullBackOff", _backoff(ref, failed[2]))
            raise NotReady("ContainerCreating", f'Pulling image "{ref}"')
        try:
            pulled = future.result()
        except (PullFailed, OSError, subprocess.SubprocessError) as exc:
            with self._lock:
                self._pulls.pop(ref, None)
                backoff = min(BACKOFF_MAX, failed[1] * 2) if failed else BACKOFF_START
                self._failed[ref] = (time.monotonic() + backoff, backoff, str(exc))
            raise NotReady("ErrImagePull", str(exc)) from exc
        with self._lock:
            self._failed.pop(ref, None)
            if always and self._pulls.get(ref) is future:
                del self._pulls[ref]
        return pulled

    def pulling(self, ref: str) -> bool:
        """A first pull of ``ref`` is under way (a kubelet starts the pod's next container
        only after it)."""
        with self._lock:
            future = self._pulls.get(ref)
            return future is not None and not future.done() and ref not in self._failed

    def contain(self, launch: LaunchSpec, pulled: PulledImage) -> LaunchSpec:
        """``launch`` run chrooted in the image: volumes bound inside its root filesystem."""
        rootfs = pulled.rootfs
        binds = [dataclasses.replace(b, dst=f"{rootfs}/{b.dst.lstrip('/')}") for b in launch.binds]
        image_path = launch.env.get("PATH", BASE_PATH)
        argv = [shutil.which("env") or "/usr/bin/env", f"PATH={image_path}"]
        argv += [shutil.which("unshare") or "/usr/bin/unshare", f"--root={rootfs}"]
        argv += [f"--wd={launch.workdir or '/'}", "--", *launch.argv]
        return dataclasses.replace(
            launch,
            argv=argv,
            env={**launch.env, "PATH": BASE_PATH},
            workdir="/",
            binds=binds,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
