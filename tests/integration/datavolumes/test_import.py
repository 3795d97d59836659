"""DataVolume import and blank, end to end: the real API server, our CRDs, the controller as
a process, importer pods on the local node writing real volumes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cdi.api.quantity import Quantity
from cdi.render.pvc import required_space
from importer.target import usable_space

from testkit.kubeclient import Kube
from testkit.waiting import wait_until
from tests.integration.cdi_env import (  # noqa: F401  (fixtures)
    MiB,
    ControllerProcess,
    ImageServer,
    Images,
    cdi_crds,
    condition,
    controller,
    datavolume,
    dv_path,
    events_for,
    image_server,
    images,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)

pytestmark = pytest.mark.integration


def test_blank_datavolume_is_a_sparse_disk_of_the_requested_size(
    kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    kube.create(dv_path(namespace), datavolume("blank", {"blank": {}}, size="64Mi"))
    dv = wait_phase(kube, namespace, "blank", ("Succeeded", "Failed"), 90)
    assert dv["status"]["phase"] == "Succeeded", __import__("json").dumps(dv["status"], indent=1)
    assert dv["status"]["progress"] == "100.0%"
    assert condition(dv, "Ready")["status"] == "True"
    assert condition(dv, "Bound")["status"] == "True"
    running = condition(dv, "Running")
    assert running["status"] == "False" and running["reason"] == "Completed"
    pvc = kube.get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/blank")
    request = Quantity.parse(pvc["spec"]["resources"]["requests"]["storage"]).value()
    assert request == required_space(0.06, 64 * MiB)  # CDI's filesystem overhead
    disk = Path(pv_of(kube, namespace, "blank")["spec"]["local"]["path"])
    st = os.stat(disk / "disk.img")
    vfs = os.statvfs(disk)
    usable = usable_space(min(request, vfs.f_bavail * vfs.f_frsize), 0.06)
    assert usable - MiB <= st.st_size <= usable and st.st_size % MiB == 0
    assert st.st_blocks * 512 < MiB  # sparse
    # the importer pod is gone after success
    wait_until(lambda: not kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"],
               "importer pod deleted", 30)


def test_http_qcow2_xz_into_filesystem_volume_matches_qemu_img(
    kube: Kube, namespace: str, controller: ControllerProcess, image_server: ImageServer,
    images: Images,
) -> None:
    url = image_server.url("slow", "disk.qcow2.xz")
    kube.create(dv_path(namespace), datavolume("fromqcow", {"http": {"url": url}}, size="64Mi"))
    seen: list[dict] = []
    dv = wait_phase(kube, namespace, "fromqcow", ("Succeeded", "Failed"), 120, seen)
    assert dv["status"]["phase"] == "Succeeded", __import__("json").dumps(dv["status"], indent=1)
    phases = [s.get("phase") for s in seen]
    print(phases, [s.get("progress") for s in seen])
    disk = Path(pv_of(kube, namespace, "fromqcow")["spec"]["local"]["path"])
    same_prefix_then_zeros(disk / "disk.img", images.reference)
    reasons = [e["reason"] for e in events_for(kube, namespace, "fromqcow")]
    assert "ImportSucceeded" in reasons, reasons
