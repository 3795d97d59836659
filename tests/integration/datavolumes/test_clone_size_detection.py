"""Host-assisted clones without a size, of a filesystem source holding an image (issue 27; CDI
``detectCloneSize``), and ``permissiveClone``, on the real API server.

The source is a 64Mi filesystem import on ``testkit-fs`` (CDI's default 6 % overhead: its claim
asks for more than 64 MiB, and its ``disk.img`` is grown to what that claim holds: 64 MiB, or
less when the small ext4 has less free), which CDI's size-detection pod measures. The
copy class's filesystem overhead is 20 % (``test_clone_sizes``' operator setting). Taking the
source's request, as before, would leave the filesystem target too little room after its own
overhead; sized from the image, the target asks for the image plus 20 %, and a block target for
the image alone, marked permissive (its claim is smaller than the source's, as CDI marks it).
``cdi.kubevirt.io/permissiveClone: "true"`` lets a target smaller than the source's image be
created, which the size rule otherwise refuses with ``ErrIncompatiblePVC``."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from cdi.render.clone import usable_space
from cdi.render.pvc import required_space
from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes import test_clone_sizes
from tests.integration.datavolumes.cdi_env import (
    COPY_CLASS,
    Images,
    ImageServer,
    dv_path,
    events_for,
    same_prefix_then_zeros,
    volume_dir,
)
from tests.integration.datavolumes.test_clone_csi import data_of, import_source, succeeded
from tests.integration.datavolumes.test_clone_sizes import OVERHEAD

pytestmark = pytest.mark.integration
class_overhead = test_clone_sizes.class_overhead  # CDIConfig: 20 % for the copy classes
MiB = 1024 * 1024
IMAGE = 64 * MiB  # the source's disk.img: what its 64Mi storage-API claim holds
PERMISSIVE = "cdi.kubevirt.io/permissiveClone"


def clone(name: str, mode: str, source_ns: str, size: str | None = None, **ann: str) -> dict:
    storage: dict[str, Any] = {"storageClassName": COPY_CLASS[mode], "volumeMode": mode}
    if size is not None:
        storage["resources"] = {"requests": {"storage": size}}
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "annotations": ann},
            "spec": {"source": {"pvc": {"namespace": source_ns, "name": "golden"}},
                     "storage": storage}}  # fmt: skip


def claim_of(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    return kube.get(ns_path(ns, "persistentvolumeclaims", name))


def test_an_unsized_host_assisted_clone_is_sized_from_the_image_with_the_targets_overhead(
    kube: Kube, namespace: str, class_overhead: None, image_server: ImageServer, images: Images
) -> None:
    import_source(kube, image_server, namespace, "golden", "Filesystem")
    succeeded(kube, namespace, "golden")
    source_request = claim_of(kube, namespace, "golden")["spec"]["resources"]["requests"]
    kube.create(dv_path(namespace), clone("to-fs", "Filesystem", namespace))
    kube.create(dv_path(namespace), clone("to-block", "Block", namespace))

    for name in ("to-fs", "to-block"):
        succeeded(kube, namespace, name, timeout=240)
        same_prefix_then_zeros(data_of(kube, namespace, name), images.reference)
    # the size-detection pod's answer: disk.img as the import left it (grown to the claim's
    # usable space, or to what the small ext4 really has free when that is less)
    image = data_of(kube, namespace, "golden").stat().st_size
    assert 0 < image <= IMAGE
    fs = claim_of(kube, namespace, "to-fs")
    assert fs["spec"]["resources"]["requests"]["storage"] == str(required_space(OVERHEAD, image))
    block = claim_of(kube, namespace, "to-block")
    assert block["spec"]["resources"]["requests"]["storage"] == str(image)
    assert block["metadata"]["annotations"][PERMISSIVE] == "true"
    assert block["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    assert int(source_request["storage"]) > IMAGE  # what the target used to take


def test_permissive_clone_admits_a_target_smaller_than_the_sources_image(
    kube: Kube, namespace: str, class_overhead: None, image_server: ImageServer
) -> None:
    import_source(kube, image_server, namespace, "golden", "Filesystem")
    succeeded(kube, namespace, "golden")
    smaller = "63Mi"  # a device smaller than the source's 64 MiB disk.img
    kube.create(dv_path(namespace), clone("strict", "Block", namespace, smaller))
    kube.create(
        dv_path(namespace), clone("lenient", "Block", namespace, smaller, **{PERMISSIVE: "true"})
    )

    def refused() -> dict[str, Any] | None:
        conditions = (kube.get(dv_path(namespace, "strict")).get("status") or {}).get(
            "conditions"
        ) or []
        bound = next((c for c in conditions if c["type"] == "Bound"), {})
        return bound if bound.get("reason") == "ErrIncompatiblePVC" else None

    wait_until(refused, "the strict clone refused as too small", 60)
    assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", "strict")) is None
    lenient = wait_until(
        lambda: kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", "lenient")),
        "the permissive clone's claim",
        60,
    )
    assert lenient["spec"]["resources"]["requests"]["storage"] == str(63 * MiB)
    assert lenient["metadata"]["annotations"][PERMISSIVE] == "true"


def test_a_source_whose_image_is_smaller_than_its_volume_is_measured_by_a_pod(
    kube: Kube, namespace: str, class_overhead: None, images: Images
) -> None:
    """CDI's size-detection pod, for real: a 128Mi filesystem claim holding a 24 MiB raw
    ``disk.img`` (written straight into the volume, as a static or hand-filled one is). An
    unsized clone asks for the image plus the target class's overhead, not the volume's usable
    space; the pod's answer is cached on the source (CDI's keys) and the pod is gone; a second
    clone of the same source runs no pod."""
    source = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
              "metadata": {"name": "golden"},
              "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "testkit-fs",
                       "resources": {"requests": {"storage": "128Mi"}}}}  # fmt: skip
    kube.create(ns_path(namespace, "persistentvolumeclaims"), source)
    wait_until(
        lambda: claim_of(kube, namespace, "golden").get("status", {}).get("phase") == "Bound",
        "the source claim bound",
        60,
    )
    volume = volume_dir(kube, namespace, "golden")
    disk = volume / "disk.img"
    shutil.copyfile(images.reference, disk)
    os.chown(disk, 107, 107)
    image = images.reference.stat().st_size
    assert image < usable_space(0.06, 128 * MiB)  # what the clone took before size detection

    kube.create(dv_path(namespace), clone("first", "Filesystem", namespace))
    created = wait_until(
        lambda: [e for e in events_for(kube, namespace, "first")
                 if e["reason"] == "SizeDetectionPodCreated"],
        "the size-detection pod created",
        60,
    )  # fmt: skip
    assert created[0]["message"] == "Size-detection pod created"
    succeeded(kube, namespace, "first", timeout=240)
    same_prefix_then_zeros(data_of(kube, namespace, "first"), images.reference)
    first = claim_of(kube, namespace, "first")
    assert first["spec"]["resources"]["requests"]["storage"] == str(required_space(OVERHEAD, image))
    assert first["metadata"]["annotations"][PERMISSIVE] == "true"  # the source asks for more
    golden = claim_of(kube, namespace, "golden")
    ann = golden["metadata"]["annotations"]
    assert ann["cdi.Kubervirt.io/virtualSize"] == str(image)
    assert ann["cdi.Kubervirt.io/sourceCapacity"] == golden["status"]["capacity"]["storage"]
    uid = golden["metadata"]["uid"]
    wait_until(
        lambda: kube.get_or_none(ns_path(namespace, "pods", f"size-detection-{uid}")) is None,
        "the size-detection pod deleted",
        30,
    )

    kube.create(dv_path(namespace), clone("second", "Filesystem", namespace))
    succeeded(kube, namespace, "second", timeout=240)
    second = claim_of(kube, namespace, "second")
    assert second["spec"]["resources"]["requests"]["storage"] == str(
        required_space(OVERHEAD, image)
    )
    reasons = [e["reason"] for e in events_for(kube, namespace, "second")]
    assert "SizeDetectionPodCreated" not in reasons  # read from the cache
