"""What the populator and VM tests share: a bootable-data disk image and the manifests.

The disk is what a VM would get: an ext4 filesystem holding a marker file, made with
``mkfs.ext4 -d`` (no mount needed), sent as qcow2. ``MarkerDisk.reference`` is its raw form,
what the volume must hold byte for byte.
"""

from __future__ import annotations

import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from testkit.kubeclient import Kube
from testkit.vm import Boot
from testkit.vm import build as build_vm
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import DV_API, Images, run
from tests.integration.helpers import pvc_manifest

DISK_SIZE = "16M"


@dataclass(frozen=True)
class MarkerDisk:
    root: Path  # served by the image server: marker.qcow2
    reference: Path  # its raw bytes
    marker: str  # the text of /marker.txt on its filesystem

    @property
    def name(self) -> str:
        return "marker.qcow2"


def build_marker_disk(root: Path) -> MarkerDisk:
    root.mkdir(parents=True, exist_ok=True)
    tree = root / "marker-tree"
    tree.mkdir(exist_ok=True)
    marker = f"cdi-py-vm-marker-{secrets.token_hex(6)}"
    (tree / "marker.txt").write_text(marker + "\n")
    raw = root / "marker.raw"
    subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-L", "cdidisk", "-d", str(tree), str(raw), DISK_SIZE],
        check=True,
        capture_output=True,
    )
    run("qemu-img", "convert", "-f", "raw", "-O", "qcow2", raw, root / "marker.qcow2")
    return MarkerDisk(root, raw, marker)


@pytest.fixture(scope="session")
def marker_disk(images: Images) -> MarkerDisk:
    """Built next to the session's other images, so the image server serves it too."""
    return build_marker_disk(images.root)


def vis_path(ns: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/volumeimportsources" + (f"/{name}" if name else "")


def pvc_path(ns: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{ns}/persistentvolumeclaims" + (f"/{name}" if name else "")


def import_source(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "VolumeImportSource",
        "metadata": {"name": name},
        "spec": {"source": source},
    }


def populated_claim(
    name: str,
    source: str,
    size: str = "32Mi",
    storage_class: str = "testkit-fs",
    mode: str = "Filesystem",
) -> dict[str, Any]:
    pvc = pvc_manifest(name, size, storage_class, mode)
    pvc["spec"]["dataSourceRef"] = {
        "apiGroup": "cdi.kubevirt.io",
        "kind": "VolumeImportSource",
        "name": source,
    }
    return pvc


def start_population(
    kube: Kube, ns: str, url: str, storage_class: str = "testkit-fs", mode: str = "Filesystem"
) -> str:
    """A VolumeImportSource ``src`` for ``url`` and a claim ``disk`` naming it; the prime's name."""
    kube.create(vis_path(ns), import_source("src", {"http": {"url": url}}))
    target = kube.create(pvc_path(ns), populated_claim("disk", "src", "32Mi", storage_class, mode))
    return f"prime-{target['metadata']['uid']}"


def wait_claim_bound(kube: Kube, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    """The claim once it is Bound (a populated target binds when its data is in)."""

    def bound() -> dict[str, Any] | None:
        pvc = kube.get(pvc_path(ns, name))
        return pvc if pvc.get("status", {}).get("phase") == "Bound" else None

    return wait_until(bound, f"the claim {ns}/{name} Bound", timeout)


def claims(kube: Kube, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in kube.get(pvc_path(ns))["items"]}


def volumes_for(kube: Kube, ns: str) -> list[dict[str, Any]]:
    """PVs whose claimRef is in ``ns``."""
    return [
        pv
        for pv in kube.get("/api/v1/persistentvolumes")["items"]
        if (pv["spec"].get("claimRef") or {}).get("namespace") == ns
    ]


VM_DISK_DIR = "/var/run/kubevirt-private/vmi-disks/disk0"  # where KubeVirt mounts it
VM_DISK_DEVICE = "/dev/disk0"


def vm_pod(name: str, claim: str, block: bool = False) -> dict[str, Any]:
    """A VM's launcher pod with ``claim`` as its disk, as KubeVirt renders the volume: a
    filesystem volume mounted at the vmi-disks directory (``disk.img`` in it) or a block
    device."""
    container: dict[str, Any] = {
        "name": "compute",
        "image": "testkit/vm-launcher",
        "args": ["--disk", VM_DISK_DEVICE if block else VM_DISK_DIR],
    }
    if block:
        container["volumeDevices"] = [{"name": "disk0", "devicePath": VM_DISK_DEVICE}]
    else:
        container["volumeMounts"] = [{"name": "disk0", "mountPath": VM_DISK_DIR}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [container],
            "volumes": [{"name": "disk0", "persistentVolumeClaim": {"claimName": claim}}],
        },
    }


@pytest.fixture(scope="session")
def vm_boot() -> Boot:
    """The kernel and the cached initramfs, built before any VM pod needs them."""
    return build_vm()
