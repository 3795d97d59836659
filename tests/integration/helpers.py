"""Small object builders and waits shared by the integration tests."""

from __future__ import annotations

from typing import Any

from testkit.kubeclient import JSON, Kube, ns_path
from testkit.waiting import wait_until

SHELL_IMAGE = "busybox:1.36"


def pod_manifest(
    name: str,
    script: str,
    *,
    volumes: list[JSON] | None = None,
    mounts: list[JSON] | None = None,
    devices: list[JSON] | None = None,
    restart_policy: str = "Never",
    owner: JSON | None = None,
    **container: Any,
) -> JSON:
    c: JSON = {"name": "main", "image": SHELL_IMAGE, "command": ["sh", "-c", script]}
    if mounts:
        c["volumeMounts"] = mounts
    if devices:
        c["volumeDevices"] = devices
    c.update(container)
    meta: JSON = {"name": name}
    if owner is not None:
        meta["ownerReferences"] = [owner_reference(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 5,
            "containers": [c],
            "volumes": volumes or [],
        },
    }


def pvc_manifest(name: str, size: str, storage_class: str, mode: str = "Filesystem") -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": mode,
            "storageClassName": storage_class,
            "resources": {"requests": {"storage": size}},
        },
    }


def owner_reference(obj: JSON) -> JSON:
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }


def wait_pod_phase(
    kube: Kube, ns: str, name: str, phases: tuple[str, ...], timeout: float = 60
) -> JSON:
    def done() -> JSON | None:
        pod = kube.get(ns_path(ns, "pods", name))
        return pod if pod.get("status", {}).get("phase") in phases else None

    return wait_until(done, f"pod {ns}/{name} in {phases}", timeout)


def bound_pv(kube: Kube, ns: str, claim: str, timeout: float = 60) -> JSON:
    """The PersistentVolume of claim ``ns/claim`` once it is Bound."""

    def bound() -> JSON | None:
        pvc = kube.get(ns_path(ns, "persistentvolumeclaims", claim))
        return pvc if pvc.get("status", {}).get("phase") == "Bound" else None

    pvc = wait_until(bound, f"claim {ns}/{claim} bound", timeout)
    return kube.get(f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")


def wait_gone(kube: Kube, path: str, timeout: float = 60) -> None:
    wait_until(lambda: kube.get_or_none(path) is None, f"{path} to be deleted", timeout)


def terminated(pod: JSON, container: str = "main") -> JSON:
    for st in pod["status"].get("containerStatuses") or []:
        if st["name"] == container:
            return dict(st["state"]["terminated"])
    raise AssertionError(f"no status for container {container}: {pod['status']}")
