"""The clone size rule across the four volume-mode pairs, with the ``storage`` and the ``pvc``
APIs, in the source's namespace and across namespaces, host-assisted and CSI (issue 29).

Sources: a filesystem and a block DataVolume of 64Mi each (``storage`` API; the filesystem
claim is inflated for its overhead, and the import grows ``disk.img`` to what it holds), both
with the 24 MiB test image. Each target below is admitted (Succeeded, the image's bytes) or
refused (Bound False ``ErrIncompatiblePVC`` with CDI's message and the two sizes compared, or
the webhook's answer for a ``pvc``-API target smaller than the source's claim, as CDI's webhook
answers). A filesystem -> block clone is measured by what the source's ``disk.img`` can be
(64 MiB), not by the inflated claim (CDI leaves that case unchecked; its TODO says a plain
compare is wrong); a block -> filesystem clone must hold the device after the target's
overhead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cdi.render.clone import SMALLER, usable_space
from cdi.render.pvc import required_space
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    COPY_CLASS,
    Images,
    ImageServer,
    condition,
    dv_path,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.test_clone_csi import CLASS, data_of, import_source, succeeded

pytestmark = pytest.mark.integration
MiB = 1024 * 1024
IMAGE = 64 * MiB  # what disk.img in the filesystem source can be: the claim's usable space
DEVICE = 64 * MiB  # the block source
# The local provisioner's small ext4 keeps over 10 % to itself (journal, inode tables, the 5 %
# reserved for root that statfs does not count as available): more than CDI's default 6 %
# overhead, so the operator sets the filesystem target class's own (CDIConfig, per class).
OVERHEAD = 0.2
CONFIG = "/apis/cdi.kubevirt.io/v1beta1/cdiconfigs/config"
SOURCE = {"Filesystem": "golden-fs", "Block": "golden-block"}


def target(
    name: str, source_mode: str, mode: str, size: int | None, api: str, strategy: str
) -> dict:
    cls = (COPY_CLASS if strategy == "copy" else CLASS)[mode]
    spec: dict[str, Any] = {"storageClassName": cls, "volumeMode": mode}
    if size is not None:
        spec["resources"] = {"requests": {"storage": str(size)}}
    if api == "pvc":
        spec["accessModes"] = ["ReadWriteOnce"]
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name},
            "spec": {"source": {"pvc": {"namespace": "", "name": SOURCE[source_mode]}},
                     api: spec}}  # fmt: skip


# name, source mode, target mode, size, API, strategy, same namespace, refusal (None: admitted)
ADMITTED: list[tuple[str, str, str, int | None, str, str, bool]] = [
    ("fs-block-storage", "Filesystem", "Block", 64 * MiB, "storage", "copy", True),  # the issue
    ("fs-block-bigger", "Filesystem", "Block", 96 * MiB, "storage", "copy", False),
    ("fs-block-csi", "Filesystem", "Block", 64 * MiB, "storage", "csi", False),  # falls back
    ("block-fs-storage", "Block", "Filesystem", DEVICE, "storage", "copy", False),
    ("block-fs-pvc", "Block", "Filesystem", 80 * MiB, "pvc", "copy", True),
    ("block-block-pvc", "Block", "Block", DEVICE, "pvc", "copy", False),
    ("block-block-csi", "Block", "Block", DEVICE, "storage", "csi", True),
    ("block-block-csi-far", "Block", "Block", DEVICE, "storage", "csi", False),
    ("block-fs-grown", "Block", "Filesystem", None, "storage", "copy", True),  # size: the device
    ("fs-fs-pvc", "Filesystem", "Filesystem", 96 * MiB, "pvc", "csi", True),
    ("fs-fs-storage", "Filesystem", "Filesystem", 64 * MiB, "storage", "copy", False),
    ("fs-fs-csi", "Filesystem", "Filesystem", 64 * MiB, "storage", "csi", True),
]
REFUSED: list[tuple[str, str, str, int, str, str, bool, str]] = [
    ("fs-block-small", "Filesystem", "Block", 63 * MiB, "storage", "copy", False,
     f"{SMALLER} {63 * MiB} < {IMAGE}"),
    ("block-fs-small", "Block", "Filesystem", 32 * MiB, "storage", "copy", False,
     f"{SMALLER} {32 * MiB} < {DEVICE}"),
    # the pvc API's raw sizes are equal; the filesystem's overhead leaves no room for the device
    ("block-fs-pvc-tight", "Block", "Filesystem", DEVICE, "pvc", "copy", True,
     f"{SMALLER} {usable_space(OVERHEAD, DEVICE)} < {DEVICE}"),
    ("block-block-small", "Block", "Block", 32 * MiB, "storage", "csi", False,
     f"{SMALLER} {32 * MiB} < {DEVICE}"),
]  # fmt: skip


@pytest.fixture
def class_overhead(kube: Kube, copy_classes: None) -> Iterator[None]:
    per_class = {"storageClass": {COPY_CLASS["Filesystem"]: str(OVERHEAD)}}
    kube.patch(CONFIG, {"spec": {"filesystemOverhead": per_class}})
    wait_until(
        lambda: (kube.get(CONFIG).get("status") or {}).get("filesystemOverhead", {})
        .get("storageClass", {}).get(COPY_CLASS["Filesystem"]) == str(OVERHEAD),
        "CDIConfig's overhead for the filesystem target class",
        60,
    )  # fmt: skip
    yield
    kube.patch(CONFIG, {"spec": {"filesystemOverhead": None}})


def test_clone_sizes_across_modes_apis_namespaces_and_strategies(
    kube: Kube, namespace: str, other_namespace: str, class_overhead: None,
    image_server: ImageServer, images: Images,
) -> None:  # fmt: skip
    for mode, name in SOURCE.items():
        import_source(kube, image_server, namespace, name, mode)
    for name in SOURCE.values():
        succeeded(kube, namespace, name)

    def create(row: tuple[Any, ...]) -> str:
        name, src_mode, mode, size, api, strategy, same = row[:7]
        ns = namespace if same else other_namespace
        dv = target(name, src_mode, mode, size, api, strategy)
        dv["spec"]["source"]["pvc"]["namespace"] = namespace
        kube.create(dv_path(ns), dv)
        return ns

    where = {row[0]: create(row) for row in [*ADMITTED, *REFUSED]}
    # the pvc API's webhook check, as CDI's: the claim is smaller than the source's claim
    for pvc_api in (
        ("fs-block-pvc", "Filesystem", "Block", 64 * MiB, "pvc", "copy", True),
        ("fs-fs-pvc-small", "Filesystem", "Filesystem", 64 * MiB, "pvc", "csi", False),
    ):
        with pytest.raises(ApiError) as refused:
            create(pvc_api)
        assert SMALLER in str(refused.value), refused.value
    for name, _, _, _, _, _, _, message in REFUSED:
        ns = where[name]

        def said(ns: str = ns, name: str = name) -> dict[str, Any] | None:
            bound = condition(kube.get(dv_path(ns, name)), "Bound") or {}
            return bound if bound.get("reason") == "ErrIncompatiblePVC" else None

        bound = wait_until(said, f"{ns}/{name} refused as too small", 60)
        assert bound["message"] == message, (name, bound)
        assert kube.get(dv_path(ns, name))["status"]["phase"] == "Pending"
        assert kube.get_or_none(ns_path(ns, "persistentvolumeclaims", name)) is None
    for name, *_ in ADMITTED:
        succeeded(kube, where[name], name, timeout=240)
        same_prefix_then_zeros(data_of(kube, where[name], name), images.reference)
    grown = kube.get(ns_path(namespace, "persistentvolumeclaims", "block-fs-grown"))["spec"]
    assert grown["resources"]["requests"]["storage"] == str(required_space(OVERHEAD, DEVICE))
    for name in SOURCE.values():  # the sources are intact
        same_prefix_then_zeros(data_of(kube, namespace, name), images.reference)
