"""CDI's documented http and blank DataVolumes work as documented: applied through our admission
webhook with the controller running, every one reaches Succeeded.

The manifests are ``tests/integration/data/cdi-examples.yaml`` (CDI's forms, URLs pointed at the
loopback image server). The webhook is the one ``test_admission`` starts, scoped to a namespace
of its own."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path
from string import Template
from typing import Any

import pytest
import yaml

from testkit.kubeclient import Kube
from tests.integration.datavolumes.cdi_env import (
    REPO,
    ControllerProcess,
    Images,
    ImageServer,
    condition,
    dv_path,
    wait_phase,
)
from tests.integration.datavolumes.test_admission import admission  # noqa: F401

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "tests" / "integration" / "data" / "cdi-examples.yaml"


def archive(root: Path) -> str:
    """A small tar of two files next to the images; returns its name."""
    (root / "archive").mkdir(exist_ok=True)
    (root / "archive" / "hello.txt").write_text("hello from a CDI archive import\n")
    (root / "archive" / "data.bin").write_bytes(bytes(range(256)) * 64)
    with tarfile.open(root / "files.tar", "w") as tar:
        for name in ("hello.txt", "data.bin"):
            tar.add(root / "archive" / name, arcname=name)
    return "files.tar"


def manifests(images: Images, server: ImageServer) -> list[dict[str, Any]]:
    image = images.path("disk.qcow2")
    values = {
        "IMAGE_URL": server.url("ok", image.name),
        "ARCHIVE_URL": server.url("ok", archive(images.root)),
        "IMAGE_SHA256": hashlib.sha256(image.read_bytes()).hexdigest(),
    }
    return [d for d in yaml.safe_load_all(Template(EXAMPLES.read_text()).substitute(values)) if d]


def test_cdis_documented_http_and_blank_datavolumes_reach_succeeded(
    kube: Kube,
    admission: str,  # noqa: F811
    controller: ControllerProcess,
    images: Images,
    image_server: ImageServer,
) -> None:
    ns = admission
    docs = manifests(images, image_server)
    for doc in docs:
        if doc["kind"] == "Secret":
            kube.create(f"/api/v1/namespaces/{ns}/secrets", doc)
    names = [d["metadata"]["name"] for d in docs if d["kind"] == "DataVolume"]
    for doc in docs:
        if doc["kind"] == "DataVolume":
            kube.create(dv_path(ns), doc)  # through the webhook: none is refused
    failed = {}
    for name in names:
        dv = wait_phase(kube, ns, name, ("Succeeded", "Failed"), 420)
        if dv["status"]["phase"] != "Succeeded":
            failed[name] = dv["status"]
        else:
            assert condition(dv, "Ready")["status"] == "True"
    assert not failed, failed
    assert len(names) >= 15
    pods = kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    retained = [p for p in pods if p["metadata"]["name"].startswith("importer-dv-pod-retain")]
    assert retained, "retainAfterCompletion keeps the importer pod"
