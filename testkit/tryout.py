"""The one-command local try-out: a real cluster with the product installed from ``deploy/``,
an example disk image served on loopback, and a copy-paste DataVolume, until Ctrl-C.

``scripts/tryout.sh`` installs what is needed and runs ``python -m testkit.tryout``. The steps
are the integration tests' own (``testkit.cluster`` starts the control plane and the local
node, ``testkit.product`` applies ``crds/`` and ``deploy/`` with kubectl), so what a user tries
is what CI checks. The example is CDI's documented import DataVolume with its URL pointing at
the image this process serves; the README shows the same text (a test compares them).
Ctrl-C (or SIGTERM/SIGHUP) stops the image server and the cluster, which unmounts volumes,
detaches loop devices, kills every pod process and removes the state directory.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

import yaml

from testkit.cluster import REPO_ROOT, Cluster, ClusterConfig, ClusterStartFailed
from testkit.procs import ComponentDied
from testkit.product import Product, ProductNotReady

IMAGE_NAME = "tryout-disk.qcow2"
DEFAULT_IMAGE_PORT = 8088
IMAGE_SIZE = 32 * 1024 * 1024  # fits the example's 64Mi with CDI's filesystem overhead
# CDI's documented import DataVolume (doc/datavolumes.md), served from loopback instead.
EXAMPLE = """\
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: "example-import-dv"
spec:
  source:
      http:
         url: "http://{hostport}/{image}"
  pvc:
    accessModes:
      - ReadWriteOnce
    resources:
      requests:
        storage: "64Mi"
"""


def example_datavolume(hostport: str) -> str:
    return EXAMPLE.format(hostport=hostport, image=IMAGE_NAME)


def build_example_image(work: Path) -> Path:
    """A small ext4 disk holding this project's README and control-plane code, as qcow2: real
    files, mostly holes, made with the same tools a user would (mkfs.ext4 -d, qemu-img)."""
    stage, raw, image = work / "stage", work / "disk.raw", work / IMAGE_NAME
    stage.mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO_ROOT / "README.md", stage / "README.md")
    shutil.copytree(REPO_ROOT / "cdi", stage / "cdi", ignore=shutil.ignore_patterns("__pycache__"))
    with open(raw, "wb") as fh:
        fh.truncate(IMAGE_SIZE)
    run = functools.partial(subprocess.run, check=True, capture_output=True)
    run(["mkfs.ext4", "-q", "-F", "-L", "tryout", "-d", str(stage), str(raw)])
    run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(image)])
    raw.unlink()
    shutil.rmtree(stage)
    return image


class ImageServer:
    """Serves one directory over HTTP on 127.0.0.1 (the standard library's file handler:
    Content-Length, HEAD, no directory listing needed) in a background thread. With a real-node
    ``cluster`` it listens where its pods reach instead: on ``cluster.host_address``, inside
    the cluster's network namespace."""

    def __init__(self, root: Path, port: int, cluster: Cluster | None = None) -> None:
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.host = "127.0.0.1"
        if cluster is not None and cluster.config.real_node:
            self.host = cluster.host_address
            self.httpd = cluster.network_call(
                lambda: ThreadingHTTPServer((self.host, port), handler)
            )
        else:
            self.httpd = ThreadingHTTPServer((self.host, port), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def hostport(self) -> str:
        return f"{self.host}:{self.httpd.server_address[1]}"

    def start(self) -> ImageServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def allow_example_server(product: Product, cluster: Cluster) -> None:
    """Imports may reach only public addresses unless CDIConfig allows more (README, "What an
    import may connect to"): allow the example server (127.0.0.1, or a real node's address), as
    an operator allows an internal mirror, and name the cluster's own ranges, which stay
    refused."""
    config = {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "CDIConfig",
        "metadata": {"name": "config"},
        "spec": {
            "importPolicy": {
                "allowedSourceCIDRs": [f"{cluster.host_address}/32"],
                "clusterCIDRs": [cluster.pod_cidr, cluster.service_cidr],
            }
        },
    }
    product.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(config))


def instructions(cluster: Cluster, product: Product, server: ImageServer) -> str:
    bin_dir = cluster.config.bin_dir
    example = example_datavolume(server.hostport)
    real = cluster.realnode
    pods = real.pod_logs_dir if real is not None else cluster.state / "node" / "pods"
    cidr = f"{server.host}/32"
    return f"""\
cdi-py try-out: cluster ready in {cluster.started_in:.1f} s, \
crds/ and deploy/ applied in {product.installed_in:.1f} s
kubeconfig: {cluster.kubeconfig}
example image: http://{server.hostport}/{IMAGE_NAME} (CDIConfig allows imports from {cidr})
logs: {cluster.state / "logs"} (components), {pods} (pods)

In another shell on this machine, as root:

export KUBECONFIG={cluster.kubeconfig} PATH={bin_dir}:$PATH
kubectl get pods -n cdi
kubectl apply -f - <<'EOF'
{example}EOF
kubectl get dv example-import-dv -w

Ctrl-C here stops everything and cleans up (mounts, loop devices, processes, state).
"""


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def run(state: Path, image_port: int, real_node: bool = False) -> int:
    # SIGINT too: a shell starts background jobs with it ignored, and Python then leaves it so.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    cluster = Cluster(
        ClusterConfig(state_dir=state, node="real") if real_node else ClusterConfig(state_dir=state)
    )
    server: ImageServer | None = None
    status = 0
    try:
        print("cdi-py try-out: building the example image", flush=True)
        image = build_example_image(state / "tryout")
        if not cluster.config.real_node:
            server = ImageServer(image.parent, image_port).start()
        print(f"cdi-py try-out: starting the cluster in {state}", flush=True)
        cluster.start()
        if server is None:  # a real node's: inside its network namespace, made by start()
            server = ImageServer(image.parent, image_port, cluster).start()
        print("cdi-py try-out: applying crds/ and deploy/ with kubectl", flush=True)
        product = Product.on(cluster).install()
        allow_example_server(product, cluster)
        print(instructions(cluster, product, server), flush=True)
        while True:
            for proc in cluster.processes:
                proc.check_alive()
            time.sleep(1.0)
    except KeyboardInterrupt:
        print("\ncdi-py try-out: stopping and cleaning up", flush=True)
    except (ComponentDied, ClusterStartFailed, ProductNotReady) as e:
        print(f"\ncdi-py try-out: {e}\ncdi-py try-out: stopping and cleaning up", flush=True)
        status = 1
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
        if server is not None:
            server.stop()
        cluster.stop()
    print("cdi-py try-out: stopped", flush=True)
    return status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/tryout.sh",
        description="A local cluster with cdi-py installed from deploy/, until Ctrl-C.",
    )
    parser.add_argument(
        "--image-port",
        type=int,
        default=DEFAULT_IMAGE_PORT,
        help="loopback port serving the example image (0: any free port)",
    )
    parser.add_argument("--state-dir", type=Path, help="default: a new /tmp/testkit-* dir")
    parser.add_argument(
        "--real-node",
        action="store_true",
        help="a real kubelet + containerd in a network namespace (docs/kube-harness.md)",
    )
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        parser.error("needs root (loop devices, mounts and mount namespaces, as the tests)")
    state = args.state_dir or Path(tempfile.mkdtemp(prefix="testkit-"))
    return run(state, args.image_port, args.real_node)


if __name__ == "__main__":
    raise SystemExit(main())
