"""A real node for a testkit cluster (issue 24): containerd + runc, the kubelet and kube-proxy
of the control plane's own release, CNI bridge/host-local/loopback and a loopback registry, all
inside the cluster's network namespace (:mod:`testkit.netns`).

The settings that made a real kubelet run on this kind of machine
(``/work/shared/reference/real-node.md``, docs/kube-harness.md "A real node"):

- ``failCgroupV1: false`` (cgroup v1 hosts), ``cgroupDriver: cgroupfs`` (no systemd);
- containerd's ``restrict_oom_score_adj = true`` and the kubelet's ``oomScoreAdj: 0``: root here
  lacks CAP_SYS_RESOURCE, so runc cannot lower a container's oom_score_adj below its own;
- containerd's ``device_ownership_from_security_context = true`` (block volumes owned by the
  pod's user, as CDI requires);
- the node-lifecycle controller (it removes the kubelet's not-ready taint) and
  ``--kubelet-preferred-address-types=InternalIP`` on the API server (else it resolves the node
  name through the machine's DNS): both in :mod:`testkit.cluster`;
- ``resolvConf: ""``: pods get no copy of the host's resolver.

Every pull goes to the registry inside the namespace: ``quay.io``, ``registry.k8s.io`` and
``docker.io`` are mirrored to it by ``hosts.toml`` files, so no other host is ever asked. It is
filled before the cluster reports ready with the pause image (``pause.c`` of the release,
compiled by hack/kube/build.sh) and, when present, the product images of scripts/images.sh.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from testkit.netns import NETNS_DIR, NetNamespace

POD_CIDR = "10.244.0.0/16"  # node i has 10.244.i.0/24 on its bridge cni<i>
SERVICE_CIDR = "10.96.0.0/24"
API_SERVICE_IP = "10.96.0.1"  # the first address of SERVICE_CIDR: Service "kubernetes"
REGISTRY = "127.0.0.1:5000"  # inside the namespace
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.1"
MIRRORED = ("quay.io", "registry.k8s.io", "docker.io")
PRODUCT_REPOSITORY = "quay.io/cdi-py"
CNI_BIN_DIR = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def node_ip(index: int) -> str:
    """Node ``index``'s address, on the namespace's loopback; pods reach it through their
    bridge."""
    return f"10.243.0.{index + 1}"


def node_pod_cidr(index: int) -> str:
    return f"10.244.{index}.0/24"


NODE_IP = node_ip(0)  # the first node's: the API server advertises it
CSI_DRIVER = "loop.testkit.local"  # the provisioner's CSI classes (testkit.provisioner)
# testkit's CSI node plugin for that driver, built by hack/csinode/build.sh
DEFAULT_CSI_NODE = Path(__file__).resolve().parent.parent / "hack/csinode/_build/testkit-csi-node"
HOST_TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "docker-registry", "skopeo")


class RealNodeMissing(RuntimeError):
    """A part of the real node is not installed or built: the message says which and how."""


class RealNodeFailed(RuntimeError):
    """A real-node step (registry, image load) failed."""


def missing_parts(
    bin_dir: Path, images_dir: Path | None, csi_node: Path = DEFAULT_CSI_NODE
) -> list[str]:
    """What the real node needs and does not find, each with the command that provides it."""
    out = [
        f"{bin_dir / b} (run hack/kube/build.sh)"
        for b in ("kubelet", "kube-proxy", "pause")
        if not (bin_dir / b).is_file()
    ]
    if not csi_node.is_file():
        out.append(f"{csi_node} (run hack/csinode/build.sh)")
    out += [f"{t} (run scripts/setup.sh --test)" for t in HOST_TOOLS if shutil.which(t) is None]
    out += [
        f"{CNI_BIN_DIR / p} (run scripts/setup.sh --test: containernetworking-plugins)"
        for p in CNI_PLUGINS
        if not (CNI_BIN_DIR / p).is_file()
    ]
    if images_dir is not None and not (images_dir / "index.json").is_file():
        out.append(f"{images_dir} (run scripts/images.sh)")
    return out


def product_image_refs(images_dir: Path) -> dict[str, str]:
    """OCI layout ref (``cdi-controller``...) -> the name ``deploy/`` pulls."""
    index = json.loads((images_dir / "index.json").read_text())
    refs = {}
    for m in index.get("manifests", []):
        ref = (m.get("annotations") or {}).get("org.opencontainers.image.ref.name", "")
        if ref.startswith("cdi-"):
            refs[ref] = f"{PRODUCT_REPOSITORY}/{ref}:latest"
    return refs


def write_pause_layout(pause_binary: Path, out: Path) -> None:
    """An OCI layout holding one image, ref ``pause``: the static ``/pause`` as its one layer,
    entrypoint ``/pause``, user 65535 (as upstream's). Deterministic: same binary, same digest."""

    def blob(data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        path = out / "blobs" / "sha256" / digest
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("pause")
        data = pause_binary.read_bytes()
        info.size, info.mode, info.mtime = len(data), 0o755, 0
        tar.addfile(info, io.BytesIO(data))
    diff_id = "sha256:" + hashlib.sha256(raw.getvalue()).hexdigest()
    layer = blob(gzip.compress(raw.getvalue(), mtime=0))
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }
    cfg = blob(json.dumps(config, sort_keys=True).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **cfg},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", **layer}],
    }
    man = blob(json.dumps(manifest, sort_keys=True).encode())
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **man,
                "annotations": {"org.opencontainers.image.ref.name": "pause"},
            }
        ],
    }
    (out / "index.json").write_text(json.dumps(index))
    (out / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))


@dataclass
class RealNode:
    """The files and commands of one real node; :class:`testkit.cluster.Cluster` spawns them."""

    state: Path
    netns: NetNamespace
    bin_dir: Path
    node_name: str
    kubeconfig: Path
    ca_path: Path
    cgroup_name: str
    images_dir: Path | None
    index: int = 0  # of the cluster's nodes; the first also runs the registry and kube-proxy

    @property
    def root(self) -> Path:
        return self.state / ("realnode" if self.index == 0 else f"realnode-{self.index + 1}")

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def pod_cidr(self) -> str:
        return node_pod_cidr(self.index)

    @property
    def containerd_socket(self) -> Path:
        return self.root / "containerd" / "containerd.sock"

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs_dir(self) -> Path:
        return self.root / "pod-logs"

    # -- configuration ---------------------------------------------------------------------
    def write_configs(self, kubelet_healthz_port: int, proxy_ports: tuple[int, int]) -> None:
        ctr = self.root / "containerd"
        for d in ("root", "state", "opt", "certs.d"):
            (ctr / d).mkdir(parents=True, exist_ok=True)
        for host in MIRRORED:
            self._hosts_toml(host, REGISTRY)
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        (ctr / "config.toml").write_text(
            f"""version = 2
root = "{ctr / "root"}"
state = "{ctr / "state"}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{self.containerd_socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{ctr / "opt"}"

[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  device_ownership_from_security_context = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"  # several nodes' containerds share the namespace
  enable_selinux = false
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.root / "cni" / "net.d"}"
  [{cri}.registry]
    config_path = "{ctr / "certs.d"}"
"""
        )
        netd = self.root / "cni" / "net.d"
        netd.mkdir(parents=True, exist_ok=True)
        conflist = {
            "cniVersion": "0.4.0",
            "name": f"testkit-{self.index}",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": f"cni{self.index}",
                    "isGateway": True,
                    "ipMasq": False,
                    "hairpinMode": True,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": str(self.root / "cni" / "ipam"),
                    },
                }
            ],
        }
        (netd / "10-testkit.conflist").write_text(json.dumps(conflist, indent=2))
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.pod_logs_dir.mkdir(parents=True, exist_ok=True)
        kubelet = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup_name}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "address": self.ip,
            "port": 10250,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": kubelet_healthz_port,
            # Only holders of a cluster-CA certificate (the API server) may call the kubelet.
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {"clientCAFile": str(self.ca_path)},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "resolvConf": "",
            "podLogsDir": str(self.pod_logs_dir),
            "failSwapOn": False,
            "oomScoreAdj": 0,
            "serializeImagePulls": False,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "1%",
                "nodefs.inodesFree": "1%",
                "imagefs.available": "1%",
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "staticPodPath": "",
            "clusterDomain": "cluster.local",
        }
        (self.root / "kubelet.yaml").write_text(yaml.safe_dump(kubelet))
        proxy = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(self.kubeconfig)},
            "hostnameOverride": self.node_name,
            "mode": "iptables",
            "clusterCIDR": POD_CIDR,
            "healthzBindAddress": f"127.0.0.1:{proxy_ports[0]}",
            "metricsBindAddress": f"127.0.0.1:{proxy_ports[1]}",
            # Conntrack sysctls are the machine's, not the namespace's: leave them alone.
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
                "udpTimeout": "0s",
                "udpStreamTimeout": "0s",
            },
        }
        (self.root / "kube-proxy.yaml").write_text(yaml.safe_dump(proxy))
        registry = {
            "version": 0.1,
            "log": {"level": "error", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "registry")}},
            "http": {"addr": REGISTRY, "secret": "testkit-realnode"},
        }
        (self.root / "registry.yaml").write_text(yaml.safe_dump(registry))

    def _hosts_toml(self, name: str, server: str) -> None:
        d = self.root / "containerd" / "certs.d" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(
            f'server = "http://{server}"\n\n'
            f'[host."http://{server}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )

    def allow_plain_http(self, host: str) -> None:
        """Let this node pull from ``host`` (``address:port``, a test's registry inside the
        namespace) over plain http: containerd reads ``certs.d`` on every pull, so this takes
        effect at once. Without it containerd speaks https to any host but loopback."""
        self._hosts_toml(host, host)

    # -- commands (the cluster spawns them inside the namespace) -----------------------------
    def containerd_argv(self) -> list[str]:
        return ["containerd", f"--config={self.root / 'containerd' / 'config.toml'}"]

    def registry_argv(self) -> list[str]:
        return ["docker-registry", "serve", str(self.root / "registry.yaml")]

    def kubelet_argv(self) -> list[str]:
        return [
            str(self.bin_dir / "kubelet"),
            f"--config={self.root / 'kubelet.yaml'}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.kubelet_dir}",
            f"--cert-dir={self.kubelet_dir / 'pki'}",
            f"--hostname-override={self.node_name}",
            f"--node-ip={self.ip}",
            "--v=1",
        ]

    def csi_node_argv(self, binary: Path, volumes_dir: Path) -> list[str]:
        """The CSI node plugin of the provisioner's CSI classes on this node: its socket under
        the kubelet's ``plugins/``, its registration socket where the kubelet's plugin watcher
        finds it (``plugins_registry/``)."""
        registration = self.kubelet_dir / "plugins_registry" / f"{CSI_DRIVER}-reg.sock"
        return [
            str(binary),
            f"--node-id={self.node_name}",
            f"--endpoint={self.kubelet_dir / 'plugins' / CSI_DRIVER / 'csi.sock'}",
            f"--registration-socket={registration}",
            f"--volumes-dir={volumes_dir}",
        ]

    def kube_proxy_argv(self) -> list[str]:
        return [str(self.bin_dir / "kube-proxy"), f"--config={self.root / 'kube-proxy.yaml'}"]

    # -- cgroups ---------------------------------------------------------------------------
    def hierarchies(self) -> list[Path]:
        return [
            d
            for d in sorted(CGROUP_ROOT.iterdir())
            if d.is_dir() and not d.is_symlink() and (d / "cgroup.procs").exists()
        ]

    def make_cgroups(self) -> None:
        """The kubelet's ``cgroupRoot``, one per cluster in every hierarchy, so that pods of
        two real-node clusters never share ``/kubepods`` and a teardown can find its own."""
        for h in self.hierarchies():
            d = h / self.cgroup_name
            d.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):
                if (d / knob).exists() and not (d / knob).read_text().strip():
                    (d / knob).write_text((h / knob).read_text())

    def record(self) -> None:
        """Name this node's namespace and cgroup in its state, for :func:`sweep`."""
        (self.root / "names").write_text(f"{self.netns.name}\n{self.cgroup_name}\n")

    def kill_and_remove_cgroups(self) -> None:
        """SIGKILL every process left in this node's cgroups, remove the pod network
        namespaces they held (``/run/netns/cni-*``, which only the CRI would delete), then
        remove the cgroups bottom up."""
        pod_netns: set[int] = set()
        for h in self.hierarchies():
            top = h / self.cgroup_name
            if not top.is_dir():
                continue
            for procs in top.rglob("cgroup.procs"):
                for pid in procs.read_text().split():
                    try:
                        pod_netns.add(os.stat(f"/proc/{pid}/ns/net").st_ino)
                        os.kill(int(pid), signal.SIGKILL)
                    except (ProcessLookupError, FileNotFoundError):
                        pass
        for path in NETNS_DIR.glob("cni-*"):
            try:
                if path.stat().st_ino in pod_netns:
                    subprocess.run(["umount", str(path)], capture_output=True, check=False)
                    path.unlink()
            except OSError:
                pass
        for h in self.hierarchies():
            top = h / self.cgroup_name
            if not top.is_dir():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                _rmdir_retry(d)
            _rmdir_retry(top)

    def kill_shims(self) -> None:
        """The runc shims of this containerd (they leave its process group on purpose)."""
        _kill_shims_of(str(self.containerd_socket))

    # -- images ----------------------------------------------------------------------------
    def push_images(self) -> None:
        """The pause image and, if built, the product images into the namespace's registry."""
        pause = self.root / "pause-oci"
        write_pause_layout(self.bin_dir / "pause", pause)
        pushes = [(f"oci:{pause}:pause", "pause:3.10.1")]
        if self.images_dir is not None:
            for ref, name in product_image_refs(self.images_dir).items():
                repo = name.split("/", 1)[1]  # cdi-py/cdi-controller:latest
                pushes.append((f"oci:{self.images_dir}:{ref}", repo))
        for src, dest in pushes:
            argv = [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                src,
                f"docker://{REGISTRY}/{dest}",
            ]
            proc = subprocess.run(
                self.netns.argv(argv), capture_output=True, text=True, timeout=300, check=False
            )
            if proc.returncode:
                raise RealNodeFailed(f"{' '.join(argv)}: {proc.stderr.strip()}")


def _rmdir_retry(d: Path) -> None:
    for _ in range(50):
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)


def sweep(state: Path) -> None:
    """Release what a killed harness's real node left: its containers (by cgroup), its runc
    shims (by containerd socket), its cgroups and its network namespace. ``state`` is a dead
    cluster's state directory (its ``cluster.lock`` free)."""
    for names in sorted(state.glob("realnode*/names")):
        netns_name, cgroup_name = names.read_text().split()[:2]
        ns = NetNamespace(netns_name)
        node = RealNode(state, ns, Path(), "", Path(), Path(), cgroup_name, None)
        _kill_shims_of(str(names.parent / "containerd" / "containerd.sock"))
        node.kill_and_remove_cgroups()
        ns.delete()


def _kill_shims_of(socket_path: str) -> None:
    needle = socket_path.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if b"containerd-shim" in cmdline and needle in cmdline:
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass
