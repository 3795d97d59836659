"""CSI clones on the real control plane with the product installed: the local provisioner clones
a claim named in ``dataSource`` (a sparse copy), so its classes' profiles say ``csi-clone``.

Filesystem and block, in the source's namespace and across namespaces (cloned in the source
namespace, then the volume moves to the target claim); the content is the imported image and
the copy is as sparse as its source. A clone waits for a source that does not exist yet
(``CloneWithoutSource``) and for one a running pod writes (``CloneSourceInUse``); five clones
of one source at once and a clone of a clone succeed; a smaller target is refused with CDI's
reason; a controller SIGKILLed in the middle of a move finishes it on restart, losing nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    ControllerProcess,
    Images,
    ImageServer,
    condition,
    datavolume,
    dv_path,
    event_reasons,
    events_for,
    pv_of,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)

pytestmark = pytest.mark.integration

CLASS = {"Filesystem": "testkit-fs", "Block": "testkit-block"}
DEPLOYMENT = "/apis/apps/v1/namespaces/cdi/deployments/cdi-controller"


def import_source(kube: Kube, server: ImageServer, ns: str, name: str, mode: str) -> None:
    source = {"http": {"url": server.url("ok", "disk.qcow2")}}
    dv = datavolume(name, source, size="64Mi", storage_class=CLASS[mode], mode=mode)
    kube.create(dv_path(ns), dv)


def clone_of(name: str, ns: str, source: str, mode: str, size: str | None = None) -> dict:
    storage: dict[str, Any] = {"storageClassName": CLASS[mode], "volumeMode": mode}
    if size:
        storage["resources"] = {"requests": {"storage": size}}
    spec = {"source": {"pvc": {"namespace": ns, "name": source}}, "storage": storage}
    return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def data_of(kube: Kube, ns: str, claim: str) -> Path:
    """The image's bytes: ``disk.img`` on a filesystem volume, the device of a block one
    (local and CSI volumes of the test node alike)."""
    path = volume_dir(kube, ns, claim)
    return (
        path if pv_of(kube, ns, claim)["spec"].get("volumeMode") == "Block" else path / "disk.img"
    )


def allocated(kube: Kube, ns: str, claim: str) -> int:
    pv = pv_of(kube, ns, claim)
    if pv["spec"].get("volumeMode") == "Block":
        path = Path(pv["metadata"]["annotations"]["testkit.local/image"])
    else:
        path = volume_dir(kube, ns, claim) / "disk.img"
    return os.stat(path).st_blocks * 512


def succeeded(kube: Kube, ns: str, name: str, timeout: float = 120) -> dict[str, Any]:
    dv = wait_phase(kube, ns, name, ("Succeeded", "Failed"), timeout)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    return dv


def assert_clone(kube: Kube, images: Images, src: tuple[str, str], dst: tuple[str, str]) -> None:
    same_prefix_then_zeros(data_of(kube, *dst), images.reference)
    assert allocated(kube, *dst) <= 1.01 * allocated(kube, *src)
    pvc = kube.get(ns_path(dst[0], "persistentvolumeclaims", dst[1]))
    ann = pvc["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/cloneType"] == "csi-clone"
    assert ann["k8s.io/CloneRequest"] == f"{src[0]}/{src[1]}"


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_csi_clone_in_the_same_namespace_and_across_namespaces(
    kube: Kube, namespace: str, other_namespace: str, controller: Any,
    image_server: ImageServer, images: Images, mode: str,
) -> None:  # fmt: skip
    import_source(kube, image_server, namespace, "golden", mode)
    succeeded(kube, namespace, "golden")
    kube.create(dv_path(namespace), clone_of("near", namespace, "golden", mode))
    kube.create(dv_path(other_namespace), clone_of("far", namespace, "golden", mode))
    near = succeeded(kube, namespace, "near")
    far = succeeded(kube, other_namespace, "far")
    assert condition(near, "Running")["message"] == "Clone Complete"
    assert_clone(kube, images, (namespace, "golden"), (namespace, "near"))
    assert_clone(kube, images, (namespace, "golden"), (other_namespace, "far"))
    event_reasons(kube, other_namespace, "far", {"CSICloneInProgress", "CloneSucceeded"})
    moved = pv_of(kube, other_namespace, "far")
    assert moved["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    tmp = f"tmp-pvc-{far['metadata']['uid']}"
    assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", tmp)) is None
    same_prefix_then_zeros(data_of(kube, namespace, "golden"), images.reference)  # intact


def writer_pod(claim: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "writer"},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "w", "image": "busybox", "command": ["sleep", "600"],
                                 "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
    }  # fmt: skip


def test_a_clone_waits_for_its_source_to_exist_and_to_be_released(
    kube: Kube, namespace: str, controller: Any, image_server: ImageServer, images: Images
) -> None:
    kube.create(dv_path(namespace), clone_of("early", namespace, "late", "Filesystem"))

    def without_source() -> dict[str, Any] | None:
        dv = kube.get(dv_path(namespace, "early"))
        conds = (dv.get("status") or {}).get("conditions") or []
        bound = next((c for c in conds if c["type"] == "Bound"), {})
        return dv if bound.get("reason") == "CloneWithoutSource" else None

    dv = wait_until(without_source, "CloneWithoutSource", 30)
    assert condition(dv, "Bound")["message"] == "The source pvc late doesn't exist"
    wait_until(  # the event is written after the status, in a call of its own
        lambda: "CloneWithoutSource" in {e["reason"] for e in events_for(kube, namespace, "early")},
        "the CloneWithoutSource event",
        30,
    )
    import_source(kube, image_server, namespace, "late", "Filesystem")
    succeeded(kube, namespace, "early")
    same_prefix_then_zeros(data_of(kube, namespace, "early"), images.reference)

    kube.create(ns_path(namespace, "pods"), writer_pod("late"))
    wait_until(lambda: kube.get(ns_path(namespace, "pods", "writer"))["status"].get("phase")
               == "Running", "writer running", 60)  # fmt: skip
    kube.create(dv_path(namespace), clone_of("busy", namespace, "late", "Filesystem"))
    wait_until(
        lambda: "CloneSourceInUse" in {e["reason"] for e in events_for(kube, namespace, "busy")},
        "CloneSourceInUse",
        30,
    )
    assert kube.get(dv_path(namespace, "busy"))["status"]["phase"] == "CloneScheduled"
    kube.delete(ns_path(namespace, "pods", "writer"))
    succeeded(kube, namespace, "busy")


def test_five_clones_at_once_a_clone_of_a_clone_and_a_smaller_target(
    kube: Kube, namespace: str, controller: Any, image_server: ImageServer, images: Images
) -> None:
    import_source(kube, image_server, namespace, "golden", "Filesystem")
    succeeded(kube, namespace, "golden")
    names = [f"copy-{i}" for i in range(5)]
    for name in names:
        kube.create(dv_path(namespace), clone_of(name, namespace, "golden", "Filesystem"))
    kube.create(dv_path(namespace), clone_of("small", namespace, "golden", "Filesystem", "16Mi"))
    kube.create(dv_path(namespace), clone_of("blocky", namespace, "golden", "Block"))
    for name in names:
        succeeded(kube, namespace, name)
        same_prefix_then_zeros(data_of(kube, namespace, name), images.reference)
    kube.create(dv_path(namespace), clone_of("grandchild", namespace, "copy-0", "Filesystem"))
    succeeded(kube, namespace, "grandchild")
    same_prefix_then_zeros(data_of(kube, namespace, "grandchild"), images.reference)
    small = kube.get(dv_path(namespace, "small"))
    bound = condition(small, "Bound")
    assert bound["reason"] == "ErrIncompatiblePVC", small["status"]
    assert bound["message"].startswith(
        "target resources requests storage size is smaller than the source"
    )
    assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", "small")) is None
    # filesystem -> block cannot be a CSI clone: CDI's fallback reason, then host-assisted copy
    succeeded(kube, namespace, "blocky", timeout=180)
    same_prefix_then_zeros(data_of(kube, namespace, "blocky"), images.reference)
    ann = kube.get(ns_path(namespace, "persistentvolumeclaims", "blocky"))["metadata"]
    assert ann["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"
    fallback = ann["annotations"]["cdi.kubevirt.io/cloneFallbackReason"]
    assert fallback == "The volume modes of source and target are incompatible"
    assert "IncompatibleVolumeModes" in {e["reason"] for e in events_for(kube, namespace, "blocky")}


def scale_controller(kube: Kube, replicas: int) -> None:
    kube.patch(f"{DEPLOYMENT}/scale", {"spec": {"replicas": replicas}})

    def settled() -> bool:
        pods = kube.get("/api/v1/namespaces/cdi/pods?labelSelector=app%3Dcdi-controller")
        running = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        return len(running) == replicas and (
            replicas == 0 or kube.get(DEPLOYMENT)["status"].get("availableReplicas") == replicas
        )

    wait_until(settled, f"cdi-controller at {replicas} replicas", 120, 0.5)


def test_controller_killed_during_a_cross_namespace_move_finishes_it_on_restart(
    cluster: Cluster, kube: Kube, namespace: str, other_namespace: str, controller: Any,
    image_server: ImageServer, images: Images, tmp_path: Path,
) -> None:  # fmt: skip
    import_source(kube, image_server, namespace, "golden", "Filesystem")
    succeeded(kube, namespace, "golden")
    source_pv = pv_of(kube, namespace, "golden")["metadata"]["name"]
    scale_controller(kube, 0)
    own = ControllerProcess(cluster, tmp_path, args=("--no-leader-elect",))
    try:
        own.start()
        dv = kube.create(
            dv_path(other_namespace), clone_of("far", namespace, "golden", "Filesystem")
        )
        uid = dv["metadata"]["uid"]
        selector = f"cdi.kubevirt.io%2FcloneFor%3D{uid}"
        wait_until(lambda: kube.get(f"/api/v1/persistentvolumes?labelSelector={selector}")["items"],
                   "the volume held for the move", 60, 0.02)  # fmt: skip
        own.kill()  # held with Retain, the temporary claim not yet released
        held = kube.get(f"/api/v1/persistentvolumes?labelSelector={selector}")["items"][0]
        assert held["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
        own.start()
        succeeded(kube, other_namespace, "far")
    finally:
        own.stop()
        scale_controller(kube, 2)
    same_prefix_then_zeros(data_of(kube, other_namespace, "far"), images.reference)
    same_prefix_then_zeros(data_of(kube, namespace, "golden"), images.reference)
    assert pv_of(kube, namespace, "golden")["metadata"]["name"] == source_pv
    pvs = kube.get("/api/v1/persistentvolumes")["items"]
    ours = [pv for pv in pvs if (pv["spec"].get("claimRef") or {}).get("namespace")
            in (namespace, other_namespace)]  # fmt: skip
    assert [pv["status"].get("phase") for pv in ours] == ["Bound", "Bound"]
    moved = pv_of(kube, other_namespace, "far")
    assert moved["spec"]["persistentVolumeReclaimPolicy"] == "Delete"
    assert not (moved["metadata"].get("labels") or {}).get("cdi.kubevirt.io/cloneFor")
    tmp = f"tmp-pvc-{uid}"
    assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", tmp)) is None


def test_a_datavolume_deleted_during_a_move_leaves_nothing_behind(
    kube: Kube, namespace: str, other_namespace: str, controller: Any,
    image_server: ImageServer, images: Images,
) -> None:  # fmt: skip
    import_source(kube, image_server, namespace, "golden", "Filesystem")
    succeeded(kube, namespace, "golden")
    dv = kube.create(dv_path(other_namespace), clone_of("gone", namespace, "golden", "Filesystem"))
    uid = dv["metadata"]["uid"]
    selector = f"cdi.kubevirt.io%2FcloneFor%3D{uid}"
    pvs = f"/api/v1/persistentvolumes?labelSelector={selector}"
    wait_until(lambda: kube.get(pvs)["items"], "the volume held for the move", 60, 0.02)
    held = kube.get(pvs)["items"][0]["metadata"]["name"]
    kube.delete(dv_path(other_namespace, "gone"))
    tmp = ns_path(namespace, "persistentvolumeclaims", f"tmp-pvc-{uid}")
    wait_until(lambda: kube.get_or_none(tmp) is None, "the temporary claim deleted", 60)
    wait_until(lambda: kube.get_or_none(f"/api/v1/persistentvolumes/{held}") is None,
               "the held volume reclaimed", 90)  # fmt: skip
    same_prefix_then_zeros(data_of(kube, namespace, "golden"), images.reference)  # intact
