"""Start and stop a real Kubernetes cluster on loopback for integration tests.

Order: etcd, kube-apiserver (secure port on 127.0.0.1, RBAC, a static token file, service-
account signing keys, admission webhooks, aggregation with a front-proxy client certificate,
which it also presents to the admission webhook ``cdi-webhook.cdi.svc``, as
``docs/security.md`` tells an operator to: an admission configuration file),
kube-controller-manager, the VolumeSnapshot CRDs and the upstream CSI snapshot-controller
(both built by hack/kube/build.sh from kubernetes-csi/external-snapshotter), kube-scheduler,
then the local node agent and the local provisioner (``testkit.node``, ``testkit.provisioner``,
which is also the CSI snapshotter of its ``loop.testkit.local`` volumes). Each
runs in its own process group, logs to ``<state>/logs/<name>.log`` and is stopped by group, so
a teardown leaves no stray process, mount or loop device.

By hand::

    python -m testkit.cluster up          # prints the kubeconfig path, stays up until Ctrl-C

From pytest: ``tests/integration/conftest.py`` holds one :class:`Cluster` per session.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import urllib3
import yaml
from kubernetes import client

from testkit import pki, realnode, storage
from testkit.containers import remove_created_mount_points
from testkit.kubeclient import ApiError, Kube
from testkit.kubeconfig import (
    ADMIN,
    Identity,
    default_identities,
    write_kubeconfig,
    write_token_file,
)
from testkit.netns import NetNamespace
from testkit.node import MARKER_ENV
from testkit.procs import ManagedProcess, kill_processes_with_env
from testkit.provisioner import storage_classes
from testkit.realnode import RealNode
from testkit.snapshotter import CLASSES as SNAPSHOT_CLASSES
from testkit.snapshotter import SNAPSHOT_CLASS

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_BIN_DIR = REPO_ROOT / "hack" / "kube" / "_build" / "bin"
DEFAULT_CRD_DIR = REPO_ROOT / "hack" / "kube" / "_build" / "crd"
# scripts/images.sh's OCI layout: what a real node's registry serves as quay.io/cdi-py/*
DEFAULT_PRODUCT_IMAGES = REPO_ROOT / "build" / "images" / "oci"
NODE_KINDS = ("process", "real")
T = TypeVar("T")
NET_LOCK_DIR = Path(tempfile.gettempdir())
# Shared by every cluster on the machine: host paths containers had to create as mount points.
MOUNT_POINT_RECORD = NET_LOCK_DIR / "testkit-created-mount-points"
FRONT_PROXY_CLIENT = "front-proxy-client"
# Webhook hosts the API server authenticates to with its front-proxy client certificate
WEBHOOK_CLIENT_HOSTS = ("cdi-webhook.cdi.svc",)
BINARIES = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "snapshot-controller",
)
SNAPSHOT_CRDS = ("volumesnapshotclasses", "volumesnapshotcontents", "volumesnapshots")
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

# Controllers the tests rely on; everything else in kube-controller-manager stays off, which
# keeps start-up fast and leaves the node's status to our node agent alone.
CONTROLLERS = (
    "garbage-collector-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
    "namespace-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "replicaset-controller",
    "deployment-controller",
    "job-controller",
    "resourcequota-controller",
    "clusterrole-aggregation-controller",
)
# A real kubelet registers with the not-ready taint: only this controller removes it.
REAL_NODE_CONTROLLERS = ("node-lifecycle-controller", "pod-garbage-collector-controller")


class ControlPlaneMissing(RuntimeError):
    """The binaries built by hack/kube/build.sh are not there."""


class ClusterStartFailed(RuntimeError):
    """A component did not become ready in time."""


def _default_node() -> str:
    return os.environ.get("TESTKIT_NODE", "process")


@dataclass(frozen=True)
class ClusterConfig:
    """``node``: ``"process"`` (``testkit.node``, pods as local processes) or ``"real"``
    (kubelet, containerd, kube-proxy and CNI in the cluster's own network namespace:
    :mod:`testkit.realnode`); the default is ``$TESTKIT_NODE``, else ``"process"``."""

    state_dir: Path
    bin_dir: Path = DEFAULT_BIN_DIR
    crd_dir: Path = DEFAULT_CRD_DIR  # the VolumeSnapshot CRDs build.sh takes from the module
    node_name: str = "testkit-node"
    with_node: bool = True
    images_config: Path | None = None
    start_timeout: float = 60.0
    keep_state: bool = False
    node: str = field(default_factory=_default_node)
    product_images: Path = DEFAULT_PRODUCT_IMAGES
    nodes: int = 1  # real nodes only: ``node_name``, ``node_name-2``, ...
    csi_node: Path = realnode.DEFAULT_CSI_NODE  # real nodes: the CSI node plugin's binary

    def __post_init__(self) -> None:
        if self.node not in NODE_KINDS:
            raise ValueError(f"node must be one of {NODE_KINDS}, not {self.node!r}")
        if self.nodes < 1 or (self.nodes > 1 and self.node != "real"):
            raise ValueError(f"nodes={self.nodes}: more than one node needs node='real'")

    @property
    def node_names(self) -> list[str]:
        return [self.node_name] + [f"{self.node_name}-{i + 1}" for i in range(1, self.nodes)]

    @property
    def real_node(self) -> bool:
        return self.node == "real"


class LoopbackBlocks:
    """Two /16 blocks of 127.0.0.0/8 for one cluster: pod IPs (127.N.0.0/16) and Service
    ClusterIPs (127.N+1.0.0/16). Several clusters may run on one machine (developers, CI, a
    hand-started one), so each holds an flock on ``testkit-net-N.lock`` for its lifetime; the
    kernel drops it when the process dies, so a crash never leaks a block."""

    def __init__(self) -> None:
        for n in range(10, 250, 2):
            fd = os.open(NET_LOCK_DIR / f"testkit-net-{n}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.fd, self.n = fd, n
            return
        raise ClusterStartFailed("no free loopback block: too many testkit clusters running")

    @property
    def pod_cidr(self) -> str:
        return f"127.{self.n}.0.0/16"

    @property
    def service_cidr(self) -> str:
        return f"127.{self.n + 1}.0.0/16"

    def release(self) -> None:
        os.close(self.fd)


def sweep_dead_clusters(root: Path = NET_LOCK_DIR) -> list[Path]:
    """Release what killed harnesses left behind in ``root/testkit-*``: mounts, loop devices,
    container processes and the state directory. A live cluster holds an flock on its
    ``cluster.lock`` for its whole life, so a lock that can be taken belongs to a dead one."""
    swept = []
    for d in sorted(root.glob("testkit-*")):
        lock = d / "cluster.lock"
        if not d.is_dir() or not lock.exists():
            continue
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            kill_processes_with_env(MARKER_ENV, str(d / "node"))
            realnode.sweep(d)
            storage.release_all_under(d)
            shutil.rmtree(d, ignore_errors=True)
            swept.append(d)
        finally:
            os.close(fd)
    return swept


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    """One running cluster. ``start()`` blocks until every component is ready."""

    config: ClusterConfig
    identities: dict[str, Identity] = field(default_factory=default_identities)
    processes: list[ManagedProcess] = field(default_factory=list)
    api_port: int = 0
    started_in: float = 0.0
    net: LoopbackBlocks | None = None
    state_lock: int | None = None
    netns: NetNamespace | None = None
    realnodes: list[RealNode] = field(default_factory=list)

    @property
    def realnode(self) -> RealNode | None:
        """The first real node (it also runs the registry and kube-proxy)."""
        return self.realnodes[0] if self.realnodes else None

    # -- paths and clients ------------------------------------------------------------------
    @property
    def state(self) -> Path:
        return self.config.state_dir

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def service_cidr(self) -> str:
        if self.config.real_node:
            return realnode.SERVICE_CIDR
        assert self.net is not None
        return self.net.service_cidr

    @property
    def pod_cidr(self) -> str:
        if self.config.real_node:
            return realnode.POD_CIDR
        assert self.net is not None
        return self.net.pod_cidr

    @property
    def host_address(self) -> str:
        """An address of this machine that pods reach: where a test binds the servers pods
        must reach. On a real node it is inside the cluster's network namespace, so such a
        server must run there (:meth:`in_network`)."""
        return realnode.NODE_IP if self.config.real_node else "127.0.0.1"

    def network_call(self, fn: Callable[[], T]) -> T:
        """``fn()`` where pods can reach what it binds: in a thread inside a real node's
        network namespace (a socket keeps the namespace it was made in), else here."""
        return self.netns.call(fn) if self.netns is not None else fn()

    def in_network(self, argv: list[str]) -> list[str]:
        """``argv`` run where pods can reach it: inside a real node's network namespace."""
        return self.netns.argv(argv) if self.netns is not None else argv

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def ca_path(self) -> Path:
        return self.state / "pki" / "ca.crt"

    @property
    def storage_dir(self) -> Path:
        """The provisioner's: volume images and mounts, snapshots."""
        return self.state / "storage"

    def kubeconfig_for(self, user: str) -> Path:
        return self.state / f"kubeconfig-{user}"

    def token(self, user: str) -> str:
        return self.identities[user].token

    def api_client(self, user: str = ADMIN) -> client.ApiClient:
        cfg = client.Configuration()
        cfg.host = self.server
        cfg.ssl_ca_cert = str(self.ca_path)
        cfg.api_key = {"authorization": f"Bearer {self.token(user)}"}
        return client.ApiClient(cfg)

    def kube(self, user: str = ADMIN) -> Kube:
        return Kube(self.api_client(user))

    def snapshot_image(self, handle: str) -> Path:
        """Where the local snapshotter keeps the snapshot ``handle`` (a sparse image)."""
        return self.storage_dir / "snapshots" / f"{handle}.img"

    def pod_log_dir(self, namespace: str, pod: str) -> Path:
        """Where the node keeps a pod's container logs (one dir per pod uid)."""
        if self.realnodes:
            matches = sorted(
                m for n in self.realnodes for m in n.pod_logs_dir.glob(f"{namespace}_{pod}_*")
            )
        else:
            matches = sorted((self.state / "node" / "pods").glob(f"{namespace}_{pod}_*"))
        if not matches:
            raise FileNotFoundError(f"no pod directory for {namespace}/{pod}")
        return matches[-1] if self.realnode is not None else matches[-1] / "logs"

    def container_log(self, namespace: str, pod: str, container: str) -> str:
        """The whole log of a container, all restarts concatenated in order (a kubelet's
        CRI lines, ``<time> <stream> <P|F> <text>``, are read back to the text)."""
        d = self.pod_log_dir(namespace, pod) / container
        files = sorted(d.glob("*.log"), key=lambda p: int(p.stem))
        text = "".join(f.read_text(errors="replace") for f in files)
        if self.realnode is None:
            return text
        out = []
        for line in text.splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4:
                out.append(parts[3] + ("\n" if parts[2] == "F" else ""))
        return "".join(out)

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> Cluster:
        t0 = time.monotonic()
        missing = [str(self.config.bin_dir / b) for b in BINARIES]
        missing += [str(self.config.crd_dir / f"{c}.yaml") for c in SNAPSHOT_CRDS]
        missing = [m for m in missing if not Path(m).is_file()]
        if missing:
            raise ControlPlaneMissing(f"missing {', '.join(missing)}: run hack/kube/build.sh")
        if self.config.real_node and self.config.with_node:
            parts = realnode.missing_parts(
                self.config.bin_dir, self.config.product_images, self.config.csi_node
            )
            if parts:
                raise realnode.RealNodeMissing("real node: missing " + "; ".join(parts))
        sweep_dead_clusters()
        self.state.mkdir(parents=True, exist_ok=True)
        self.state_lock = os.open(self.state / "cluster.lock", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self.state_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        try:
            self.net = LoopbackBlocks()
            if self.config.real_node:
                # First, before any component: nothing of a real node touches the host network.
                self.netns = NetNamespace(f"testkit-rn-{self.net.n}")
                self.netns.create(realnode.NODE_IP, realnode.SERVICE_CIDR)
                for i in range(1, self.config.nodes):
                    self.netns.add_address(realnode.node_ip(i))
            self._write_pki_and_configs()
            if self.netns is not None:
                self._start_api_forwarder()
            etcd_url = self._start_etcd()
            self._start_apiserver(etcd_url)
            self._wait("kube-apiserver /readyz", self._apiserver_ready)
            self._start_controller_manager()
            self._install_snapshot_crds()
            self._start_snapshot_controller()
            self._start_scheduler()
            if self.config.with_node and self.config.real_node:
                self._start_real_node()
            elif self.config.with_node:
                self._start_local_components()
            self._wait_cluster_usable()
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - t0
        return self

    def stop(self) -> None:
        """Stop everything, newest first, then release mounts and loop devices."""
        if self.realnode is not None:
            self._drain_real_node()
        for proc in reversed(self.processes):
            proc.stop(grace=15.0 if proc.name == "node" else 5.0)
        self.processes.clear()
        kill_processes_with_env(MARKER_ENV, str(self.state / "node"))
        for node in self.realnodes:
            node.kill_shims()
            node.kill_and_remove_cgroups()
        self.realnodes = []
        storage.release_all_under(self.state)
        if self.netns is not None:
            self.netns.delete()
            self.netns = None
        # Mount points that containers created on the host may be in use by another cluster's
        # pods (removing one would detach their mounts), so the last cluster standing tidies.
        if not self._other_clusters_running() and MOUNT_POINT_RECORD.exists():
            remove_created_mount_points([MOUNT_POINT_RECORD])
            MOUNT_POINT_RECORD.unlink(missing_ok=True)
        if self.net is not None:
            self.net.release()
            self.net = None
        if self.state_lock is not None:
            os.close(self.state_lock)
            self.state_lock = None
        if not self.config.keep_state:
            shutil.rmtree(self.state, ignore_errors=True)

    def restart(self, name: str, down_for: float = 0.0) -> float:
        """Stop the control-plane process ``name`` (``etcd``, ``kube-apiserver``...: SIGTERM,
        SIGKILL after 5 s), leave it down ``down_for`` seconds, start it again with the same
        command line and wait until the API server answers /readyz. Returns the seconds the
        component was down. For fault tests: clients see refused connections meanwhile."""
        index = next(i for i, p in enumerate(self.processes) if p.name == name)
        old = self.processes[index]
        began = time.monotonic()
        old.stop(grace=5.0)
        time.sleep(down_for)
        self.processes[index] = ManagedProcess(name, old.argv, old.log_path, env=old.env)
        self._wait(f"kube-apiserver /readyz after restarting {name}", self._apiserver_ready)
        return time.monotonic() - began

    @contextlib.contextmanager
    def paused(self, name: str) -> Iterator[None]:
        """Freeze the control-plane process ``name`` (SIGSTOP to its process group) for the
        block, then thaw it (SIGCONT). A frozen etcd keeps its connections and answers nothing:
        the API server holds requests instead of failing them. For fault tests."""
        proc = next(p for p in self.processes if p.name == name)
        os.killpg(proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(proc.pid, signal.SIGCONT)

    def _other_clusters_running(self) -> bool:
        own = f"testkit-net-{self.net.n}.lock" if self.net else ""
        for lock in NET_LOCK_DIR.glob("testkit-net-*.lock"):
            if lock.name == own:
                continue
            try:
                fd = os.open(lock, os.O_RDWR)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except BlockingIOError:
                return True
            finally:
                os.close(fd)
        return False

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- steps ------------------------------------------------------------------------------
    def _write_pki_and_configs(self) -> None:
        d = self.state / "pki"
        d.mkdir(parents=True, exist_ok=True)
        ca = pki.CertificateAuthority("testkit-cluster-ca")
        self.ca_path.write_bytes(ca.cert_pem)
        serving = ca.issue(
            "kube-apiserver",
            dns_names=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=("127.0.0.1", realnode.NODE_IP, realnode.API_SERVICE_IP)
            if self.config.real_node
            else ("127.0.0.1",),
        )
        serving.write(d / "apiserver.crt", d / "apiserver.key")
        # The API server's client certificate for the kubelet (logs, exec, port-forward).
        ca.issue(
            "kube-apiserver-kubelet-client", organizations=("system:masters",), client=True
        ).write(d / "kubelet-client.crt", d / "kubelet-client.key")
        # The aggregator's client certificate: the cluster CA is also the requestheader CA, so
        # aggregated API servers (our UploadTokenRequest API) trust requests it forwards.
        front_proxy = ca.issue(FRONT_PROXY_CLIENT, client=True)
        front_proxy.write(d / "front-proxy-client.crt", d / "front-proxy-client.key")
        _write_admission_config(d / "admission.yaml", d / "webhook-clients.kubeconfig", front_proxy)
        pki.signing_key_pair().write(d / "sa.pub", d / "sa.key")
        write_token_file(d / "tokens.csv", self.identities)
        self.api_port = free_port()
        ids = list(self.identities.values())
        write_kubeconfig(self.kubeconfig, self.server, ca.cert_pem, ids, ADMIN)
        for ident in ids:
            write_kubeconfig(
                self.kubeconfig_for(ident.user), self.server, ca.cert_pem, [ident], ident.user
            )

    def _spawn(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, *, host: bool = False
    ) -> None:
        """Start a component; on a real node inside the network namespace unless ``host``."""
        if self.netns is not None and not host:
            argv = self.netns.argv(argv)
        self.processes.append(
            ManagedProcess(name, argv, self.state / "logs" / f"{name}.log", env=env)
        )

    def _probe(self, url: str) -> bool:
        """``_http_ok(url)`` from where the components listen."""
        if self.netns is not None:
            return self.netns.call(lambda: _http_ok(url))
        return _http_ok(url)

    def _start_api_forwarder(self) -> None:
        """The tests' way in: 127.0.0.1:<api port> on the host, forwarded to the API server
        in the namespace (same port), so kubeconfigs and clients work unchanged."""
        assert self.netns is not None
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        self._spawn(
            "api-forwarder",
            [
                sys.executable,
                "-m",
                "testkit.netns",
                "forward",
                f"--listen=127.0.0.1:{self.api_port}",
                f"--netns={self.netns.path}",
                f"--connect=127.0.0.1:{self.api_port}",
            ],
            env,
            host=True,
        )

    def _bin(self, name: str) -> str:
        return str(self.config.bin_dir / name)

    def _start_etcd(self) -> str:
        client_port, peer_port = free_port(), free_port()
        url = f"http://127.0.0.1:{client_port}"
        peer = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                self._bin("etcd"),
                "--name=testkit",
                f"--data-dir={self.state / 'etcd'}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=testkit={peer}",
                "--unsafe-no-fsync=true",  # test data: durability is not worth the latency
                "--log-level=warn",
            ],
        )
        self._wait("etcd /health", lambda: self._probe(f"{url}/health"))
        return url

    def _start_apiserver(self, etcd_url: str) -> None:
        d = self.state / "pki"
        if self.config.real_node:
            # In the namespace: the node's address is the advertised one (Service
            # "kubernetes"), real endpoints, and the kubelet reached by its InternalIP only.
            network = [
                "--bind-address=0.0.0.0",
                f"--advertise-address={realnode.NODE_IP}",
                f"--kubelet-client-certificate={d / 'kubelet-client.crt'}",
                f"--kubelet-client-key={d / 'kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP",
            ]
        else:
            network = [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",  # a loopback address is no valid endpoint
            ]
        self._spawn(
            "kube-apiserver",
            [
                self._bin("kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                *network,
                f"--secure-port={self.api_port}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--client-ca-file={self.ca_path}",
                f"--requestheader-client-ca-file={self.ca_path}",
                f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                f"--proxy-client-cert-file={d / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={d / 'front-proxy-client.key'}",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--anonymous-auth=false",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                # ClusterIPs on loopback: the node's service proxy listens on them (pod IPs are
                # loopback too, which EndpointSlices refuse), and no traffic can leave the machine.
                f"--service-cluster-ip-range={self.service_cidr}",
                "--enable-admission-plugins=NamespaceLifecycle,ServiceAccount,DefaultStorageClass,"
                "StorageObjectInUseProtection,PersistentVolumeClaimResize,ResourceQuota,"
                "MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy",
                f"--admission-control-config-file={d / 'admission.yaml'}",
                "--allow-privileged=true",
                "--profiling=false",
                "--v=1",
            ],
        )

    def _component_kubeconfig_args(self) -> list[str]:
        kc = str(self.kubeconfig)
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
        ]

    def _start_controller_manager(self) -> None:
        d = self.state / "pki"
        port = free_port()
        controllers = CONTROLLERS + (REAL_NODE_CONTROLLERS if self.config.real_node else ())
        self._spawn(
            "kube-controller-manager",
            [
                self._bin("kube-controller-manager"),
                *self._component_kubeconfig_args(),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={self.state / 'kcm'}",
                "--leader-elect=false",
                f"--controllers={','.join(controllers)}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={self.ca_path}",
                "--use-service-account-credentials=false",
                "--v=1",
            ],
        )
        self._wait(
            "kube-controller-manager /healthz",
            lambda: self._probe(f"https://127.0.0.1:{port}/healthz"),
        )

    def _install_snapshot_crds(self) -> None:
        """The snapshot.storage.k8s.io CRDs, before the snapshot-controller (which exits when
        they are not served) and before any product is installed."""
        kube = self.kube()
        for name in SNAPSHOT_CRDS:
            crd = yaml.safe_load((self.config.crd_dir / f"{name}.yaml").read_text())
            try:
                kube.create(CRD_API, crd)
            except ApiError as e:
                if not e.conflict:
                    raise

        def established() -> bool:
            for name in SNAPSHOT_CRDS:
                crd = kube.get(f"{CRD_API}/{name}.snapshot.storage.k8s.io")
                conds = crd.get("status", {}).get("conditions") or []
                if not any(c["type"] == "Established" and c["status"] == "True" for c in conds):
                    return False
            return True

        self._wait("VolumeSnapshot CRDs established", established)

    def _start_snapshot_controller(self) -> None:
        port = free_port()
        self._spawn(
            "snapshot-controller",
            [
                self._bin("snapshot-controller"),
                f"--kubeconfig={self.kubeconfig}",
                f"--http-endpoint=127.0.0.1:{port}",  # metrics: how we know it is up
                "--leader-election=false",
                # No group-snapshot CRDs here: with the gate on it would wait 30 s for them.
                "--feature-gates=CSIVolumeGroupSnapshot=false",
                "--kube-api-qps=50",  # the default 5/s would pace a burst of test snapshots
                "--kube-api-burst=100",
                "--retry-interval-max=10s",  # failures are retried within a test's patience
                "--v=2",
            ],
        )
        self._wait(
            "snapshot-controller /metrics", lambda: self._probe(f"http://127.0.0.1:{port}/metrics")
        )

    def _start_scheduler(self) -> None:
        port = free_port()
        self._spawn(
            "kube-scheduler",
            [
                self._bin("kube-scheduler"),
                *self._component_kubeconfig_args(),
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        self._wait(
            "kube-scheduler /healthz", lambda: self._probe(f"https://127.0.0.1:{port}/healthz")
        )

    def _start_local_components(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        common = [f"--kubeconfig={self.kubeconfig}", f"--node-name={self.config.node_name}"]
        self._spawn(
            "provisioner",
            [
                sys.executable,
                "-m",
                "testkit.provisioner",
                *common,
                f"--state-dir={self.storage_dir}",
            ],
            env,
        )
        node = [
            sys.executable,
            "-m",
            "testkit.node",
            *common,
            f"--state-dir={self.state / 'node'}",
            f"--api-port={self.api_port}",
            f"--ca-file={self.ca_path}",
            f"--pod-cidr={self.pod_cidr}",
            f"--mount-point-record={MOUNT_POINT_RECORD}",
        ]
        if self.config.images_config:
            node.append(f"--images={self.config.images_config}")
        self._spawn("node", node, env)

    def _start_real_node(self) -> None:
        """The provisioner (on the host: it only mounts and talks to the API server; it makes
        the volumes of every node, each PV pinned to its node), then in the namespace the
        registry (filled with the pause and product images before any kubelet may pull), and
        per node containerd, the CSI node plugin of the provisioner's CSI classes
        (hack/csinode) and the kubelet; one kube-proxy serves the namespace (its iptables are
        the nodes')."""
        assert self.netns is not None and self.net is not None
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p
        )
        for i, name in enumerate(self.config.node_names):
            node = RealNode(
                state=self.state,
                netns=self.netns,
                bin_dir=self.config.bin_dir,
                node_name=name,
                kubeconfig=self.kubeconfig,
                ca_path=self.ca_path,
                cgroup_name=f"testkit-rn-{self.net.n}" + (f"-{i + 1}" if i else ""),
                images_dir=self.config.product_images,
                index=i,
            )
            self.realnodes.append(node)
        first = self.realnodes[0]
        healthz = {node.index: free_port() for node in self.realnodes}
        proxy_ports = (free_port(), free_port())
        for node in self.realnodes:
            node.write_configs(healthz[node.index], proxy_ports)
            node.record()
            node.make_cgroups()
        self._spawn(
            "provisioner",
            [
                sys.executable,
                "-m",
                "testkit.provisioner",
                f"--kubeconfig={self.kubeconfig}",
                *(f"--node-name={node.node_name}" for node in self.realnodes),
                f"--state-dir={self.storage_dir}",
            ],
            env,
            host=True,
        )
        self._spawn("registry", first.registry_argv())
        for node in self.realnodes:
            self._spawn(_suffixed("containerd", node.index), node.containerd_argv())
        self._wait("registry", lambda: self._probe(f"http://{realnode.REGISTRY}/v2/"))
        first.push_images()
        for node in self.realnodes:
            self._wait("containerd socket", node.containerd_socket.exists)
            # Before its kubelet (whose plugin watcher then finds it at once), so that it stops
            # after the kubelet.
            csi = node.csi_node_argv(self.config.csi_node, self.storage_dir / "volumes")
            self._spawn(_suffixed("csi-node", node.index), csi)
            self._spawn(_suffixed("kubelet", node.index), node.kubelet_argv())
        self._spawn("kube-proxy", first.kube_proxy_argv())
        for node in self.realnodes:
            url = f"http://127.0.0.1:{healthz[node.index]}/healthz"
            self._wait(f"kubelet /healthz of {node.node_name}", lambda u=url: self._probe(u))
        self._wait(
            "kube-proxy /healthz", lambda: self._probe(f"http://127.0.0.1:{proxy_ports[0]}/healthz")
        )

    def _drain_real_node(self) -> None:
        """Before the kubelet stops: no new pods (controllers and scheduler down), every pod
        deleted through the kubelet, so it unmounts volumes, releases block-volume loop devices
        and tears sandboxes (and their network namespaces) down itself."""
        for proc in self.processes:
            if proc.name in ("kube-controller-manager", "kube-scheduler"):
                proc.stop(grace=5.0)
        self.processes = [
            p for p in self.processes if p.name not in ("kube-controller-manager", "kube-scheduler")
        ]
        try:
            kube = self.kube()
            for pod in kube.get("/api/v1/pods")["items"]:
                meta = pod["metadata"]
                kube.delete_ignore_missing(
                    f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                    {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 1},
                )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and kube.get("/api/v1/pods")["items"]:
                time.sleep(0.5)
        except (ApiError, OSError, urllib3.exceptions.HTTPError):
            pass  # the API server is gone: the cgroup sweep in stop() kills what is left

    def _wait_cluster_usable(self) -> None:
        kube = self.kube()

        def default_sa() -> bool:
            return (
                kube.get_or_none("/api/v1/namespaces/default/serviceaccounts/default") is not None
            )

        self._wait("default service account", default_sa)
        if not self.config.with_node:
            return

        def node_ready() -> bool:
            names = self.config.node_names if self.config.real_node else [self.config.node_name]
            for name in names:
                node = kube.get_or_none(f"/api/v1/nodes/{name}")
                if node is None or node.get("spec", {}).get("taints"):
                    return False
                conds = node.get("status", {}).get("conditions") or []
                if not any(c["type"] == "Ready" and c["status"] == "True" for c in conds):
                    return False
            return True

        def classes() -> bool:
            names = {
                sc["metadata"]["name"]
                for sc in kube.get("/apis/storage.k8s.io/v1/storageclasses")["items"]
            }
            snapclass = kube.get_or_none(f"{SNAPSHOT_CLASSES}/{SNAPSHOT_CLASS}")
            return {sc["metadata"]["name"] for sc in storage_classes()} <= names and bool(snapclass)

        self._wait("node Ready", node_ready)
        self._wait("storage classes", classes)

    def _apiserver_ready(self) -> bool:
        try:
            self.kube().request("GET", "/readyz", timeout=2)
            return True
        except (ApiError, OSError, urllib3.exceptions.HTTPError):
            return False  # not listening yet, or listening but not ready

    def _wait(self, what: str, ready: Callable[[], bool]) -> None:
        deadline = time.monotonic() + self.config.start_timeout
        while time.monotonic() < deadline:
            for proc in self.processes:
                proc.check_alive()
            try:
                if ready():
                    return
            except (ApiError, OSError):
                pass
            time.sleep(0.1)
        tails = "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in self.processes)
        raise ClusterStartFailed(f"timed out waiting for {what}\n{tails}")


def _suffixed(name: str, index: int) -> str:
    """A component's name (its log file) for node ``index``: ``kubelet``, ``kubelet-2``..."""
    return name if index == 0 else f"{name}-{index + 1}"


def _write_admission_config(path: Path, kubeconfig: Path, client: pki.KeyPair) -> None:
    """The kube-apiserver's ``--admission-control-config-file``: both webhook admission plugins
    read ``kubeconfig``, whose users (named for the webhook's host) carry ``client``."""
    users = [
        {
            "name": host,
            "user": {
                "client-certificate-data": base64.b64encode(client.cert_pem).decode(),
                "client-key-data": base64.b64encode(client.key_pem).decode(),
            },
        }
        for host in WEBHOOK_CLIENT_HOSTS
    ]
    kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": users}))
    kubeconfig.chmod(0o600)
    plugin = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    config = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "AdmissionConfiguration",
        "plugins": [
            {"name": name, "configuration": plugin}
            for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
        ],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def _http_ok(url: str) -> bool:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # components' self-signed serving certs: liveness only
    try:
        with urllib.request.urlopen(url, timeout=2, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _cmd_up(args: argparse.Namespace) -> int:
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="testkit-"))
    cfg = ClusterConfig(
        state_dir=state,
        keep_state=args.keep,
        with_node=not args.no_node,
        images_config=args.images,
        node=args.node or _default_node(),
        nodes=args.nodes,
    )
    cluster = Cluster(cfg)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    cluster.start()
    print(f"cluster ready in {cluster.started_in:.1f} s", flush=True)
    print(f"kubeconfig: {cluster.kubeconfig}", flush=True)
    print(f"  export KUBECONFIG={cluster.kubeconfig}", flush=True)
    for user in cluster.identities:
        if user != ADMIN:
            print(f"  unprivileged user {user}: {cluster.kubeconfig_for(user)}", flush=True)
    print(f"logs: {state / 'logs'}   (Ctrl-C to stop)", flush=True)
    try:
        while not stop.wait(1.0):
            for proc in cluster.processes:
                proc.check_alive()
    finally:
        print("stopping cluster", flush=True)
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m testkit.cluster", description="A real Kubernetes control plane on loopback."
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it up until Ctrl-C")
    up.add_argument("--state-dir", help="where certs, etcd data, volumes and logs go")
    up.add_argument("--keep", action="store_true", help="keep the state dir after stopping")
    up.add_argument("--no-node", action="store_true", help="control plane only")
    up.add_argument("--images", type=Path, help="image->command map for the node agent")
    up.add_argument(
        "--node",
        choices=NODE_KINDS,
        help="process: pods as local processes; real: kubelet + containerd in a network "
        "namespace (default: $TESTKIT_NODE, else process)",
    )
    up.add_argument("--nodes", type=int, default=1, help="how many real nodes (--node real)")
    args = parser.parse_args(argv)
    return _cmd_up(args)


if __name__ == "__main__":
    raise SystemExit(main())
