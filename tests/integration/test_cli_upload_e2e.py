"""``cdi upload dv`` end to end, as a user runs it: in a pseudo-terminal, against the product
installed from deploy/ (controller with the upload flavour, token API, upload proxy), with the
upload proxy reached through a loopback TCP relay this test controls. The relay slows the
bytes (so the bar has time to move) and drops the connection once, mid-way: the command must
resume from the server's offset, draw a moving progress bar, exit 0, and leave a DataVolume
that Succeeded with the image's exact content.
"""

from __future__ import annotations

import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube
from testkit.product import Product
from tests.integration import test_cli_upload
from tests.integration.datavolumes import cdi_env
from tests.integration.datavolumes.cdi_env import DV_API, Images, pv_of, same_prefix_then_zeros
from tests.integration.test_tryout import REPO, Terminal

pytestmark = pytest.mark.integration
# The DataVolume tests' session fixtures: CRDs, test images, the installed product.
cdi_crds, images, product = cdi_env.cdi_crds, cdi_env.images, cdi_env.product
proxy_override = test_cli_upload.proxy_override
DRAWN = re.compile(r"([0-9.]+)/([0-9.]+) MB")


class CuttingRelay:
    """127.0.0.1 -> ``upstream``: bytes towards the proxy at ``rate``; the first connection
    that carries more than ``cut_at`` bytes upstream is dropped there, once."""

    def __init__(self, upstream: tuple[str, int], rate: int, cut_at: int) -> None:
        self.upstream, self.rate, self.cut_at = upstream, rate, cut_at
        self.cuts = 0
        self.sent = 0  # bytes relayed upstream, over all connections
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(server, client), daemon=True).start()

    def _up(self, src: socket.socket, dst: socket.socket) -> None:
        moved = 0
        budget = self.cut_at if not self.cuts else None
        try:
            while data := src.recv(16384):
                if budget is not None and moved + len(data) > budget:
                    dst.sendall(data[: budget - moved])
                    self.sent += budget - moved
                    self.cuts += 1
                    break
                dst.sendall(data)
                moved += len(data)
                self.sent += len(data)
                time.sleep(len(data) / self.rate)
        except OSError:
            pass
        for s in (src, dst):
            _close(s)

    def _down(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            _close(s)

    def close(self) -> None:
        self.listener.close()


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


@pytest.fixture
def relay_to_proxy(kube: Kube, product: Product) -> Iterator[Callable[[int, int], CuttingRelay]]:
    svc = kube.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")
    upstream = (svc["spec"]["clusterIP"], 443)
    made: list[CuttingRelay] = []

    def make(cut_at: int, rate: int) -> CuttingRelay:
        made.append(CuttingRelay(upstream, rate, cut_at))
        return made[-1]

    yield make
    for r in made:
        r.close()


def diagnose(cluster: Cluster, kube: Kube, ns: str, name: str) -> str:
    """What the cluster says about the DataVolume, for a failure message."""
    dv = kube.get_or_none(f"{DV_API}/namespaces/{ns}/datavolumes/{name}") or {}
    events = kube.get(f"/api/v1/namespaces/{ns}/events")["items"]
    pods = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    pvc = kube.get_or_none(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}") or {}
    lines = [f"\nDV status: {dv.get('status')}", f"PVC: {pvc.get('metadata')} {pvc.get('spec')}"]
    log = cluster.state / "logs" / "provisioner.log"
    lines.append(log.read_text(errors="replace")[-2000:] if log.exists() else "no provisioner log")
    lines += [f"event {e['involvedObject']['name']}: {e['reason']}: {e['message']}" for e in events]
    for pod in pods:
        pod_name = pod["metadata"]["name"]
        lines.append(f"pod {pod_name}: {pod.get('status', {}).get('phase')}")
        for c in pod["spec"]["containers"]:
            lines.append(cluster.container_log(ns, pod_name, c["name"])[-1500:])
    return "\n".join(lines)


def run_in_terminal(argv: list[str], timeout: float = 240) -> Terminal:
    term = Terminal([sys.executable, "-m", "cdi", "upload", *argv], REPO)
    term.wait(timeout)
    return term


@pytest.mark.parametrize(
    ("image", "volume_mode", "discovery"),
    [("disk.raw", "filesystem", "cdiconfig"), ("disk.qcow2", "block", "flag")],
)
def test_upload_in_a_terminal_resumes_after_a_cut_and_succeeds(
    cluster: Cluster,
    kube: Kube,
    namespace: str,
    images: Images,
    relay_to_proxy: Callable[[int, int], CuttingRelay],
    proxy_override: Callable[[str], None],
    image: str,
    volume_mode: str,
    discovery: str,
) -> None:
    path = images.path(image)
    size = path.stat().st_size
    relay = relay_to_proxy(size // 2, max(size // 5, 1024 * 1024))  # about 5 s of sending
    where = [f"--uploadproxy-url=https://127.0.0.1:{relay.port}"]
    if discovery == "cdiconfig":  # no flag: the address comes from CDIConfig, no scheme
        proxy_override(f"127.0.0.1:{relay.port}")
        where = []
    storage_class = "testkit-block" if volume_mode == "block" else "testkit-fs"
    term = run_in_terminal(
        [
            "dv",
            "up",
            f"--image-path={path}",
            "--size=32Mi",
            f"--storage-class={storage_class}",
            f"--volume-mode={volume_mode}",
            "--insecure",
            "--wait-secs=90",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={namespace}",
            *where,
        ]
    )
    text = term.text
    assert term.exit_code == 0, text[-3000:] + diagnose(cluster, kube, namespace, "up")
    assert f"DataVolume {namespace}/up created" in text
    assert f"Uploading data to https://127.0.0.1:{relay.port}" in text
    assert "resumed 1 time(s)" in text
    assert "Processing completed successfully" in text
    assert f"DataVolume {namespace}/up phase: Succeeded" in text
    # The bar moved: drawn at several byte counts on its way to the total. (Progress counts
    # bytes handed to the socket, so a file of a few MiB fits in the socket buffers at once:
    # only the 24 MiB raw image shows the bar moving.)
    drawn = {float(done) for done, _ in DRAWN.findall(re.sub(r"\x1b\[[0-9;]*m", "", text))}
    if size > 16 * 1024 * 1024:
        assert len(drawn) >= 4, drawn
    assert max(drawn) == round(size / 1e6, 1), drawn
    # Resumed, not restarted: the relay carried the file about once, not one and a half times.
    assert relay.cuts == 1 and relay.sent < size * 1.3, (relay.sent, size)
    dv = kube.get(f"{DV_API}/namespaces/{namespace}/datavolumes/up")
    assert dv["status"]["phase"] == "Succeeded"
    local = Path(pv_of(kube, namespace, "up")["spec"]["local"]["path"])
    same_prefix_then_zeros(
        local if volume_mode == "block" else local / "disk.img", images.reference
    )


def test_upload_pvc_fills_a_plain_pvc_and_a_second_upload_is_refused(
    cluster: Cluster, kube: Kube, namespace: str, images: Images, product: Product
) -> None:
    svc = kube.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")
    args = [
        "pvc",
        "again",
        f"--image-path={images.path('disk.qcow2')}",
        "--size=32Mi",
        "--insecure",
        f"--uploadproxy-url={svc['spec']['clusterIP']}:443",
        f"--kubeconfig={cluster.kubeconfig}",
        f"--namespace={namespace}",
    ]
    first = run_in_terminal(args)
    assert first.exit_code == 0, first.text[-3000:] + diagnose(cluster, kube, namespace, "again")
    assert f"PersistentVolumeClaim {namespace}/again created" in first.text
    assert "Processing completed successfully" in first.text
    local = Path(pv_of(kube, namespace, "again")["spec"]["local"]["path"])
    same_prefix_then_zeros(local / "disk.img", images.reference)
    second = run_in_terminal(args)
    assert second.exit_code == 1
    assert "PVC again already successfully imported/cloned/updated" in second.text


def test_upload_with_datasource_and_defaults_labels_the_volume_and_repoints_the_datasource(
    cluster: Cluster, kube: Kube, namespace: str, images: Images, product: Product
) -> None:
    """virtctl's ``--datasource``, ``--default-instancetype`` and ``--default-preference``: the
    DataVolume (and so its claim) and the DataSource carry the labels; a DataSource of the name
    that pointed elsewhere now points at the uploaded volume, its own labels kept."""
    datasources = f"{DV_API}/namespaces/{namespace}/datasources"
    kube.create(
        datasources,
        {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
         "metadata": {"name": "golden", "labels": {"team": "vms"}},
         "spec": {"source": {"pvc": {"name": "older", "namespace": namespace}}}},
    )  # fmt: skip
    svc = kube.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")
    term = run_in_terminal(
        [
            "dv",
            "golden",
            f"--image-path={images.path('disk.qcow2')}",
            "--size=32Mi",
            "--insecure",
            "--datasource",
            "--default-instancetype=u1.small",
            "--default-instancetype-kind=VirtualMachineClusterInstancetype",
            "--default-preference=fedora",
            f"--uploadproxy-url={svc['spec']['clusterIP']}:443",
            f"--kubeconfig={cluster.kubeconfig}",
            f"--namespace={namespace}",
        ]
    )
    assert term.exit_code == 0, term.text[-3000:] + diagnose(cluster, kube, namespace, "golden")
    assert f"DataSource {namespace}/golden updated" in term.text
    labels = {
        "instancetype.kubevirt.io/default-instancetype": "u1.small",
        "instancetype.kubevirt.io/default-instancetype-kind": "VirtualMachineClusterInstancetype",
        "instancetype.kubevirt.io/default-preference": "fedora",
    }
    dv = kube.get(f"{DV_API}/namespaces/{namespace}/datavolumes/golden")
    pvc = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/golden")
    for obj in (dv, pvc):
        assert labels.items() <= obj["metadata"]["labels"].items(), obj["metadata"]
    ds = kube.get(f"{datasources}/golden")
    assert ds["spec"]["source"] == {"pvc": {"name": "golden", "namespace": namespace}}
    assert {"team": "vms", **labels}.items() <= ds["metadata"]["labels"].items()
    local = Path(pv_of(kube, namespace, "golden")["spec"]["local"]["path"])
    same_prefix_then_zeros(local / "disk.img", images.reference)
