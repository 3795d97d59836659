"""``cdi upload`` through the deployed upload proxy (the token API, the proxy, the upload server
pod: all containers), to a filesystem and a block volume at once; then host-assisted clones of
both into another namespace, filesystem to block and block to filesystem (cloner source pod +
upload server). Every volume holds ``qemu-img convert``'s bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from testkit.cluster import REPO_ROOT, Cluster
from testkit.kubeclient import Kube
from testkit.product import Product
from tests.e2e.conftest import Served, make_namespace
from tests.integration.datavolumes.cdi_env import (
    datavolume,
    dv_path,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)

pytestmark = pytest.mark.e2e

# upload -> (storage class, --volume-mode); clone -> (source upload, storage class, volumeMode)
UPLOADS = {"up-fs": ("testkit-fs", "filesystem"), "up-block": ("testkit-block", "block")}
CLONES = {
    "clone-block": ("up-fs", "testkit-block", "Block"),
    "clone-fs": ("up-block", "testkit-fs", "Filesystem"),
}


def _disk(kube: Kube, ns: str, name: str, block: bool) -> Path:
    path = volume_dir(kube, ns, name)
    return path if block else path / "disk.img"


def _upload(cluster: Cluster, served: Served, ns: str, name: str) -> subprocess.Popen[str]:
    storage_class, mode = UPLOADS[name]
    kube = cluster.kube()
    svc = kube.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    argv = [
        sys.executable, "-m", "cdi", "upload", "dv", name,
        f"--image-path={served.images.path('disk.qcow2')}", "--size=64Mi",
        f"--storage-class={storage_class}", f"--volume-mode={mode}", "--insecure",
        f"--uploadproxy-url={svc['spec']['clusterIP']}:443",
        f"--kubeconfig={cluster.kubeconfig}", f"--namespace={ns}",
    ]  # fmt: skip
    # The ClusterIP is reached where kube-proxy's rules are: inside the namespace.
    return subprocess.Popen(
        cluster.in_network(argv),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_upload_through_the_deployed_proxy_then_host_assisted_clones_across_namespaces(
    cluster: Cluster, kube: Kube, product: Product, served: Served, namespace: str
) -> None:
    reference = served.images.reference
    uploads = {name: _upload(cluster, served, namespace, name) for name in UPLOADS}
    for name, proc in uploads.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"cdi upload {name}: {out[-3000:]}"
    for name, (_, mode) in UPLOADS.items():
        dv = wait_phase(kube, namespace, name, ("Succeeded",), timeout=120)
        assert dv["status"]["progress"] == "100.0%", dv["status"]
        same_prefix_then_zeros(_disk(kube, namespace, name, mode == "block"), reference)

    target = make_namespace(kube, f"{namespace[:50]}-clone")
    try:
        for name, (source, storage_class, mode) in CLONES.items():
            spec = {"pvc": {"namespace": namespace, "name": source}}
            kube.create(
                dv_path(target), datavolume(name, spec, storage_class=storage_class, mode=mode)
            )
        for name, (_, _, mode) in CLONES.items():
            dv = wait_phase(kube, target, name, ("Succeeded", "Failed"), timeout=300)
            assert dv["status"]["phase"] == "Succeeded", dv["status"]
            same_prefix_then_zeros(_disk(kube, target, name, mode == "Block"), reference)
    finally:
        kube.delete_ignore_missing(f"/api/v1/namespaces/{target}")
