"""``spec.preallocation`` on the real API server: an HTTP import and a host-assisted clone of
it with preallocation write every byte of the target (not sparse) and record
``cdi.kubevirt.io/storage.preallocation: "true"`` on the claim, as CDI does (KubeVirt reads it);
without preallocation the target stays sparse and carries no such record (issue 27)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    datavolume,
    dv_path,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.test_clone_copy import copy_of
from tests.integration.datavolumes.test_clone_csi import data_of, succeeded

pytestmark = pytest.mark.integration
APPLIED = "cdi.kubevirt.io/storage.preallocation"


def preallocated(dv: dict[str, Any]) -> dict[str, Any]:
    dv["spec"]["preallocation"] = True
    return dv


def claim_annotations(kube: Kube, ns: str, name: str) -> dict[str, str]:
    pvc = kube.get(ns_path(ns, "persistentvolumeclaims", name))
    return dict(pvc["metadata"].get("annotations") or {})


def allocated_share(kube: Kube, ns: str, name: str) -> float:
    st = os.stat(data_of(kube, ns, name))
    return st.st_blocks * 512 / st.st_size


def test_preallocated_import_and_clone_write_every_byte_and_say_so(
    kube: Kube, namespace: str, copy_classes: None, image_server: ImageServer, images: Images
) -> None:
    url = image_server.url("ok", "disk.qcow2")
    kube.create(dv_path(namespace), preallocated(datavolume("full", {"http": {"url": url}})))
    kube.create(dv_path(namespace), datavolume("sparse", {"http": {"url": url}}))
    for name in ("full", "sparse"):
        succeeded(kube, namespace, name)
        same_prefix_then_zeros(data_of(kube, namespace, name), images.reference)
    assert claim_annotations(kube, namespace, "full")[APPLIED] == "true"
    assert APPLIED not in claim_annotations(kube, namespace, "sparse")
    assert allocated_share(kube, namespace, "full") > 0.99
    assert allocated_share(kube, namespace, "sparse") < 0.5

    # sized as the source: unsized, CDI's size detection asks for the image's virtual size
    # over the configured overhead (6%), and a 64 MB ext4 volume loses 15% (journal, inode
    # tables), so writing every byte would not fit (as on CDI; a sparse copy does)
    clone = preallocated(copy_of("full-copy", namespace, "sparse", "Filesystem", size="64Mi"))
    kube.create(dv_path(namespace), clone)
    succeeded(kube, namespace, "full-copy", timeout=180)
    same_prefix_then_zeros(data_of(kube, namespace, "full-copy"), images.reference)
    assert claim_annotations(kube, namespace, "full-copy")[APPLIED] == "true"
    assert allocated_share(kube, namespace, "full-copy") > 0.99
