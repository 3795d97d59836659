"""Host-assisted (``copy``) clones on the real control plane with the product installed.

The target classes ``copy-fs`` / ``copy-block`` are the local provisioner's, with their
StorageProfiles set to ``cloneStrategy: copy``, so every clone into them runs an upload server
on the target claim and a ``python -m cloner`` source pod beside the source claim, talking
mutual TLS through the Service's ClusterIP. Filesystem -> filesystem (in the source's namespace,
into a bigger target), block -> block across namespaces, filesystem -> block and block ->
filesystem: the content is the imported image, the target as sparse as its source, the pods,
Services and Secrets of the clone are gone afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    COPY_CLASS,
    Images,
    ImageServer,
    condition,
    dv_path,
    event_reasons,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.test_clone_csi import (
    allocated,
    data_of,
    import_source,
    succeeded,
)

pytestmark = pytest.mark.integration


def copy_of(name: str, ns: str, source: str, mode: str, size: str | None = None) -> dict:
    storage: dict[str, Any] = {"storageClassName": COPY_CLASS[mode], "volumeMode": mode}
    if size:
        storage["resources"] = {"requests": {"storage": size}}
    spec = {"source": {"pvc": {"namespace": ns, "name": source}}, "storage": storage}
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def assert_copied(kube: Kube, images: Images, src: tuple[str, str], dst: tuple[str, str]) -> None:
    same_prefix_then_zeros(data_of(kube, *dst), images.reference)
    assert allocated(kube, *dst) <= 1.01 * allocated(kube, *src), (src, dst)
    pvc = kube.get(ns_path(dst[0], "persistentvolumeclaims", dst[1]))
    ann = pvc["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/cloneType"] == "copy"
    assert ann["k8s.io/CloneRequest"] == f"{src[0]}/{src[1]}"
    assert ann["cdi.kubevirt.io/storage.pod.phase"] == "Succeeded"
    uid = pvc["metadata"]["uid"]

    def cleaned() -> bool:
        gone = [
            ns_path(src[0], "pods", f"{uid}-source-pod"),
            ns_path(src[0], "secrets", f"{uid}-source-pod-tls"),
            ns_path(dst[0], "pods", f"cdi-upload-{dst[1]}"),
            ns_path(dst[0], "services", f"cdi-upload-{dst[1]}"),
        ]
        return all(kube.get_or_none(path) is None for path in gone)

    wait_until(cleaned, f"the clone's pods, Services and Secrets of {dst} gone", 60)


def test_copy_clones_across_modes_namespaces_and_sizes(
    kube: Kube, namespace: str, other_namespace: str, copy_classes: None,
    image_server: ImageServer, images: Images,
) -> None:  # fmt: skip
    import_source(kube, image_server, namespace, "golden-fs", "Filesystem")
    import_source(kube, image_server, namespace, "golden-block", "Block")
    succeeded(kube, namespace, "golden-fs")
    succeeded(kube, namespace, "golden-block")
    clones = [  # (namespace, name, source, target mode, size)
        (namespace, "fs-fs", "golden-fs", "Filesystem", None),
        (other_namespace, "block-block", "golden-block", "Block", "96Mi"),
        (namespace, "fs-block", "golden-fs", "Block", None),
        # a small ext4 keeps more than CDI's 5.5 % to itself: room for the device's bytes
        (other_namespace, "block-fs", "golden-block", "Filesystem", "96Mi"),
    ]
    for ns, name, source, mode, size in clones:
        kube.create(dv_path(ns), copy_of(name, namespace, source, mode, size))
    kube.create(dv_path(namespace), copy_of("small", namespace, "golden-fs", "Filesystem", "16Mi"))
    for ns, name, source, _, _ in clones:
        dv = succeeded(kube, ns, name, timeout=180)
        assert condition(dv, "Running")["message"] == "Clone Complete", dv["status"]
        assert dv["status"]["progress"] == "100.0%", dv["status"]
        assert_copied(kube, images, (namespace, source), (ns, name))
        event_reasons(kube, ns, name, {"CloneScheduled", "CloneSucceeded"})
    size = kube.get(ns_path(other_namespace, "persistentvolumeclaims", "block-block"))["spec"]
    assert int(size["resources"]["requests"]["storage"]) == 96 * 1024 * 1024
    bound = condition(kube.get(dv_path(namespace, "small")), "Bound")
    assert bound["reason"] == "ErrIncompatiblePVC", bound
    for source in ("golden-fs", "golden-block"):  # the sources are intact and unused
        same_prefix_then_zeros(data_of(kube, namespace, source), images.reference)
