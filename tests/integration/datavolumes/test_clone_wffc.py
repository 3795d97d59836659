"""CSI clones into WaitForFirstConsumer storage on the real control plane (CDI's cloner_test WFFC
cases): the DataVolume is ``PendingPopulation`` until a consumer is scheduled, then clones,
in its source's namespace and across namespaces (where the target claim exists from the start as
a placeholder the consumer is scheduled with, and the moved volume binds it); with
``storage.bind.immediate.requested`` it clones at once, on its source's node."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    condition,
    dv_path,
    pv_of,
    wait_phase,
)
from tests.integration.datavolumes.test_clone_csi import (
    assert_clone,
    import_source,
    succeeded,
)

pytestmark = pytest.mark.integration

WFFC = "testkit-fs-wffc"


def wffc_clone(name: str, ns: str, source: str, immediate: bool = False) -> dict[str, Any]:
    storage = {"storageClassName": WFFC, "volumeMode": "Filesystem"}
    spec = {"source": {"pvc": {"namespace": ns, "name": source}}, "storage": storage}
    annotations = {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"} if immediate else {}
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name, "annotations": annotations}, "spec": spec}  # fmt: skip


def consumer(claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"vm-{claim}"},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "600"],
                                 "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
    }  # fmt: skip


def test_clones_into_wffc_storage_wait_for_a_consumer_or_bind_at_once(
    kube: Kube, namespace: str, other_namespace: str, controller: Any,
    image_server: ImageServer, images: Images,
) -> None:  # fmt: skip
    import_source(kube, image_server, namespace, "golden", "Filesystem")
    succeeded(kube, namespace, "golden")
    targets = ((namespace, "near"), (other_namespace, "far"))
    for ns, name in targets:
        kube.create(dv_path(ns), wffc_clone(name, namespace, "golden"))
    kube.create(dv_path(other_namespace), wffc_clone("now", namespace, "golden", immediate=True))
    for ns, name in targets:
        dv = wait_phase(kube, ns, name, ("PendingPopulation",), 60)
        assert condition(dv, "Bound")["reason"] == "Pending"
        claim = kube.get(ns_path(ns, "persistentvolumeclaims", name))  # the consumer's claim
        assert claim["status"]["phase"] == "Pending"
    now = succeeded(kube, other_namespace, "now")  # no consumer: on the source's node
    assert now["status"]["phase"] == "Succeeded"
    assert kube.get(dv_path(namespace, "near"))["status"]["phase"] == "PendingPopulation"
    assert kube.get(dv_path(other_namespace, "far"))["status"]["phase"] == "PendingPopulation"

    for ns, name in targets:
        kube.create(ns_path(ns, "pods"), consumer(name))
    for ns, name in (*targets, (other_namespace, "now")):
        succeeded(kube, ns, name)
        assert_clone(kube, images, (namespace, "golden"), (ns, name))
    moved = pv_of(kube, other_namespace, "far")
    assert moved["spec"]["persistentVolumeReclaimPolicy"] == "Delete"  # restored after the move
    assert "cdi.kubevirt.io/cloneFor" not in (moved["metadata"].get("labels") or {})
    far = kube.get(dv_path(other_namespace, "far"))
    tmp = f"tmp-pvc-{far['metadata']['uid']}"
    assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", tmp)) is None
