"""What the DataVolume integration tests share: our CRDs installed, test images built by real
qemu-img, a loopback image server, and the product deployed from ``deploy/``.

The product is what a user installs: ``kubectl apply`` of ``crds/`` and ``deploy/`` unchanged
(``testkit.product``), so the controller runs as its Deployment's 2 replicas with Lease leader
election and the webhook is reached through its Service. Tests that crash a component SIGKILL
a replica's container (``Product.kill``) and the node restarts it, as a kubelet would; a test
that needs a controller process of its own starts one from the Deployment's own command and
flags (``ControllerProcess``). Images are served from 127.0.0.1, which pods on the local node
(127.N.x.y) reach directly.
The import network policy refuses loopback by default, so the session's CDIConfig allows
exactly 127.0.0.1/32 (the image server) and names the cluster's pod and service ranges, which
stay refused: the same set-up an operator makes.
"""

from __future__ import annotations

import asyncio
import copy
import os
import random
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.kubeconfig import Identity, write_kubeconfig
from testkit.product import Product, container_argv
from testkit.provisioner import volume_path
from testkit.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
MiB = 1024 * 1024
VIRTUAL = 24 * MiB
CDI_NAMESPACE = "cdi"
DV_API = "/apis/cdi.kubevirt.io/v1beta1"


def run(*cmd: str | Path) -> None:
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed: {proc.stderr}")


# -- CRDs -----------------------------------------------------------------------------------


def install_crds(kube: Kube) -> None:
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    for f in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(f.read_text())
        try:
            kube.create(path, crd)
        except ApiError as e:
            if not e.conflict:
                raise

    def established() -> bool:
        for f in (REPO / "crds").glob("*.yaml"):
            name = yaml.safe_load(f.read_text())["metadata"]["name"]
            conds = kube.get(f"{path}/{name}").get("status", {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                return False
        return True

    wait_until(established, "CDI CRDs established", 30)


CDI_CONFIG = {
    "apiVersion": "cdi.kubevirt.io/v1beta1",
    "kind": "CDIConfig",
    "metadata": {"name": "config"},
    "spec": {"importPolicy": {"allowedSourceCIDRs": ["127.0.0.1/32"]}},
}


def ensure_cdi_config(kube: Kube, cluster_cidrs: list[str]) -> None:
    """The session's CDIConfig policy, whether or not a controller created ``config`` first."""
    config = copy.deepcopy(CDI_CONFIG)
    config["spec"]["importPolicy"]["clusterCIDRs"] = cluster_cidrs
    try:
        kube.create(f"{DV_API}/cdiconfigs", config)
    except ApiError as e:
        if not e.conflict:
            raise
        kube.patch(f"{DV_API}/cdiconfigs/config", {"spec": config["spec"]})


def ensure_namespace(kube: Kube, name: str) -> None:
    try:
        kube.create(
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        )
    except ApiError as e:
        if not e.conflict:
            raise


# -- images ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Images:
    root: Path
    reference: Path  # raw bytes every good image converts to (qemu-img convert -O raw)

    def path(self, name: str) -> Path:
        return self.root / name


def build_images(root: Path) -> Images:
    root.mkdir(parents=True, exist_ok=True)
    base = root / "disk.raw"
    rng = random.Random(11)
    with open(base, "wb") as fh:
        fh.truncate(VIRTUAL)
        for offset in (0, 5 * MiB + 4096, 11 * MiB - 700, VIRTUAL - MiB):
            fh.seek(offset)
            fh.write(rng.randbytes(MiB // 2) + b"cdi-py " * 20000)
    run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", base, root / "disk.qcow2")
    with open(root / "disk.qcow2.xz", "wb") as out:
        subprocess.run(["xz", "-T1", "-1", "-c", str(root / "disk.qcow2")], stdout=out, check=True)
    with open(root / "disk.raw.gz", "wb") as out:
        subprocess.run(["gzip", "-1", "-c", str(base)], stdout=out, check=True)
    reference = root / "reference.raw"
    run("qemu-img", "convert", "-f", "qcow2", "-O", "raw", root / "disk.qcow2", reference)
    # A qcow2 that would read the host's files through a backing file: must be refused.
    run(
        "qemu-img",
        "create",
        "-f",
        "qcow2",
        "-b",
        "/etc/hostname",
        "-F",
        "raw",
        root / "unsafe.qcow2",
        "16M",
    )
    return Images(root, reference)


# -- image server ---------------------------------------------------------------------------


@dataclass
class ImageServer:
    """``/ok/<file>``, ``/slow/<file>`` (``slow_rate`` bytes/s), ``/crawl/<file>`` (a
    sixteenth of that), ``/down/<file>`` (503 always)."""

    root: Path
    slow_rate: int = 3 * MiB
    port: int = 0
    requests: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _runner: web.AppRunner | None = None

    def url(self, mode: str, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}/{name}"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        mode, name = request.match_info["mode"], request.match_info["name"]
        self.requests.append(f"{request.method} {mode}/{name}")
        if mode == "down":
            raise web.HTTPServiceUnavailable(text="try later")
        path = self.root / name
        if not path.is_file():
            raise web.HTTPNotFound(text="no such image")
        size = path.stat().st_size
        resp = web.StreamResponse(headers={"Content-Length": str(size)})
        resp.content_type = "application/octet-stream"
        await resp.prepare(request)
        if request.method == "HEAD":
            return resp
        chunk = 64 * 1024
        with open(path, "rb") as fh:
            while data := fh.read(chunk):
                await resp.write(data)
                if mode in ("slow", "crawl"):
                    rate = self.slow_rate if mode == "slow" else self.slow_rate // 16
                    await asyncio.sleep(len(data) / rate)
        await resp.write_eof()
        return resp

    def start(self) -> ImageServer:
        ready = threading.Event()

        async def main() -> None:
            app = web.Application()
            app.router.add_route("*", "/{mode}/{name}", self._handle)
            self._runner = web.AppRunner(app)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            ready.set()

        def thread() -> None:
            self._loop = asyncio.new_event_loop()
            self._loop.run_until_complete(main())
            self._loop.run_forever()

        threading.Thread(target=thread, daemon=True, name="image-server").start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is not None and self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), loop).result(10)
            loop.call_soon_threadsafe(loop.stop)


# -- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def cdi_crds(kube: Kube, cluster: Cluster) -> None:
    install_crds(kube)
    ensure_namespace(kube, CDI_NAMESPACE)
    ensure_cdi_config(kube, [cluster.pod_cidr, cluster.service_cidr])


@pytest.fixture(scope="session")
def product(cluster: Cluster, cdi_crds: None) -> Product:
    """``crds/`` and ``deploy/`` applied with kubectl, as they are; every Deployment Available
    and the webhook answering through its Service. One per session: every DataVolume test
    shares it (the Deployments run the checkout's code through the node's image map)."""
    return Product.on(cluster).install()


@pytest.fixture(scope="session")
def controller(product: Product) -> Product:
    """The deployed controller (2 replicas, one leading); the name tests have always used."""
    return product


# -- a controller process started by hand -----------------------------------------------------


@dataclass
class ControllerProcess:
    """One more controller, next to the deployed replicas, for a test that needs a process of
    its own (e.g. a standby it stops). Started from the Deployment's own command and flags
    (``container_argv``), plus a kubeconfig (it runs outside a pod) and the test's ``args``,
    which win over the Deployment's (argparse keeps the last). It authenticates as the
    deployed replicas do, as ServiceAccount ``cdi/cdi-controller`` (a TokenRequest): the
    controller tells its own DataVolumes by its own name, so running it as the test's admin
    would take every admin-made DataVolume for the controller's."""

    cluster: Cluster
    log_dir: Path
    args: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> ControllerProcess:
        self.starts += 1
        argv = container_argv("cdi-controller", {"POD_IP": "127.0.0.1"})
        argv += [f"--kubeconfig={self._kubeconfig()}", *self.args]
        with open(self.log_dir / f"controller-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, PYTHONPATH=str(REPO)),
                cwd=REPO,
                start_new_session=True,
            )
        return self

    def _kubeconfig(self) -> Path:
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": 3600}}  # fmt: skip
        answer = self.cluster.kube().create(
            f"/api/v1/namespaces/{CDI_NAMESPACE}/serviceaccounts/cdi-controller/token", request
        )
        user = f"system:serviceaccount:{CDI_NAMESPACE}:cdi-controller"
        identity = Identity(user, str(answer["status"]["token"]))
        path = self.log_dir / "controller.kubeconfig"
        return write_kubeconfig(
            path, self.cluster.server, self.cluster.ca_path.read_bytes(), [identity], user
        )

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, no lease release (a crash)."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode

    def log(self) -> str:
        return "".join(
            p.read_text(errors="replace") for p in sorted(self.log_dir.glob("controller-*.log"))
        )


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> Images:
    return build_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="session")
def image_server(images: Images) -> Iterator[ImageServer]:
    server = ImageServer(images.root).start()
    yield server
    server.stop()


# -- DataVolume helpers ---------------------------------------------------------------------


def datavolume(
    name: str,
    source: dict[str, Any],
    size: str = "64Mi",
    storage_class: str = "testkit-fs",
    mode: str = "Filesystem",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "source": source,
            "storage": {
                "accessModes": ["ReadWriteOnce"],
                "volumeMode": mode,
                "storageClassName": storage_class,
                "resources": {"requests": {"storage": size}},
            },
        },
    }


def dv_path(ns: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/datavolumes" + (f"/{name}" if name else "")


def wait_phase(
    kube: Kube,
    ns: str,
    name: str,
    phases: tuple[str, ...],
    timeout: float = 120,
    seen: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        dv = kube.get(dv_path(ns, name))
        status = dv.get("status") or {}
        if seen is not None and (not seen or seen[-1] != status):
            seen.append(status)
        return dv if status.get("phase") in phases else None

    return wait_until(check, f"DataVolume {ns}/{name} in {phases}", timeout, interval=0.1)


def condition(dv: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in dv.get("status", {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    raise AssertionError(f"no {type_} condition in {dv.get('status')}")


def wait_running_reason(
    kube: Kube, ns: str, name: str, reason: str, timeout: float = 90
) -> dict[str, Any]:
    """The DataVolume's Running condition once its reason is ``reason``."""

    def check() -> dict[str, Any] | None:
        dv = kube.get(dv_path(ns, name))
        running = [
            c for c in dv.get("status", {}).get("conditions") or [] if c["type"] == "Running"
        ]
        return dict(running[0]) if running and running[0].get("reason") == reason else None

    return wait_until(check, f"Running condition {reason} on {ns}/{name}", timeout)


def events_for(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    items = kube.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["involvedObject"].get("name") == name]


def event_reasons(
    kube: Kube, ns: str, name: str, wanted: set[str], timeout: float = 30
) -> set[str]:
    """The reasons of the events about ``name`` once they include ``wanted``. The controller
    writes events off the reconcile path, and holds them back for a few seconds while new
    objects wait (``cdi.kube.events``), so an event may follow the status it tells of."""

    def seen() -> set[str] | None:
        reasons = {str(e["reason"]) for e in events_for(kube, ns, name)}
        return reasons if wanted <= reasons else None

    try:
        return wait_until(seen, f"events {sorted(wanted)} about {ns}/{name}", timeout)
    except TimeoutError as exc:
        got = sorted({str(e["reason"]) for e in events_for(kube, ns, name)})
        raise AssertionError(f"{exc}: only {got}") from exc


def pv_of(kube: Kube, ns: str, claim: str) -> dict[str, Any]:
    pvc = kube.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
    return kube.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")


def volume_dir(kube: Kube, ns: str, claim: str) -> Path:
    """Where a claim's volume is on the node: the mount point of a filesystem volume, the
    device of a block one; local PVs and the provisioner's CSI PVs alike."""
    path = volume_path(pv_of(kube, ns, claim))
    assert path, f"claim {ns}/{claim}: its PV has no path on this node"
    return Path(path)


def same_prefix_then_zeros(target: Path, reference: Path) -> None:
    """``target`` starts with ``reference`` byte for byte and holds only zeros after it."""
    n = reference.stat().st_size
    with open(target, "rb") as t, open(reference, "rb") as r:
        offset = 0
        while offset < n:
            a, b = t.read(MiB), r.read(MiB)
            assert a == b[: len(a)] and len(a) == len(b), f"content differs near offset {offset}"
            offset += len(b)
        while data := t.read(4 * MiB):
            assert data.count(0) == len(data), "non-zero bytes after the image"


def now() -> float:
    return time.monotonic()


# -- the leading controller killed mid-import (process node and real node alike) ---------------


@dataclass
class Takeover:
    old: str  # the leader that was SIGKILLed
    standby: str  # the other replica at the time
    successor: str  # who holds the Lease after
    took: float  # seconds from the kill to the new holder
    phase_then: str  # the DataVolume's phase when the new holder was seen
    pods: set[str]  # uids of every pod seen in the namespace from the kill to the end
    dv: dict[str, Any]  # the DataVolume once Succeeded or Failed


def kill_the_leader_mid_import(
    kube: Kube, product: Product, ns: str, name: str, url: str, timeout: float = 240
) -> Takeover:
    """DataVolume ``name`` importing ``url`` (a slow one); once ImportInProgress, SIGKILL the
    controller replica holding the Lease (``Product.kill``: no Lease release), wait for
    another holder, then for the import to end, noting every pod of ``ns`` on the way."""
    kube.create(dv_path(ns), datavolume(name, {"http": {"url": url}}, size="64Mi"))
    wait_phase(kube, ns, name, ("ImportInProgress",), 120)
    pods: set[str] = set()

    def note_pods() -> None:
        for p in kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]:
            pods.add(p["metadata"]["uid"])

    replicas = {p["metadata"]["name"] for p in product.pods("cdi-controller")}
    old = product.leader()
    assert old in replicas and len(replicas) == 2, (old, replicas)
    (standby,) = replicas - {old}
    lease_seconds = product.lease()["spec"]["leaseDurationSeconds"]
    note_pods()
    held_by = product.lease()["spec"].get("holderIdentity")  # the killed process's own identity
    killed_at = time.monotonic()
    product.kill(old)

    def new_term() -> str | None:
        """The pod of a new holder: the standby, or the killed replica restarted by its node
        (a new process, a new identity), whichever saw the Lease run out first."""
        note_pods()
        holder = product.lease()["spec"].get("holderIdentity")
        return product.leader() if holder and holder != held_by else None

    try:
        successor = wait_until(new_term, "a new holder of the Lease", 3 * lease_seconds)
    except TimeoutError as exc:  # say what the replicas were doing
        states = {p["metadata"]["name"]: p["status"].get("containerStatuses")
                  for p in product.pods("cdi-controller")}  # fmt: skip
        log = product.log()[-4000:]
        raise AssertionError(f"{exc}\nlease: {product.lease()['spec']}\n{states}\n{log}") from exc
    took = time.monotonic() - killed_at
    phase_then = kube.get(dv_path(ns, name))["status"]["phase"]
    print(f"takeover: {successor} leads {took:.1f} s after {old} was SIGKILLed")

    def done() -> dict[str, Any] | None:
        note_pods()
        dv = kube.get(dv_path(ns, name))
        return dv if dv.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    dv = wait_until(done, "the import to finish after the takeover", timeout, interval=0.2)
    return Takeover(old, standby, successor, took, phase_then, pods, dv)


def both_replicas_ready(product: Product) -> bool:
    pods = product.pods("cdi-controller")
    return len(pods) == 2 and all(
        c.get("ready") for p in pods for c in p["status"].get("containerStatuses") or [{}]
    )


COPY_CLASS = {"Filesystem": "copy-fs", "Block": "copy-block"}
PROFILES = "/apis/cdi.kubevirt.io/v1beta1/storageprofiles"


@pytest.fixture
def copy_classes(kube: Kube, controller: Any) -> Iterator[None]:
    """Two local classes whose profiles say ``cloneStrategy: copy``."""
    for name in COPY_CLASS.values():
        sc = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
              "metadata": {"name": name}, "provisioner": "testkit.local/loop",
              "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
              "allowVolumeExpansion": True}  # fmt: skip
        try:
            kube.create("/apis/storage.k8s.io/v1/storageclasses", sc)
        except ApiError as e:
            if not e.conflict:
                raise
    for name in COPY_CLASS.values():
        wait_until(lambda n=name: kube.get_or_none(f"{PROFILES}/{n}"), f"profile {name}", 60)
        kube.patch(f"{PROFILES}/{name}", {"spec": {"cloneStrategy": "copy"}})
        wait_until(
            lambda n=name: (
                (kube.get(f"{PROFILES}/{n}").get("status") or {}).get("cloneStrategy") == "copy"
            ),
            f"profile {name} says copy",
            60,
        )
    yield


@pytest.fixture
def other_namespace(kube: Kube) -> Iterator[str]:
    name = f"copy-target-{secrets.token_hex(3)}"
    kube.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                       "metadata": {"name": name}})  # fmt: skip
    yield name
    kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")
