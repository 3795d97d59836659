"""Host-assisted clones without a size, of a filesystem source holding an image (issue 27; CDI
``detectCloneSize``), and ``permissiveClone``, on the real API server.

The source is a 64Mi filesystem import on ``testkit-fs`` (CDI's default 6 % overhead: its claim
asks for more than 64 MiB, and its ``disk.img`` is grown to the 64 MiB that claim holds). The
copy class's filesystem overhead is 20 % (``test_clone_sizes``' operator setting). Taking the
source's request, as before, would leave the filesystem target too little room after its own
overhead; sized from the image, the target asks for the image plus 20 %, and a block target for
the image alone, marked permissive (its claim is smaller than the source's, as CDI marks it).
``cdi.kubevirt.io/permissiveClone: "true"`` lets a target smaller than the source's image be
created, which the size rule otherwise refuses with ``ErrIncompatiblePVC``."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.render.pvc import required_space
from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes import test_clone_sizes
from tests.integration.datavolumes.cdi_env import (
    COPY_CLASS,
    Images,
    ImageServer,
    dv_path,
    same_prefix_then_zeros,
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
    fs = claim_of(kube, namespace, "to-fs")
    assert fs["spec"]["resources"]["requests"]["storage"] == str(required_space(OVERHEAD, IMAGE))
    assert PERMISSIVE not in fs["metadata"]["annotations"]  # it asks for more than the source
    block = claim_of(kube, namespace, "to-block")
    assert block["spec"]["resources"]["requests"]["storage"] == str(IMAGE)
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
