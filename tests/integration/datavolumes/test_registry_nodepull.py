"""Registry ``pullMethod: node`` end to end: the real API server, the product deployed from
deploy/ (webhook and admission policy included), and the local node pulling the containerDisk
for real (``testkit.runtime``: skopeo + umoci) from the anonymous ``docker-registry`` on
127.0.0.1 and running it as the importer pod's ``server`` container with the static holder;
the importer reads ``disk/`` through ``/proc/<pid>/root``. Also: CDI's ``ImagePullFailed`` for
an unknown tag, a symbolic link under ``disk/`` refused before any byte is read, and CDI's
message for two files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.containerdisk import Edit, Layout, add_disk, push
from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.registry import Registry
from tests.integration.datavolumes.cdi_env import (
    Images,
    condition,
    datavolume,
    dv_path,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
    wait_running_reason,
)

pytestmark = pytest.mark.integration
HOST_SECRET = b"a host file the importer must never read\n"


def _symlink_disk(target: Path) -> Edit:
    def edit(rootfs: Path) -> None:
        (rootfs / "disk").mkdir(exist_ok=True)
        os.symlink(str(target), rootfs / "disk" / "disk.img")

    return edit


@pytest.fixture(scope="module")
def registry(
    tmp_path_factory: pytest.TempPathFactory, images: Images
) -> Iterator[tuple[Registry, Path]]:
    """Repository names stay clear of the node map's globs (``*fedora*``, ``*python*`` ...)."""
    root = tmp_path_factory.mktemp("nodepull")
    reg = Registry(root / "reg").start()
    layout = Layout.create(root / "layout")
    host_file = root / "host-secret"
    host_file.write_bytes(HOST_SECRET)
    builds = {
        "qcow2": [add_disk(("disk.qcow2", images.path("disk.qcow2")))],
        "raw": [add_disk(("disk.img", images.path("disk.raw")))],
        "two": [add_disk(("a.img", b"a" * 4096), ("b.img", b"b" * 4096))],
        "link": [_symlink_disk(host_file)],
    }
    for tag, layers in builds.items():
        env = ["TEST_KUBEVIRT_IO_TEST=nodepull"] if tag == "qcow2" else []
        layout.build(tag, layers, env=env)
        reg.pushed[f"disks/np-{tag}"] = push(layout, tag, reg, f"disks/np-{tag}")
    yield reg, host_file
    reg.stop()


def _node_pull(url: str, **extra: Any) -> dict[str, Any]:
    return {"registry": {"url": url, "pullMethod": "node", **extra}}


@pytest.mark.parametrize("kind", ["qcow2", "raw"])
def test_node_pull_imports_the_containerdisk_and_records_the_digest(
    kube: Kube,
    namespace: str,
    controller: Product,
    registry: tuple[Registry, Path],
    images: Images,
    kind: str,
) -> None:
    reg, _ = registry
    repo = f"disks/np-{kind}"
    name = f"node-{kind}"
    kube.create(dv_path(namespace), datavolume(name, _node_pull(reg.url(repo, kind))))
    dv = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    disk = Path(pv_of(kube, namespace, name)["spec"]["local"]["path"]) / "disk.img"
    same_prefix_then_zeros(disk, images.reference)
    pvc = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")
    digest = pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.sourceDigest"]
    assert digest == reg.pushed[repo], "the digest is the kubelet's imageID of the pulled image"
    if kind == "qcow2":  # the image's KUBEVIRT_IO_ variables, read from the holder's environ
        assert pvc["metadata"]["labels"]["test.kubevirt.io/test"] == "nodepull"


def test_unknown_tag_is_image_pull_failed(
    kube: Kube, namespace: str, controller: Product, registry: tuple[Registry, Path]
) -> None:
    reg, _ = registry
    url = reg.url("disks/np-qcow2", "wrongtag")
    kube.create(dv_path(namespace), datavolume("node-missing", _node_pull(url)))

    running = wait_running_reason(kube, namespace, "node-missing", "ImagePullFailed")
    assert running["status"] == "False"
    assert running["message"].startswith("failed to pull image"), running


@pytest.mark.parametrize(
    ("kind", "reason", "message"),
    [
        ("link", "UnsafeImage", "disk/disk.img in the containerDisk is a symbolic link"),
        ("two", "InvalidImage", "image directory contains more than one file: disk/a.img"),
    ],
)
def test_a_broken_containerdisk_fails_with_its_reason_and_nothing_is_read(
    kube: Kube,
    namespace: str,
    controller: Product,
    registry: tuple[Registry, Path],
    kind: str,
    reason: str,
    message: str,
) -> None:
    """A link under disk/ (to a host file) is refused before a byte is read; two files get
    CDI's message."""
    reg, host_file = registry
    name = f"node-{kind}"
    kube.create(dv_path(namespace), datavolume(name, _node_pull(reg.url(f"disks/np-{kind}", kind))))
    dv = wait_phase(kube, namespace, name, ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Failed", dv["status"]
    running = condition(dv, "Running")
    assert running["reason"] == reason and running["message"].startswith(message), running
    volume = Path(pv_of(kube, namespace, name)["spec"]["local"]["path"])
    for path in volume.rglob("*"):
        assert not path.is_file() or HOST_SECRET not in path.read_bytes(), path
    assert host_file.read_bytes() == HOST_SECRET


def test_node_pull_for_an_absent_architecture_is_unschedulable(
    kube: Kube, namespace: str, controller: Product, registry: tuple[Registry, Path]
) -> None:
    """The platform becomes the nodeSelector ``kubernetes.io/arch``; no node has it (CDI)."""
    reg, _ = registry
    source = _node_pull(reg.url("disks/np-qcow2", "qcow2"), platform={"architecture": "absent"})
    kube.create(dv_path(namespace), datavolume("node-absent", source))
    running = wait_running_reason(kube, namespace, "node-absent", "Unschedulable")
    assert (running["status"], running["message"]) == ("False", "Importer pod cannot be scheduled")
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/importer-node-absent")
    assert pod["spec"]["nodeSelector"] == {"kubernetes.io/arch": "absent"}
