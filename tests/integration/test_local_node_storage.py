"""Acceptance tests of the local node and provisioner with real volumes: Immediate and
WaitForFirstConsumer filesystem claims, block claims, clones, garbage collection."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.helpers import (
    bound_pv,
    pod_manifest,
    pvc_manifest,
    terminated,
    wait_gone,
    wait_pod_phase,
)

pytestmark = pytest.mark.integration


def test_pod_writes_to_immediate_fs_claim_and_is_collected_with_its_owner(
    kube: Kube, namespace: str
) -> None:
    kube.create(
        ns_path(namespace, "persistentvolumeclaims"), pvc_manifest("data", "64Mi", "testkit-fs")
    )
    pv = bound_pv(kube, namespace, "data")  # Immediate: bound before any pod exists
    assert pv["spec"]["volumeMode"] == "Filesystem"
    owner = kube.create(
        ns_path(namespace, "configmaps"),
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "owner"},
        },
    )
    owner.setdefault("apiVersion", "v1")
    owner.setdefault("kind", "ConfigMap")
    script = (
        "echo payload-from-pod > /data/out.txt && df -k /data | tail -1 > /data/df.txt"
        " && printf 'import done' > /dev/termination-log"
    )
    kube.create(
        ns_path(namespace, "pods"),
        pod_manifest(
            "writer",
            script,
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
            mounts=[{"name": "data", "mountPath": "/data"}],
            owner=owner,
        ),
    )
    pod = wait_pod_phase(kube, namespace, "writer", ("Succeeded", "Failed"))
    state = terminated(pod)
    assert pod["status"]["phase"] == "Succeeded", state
    assert state["exitCode"] == 0
    assert state["message"] == "import done"
    assert pod["status"]["podIP"].startswith("127.")

    volume_dir = Path(pv["spec"]["local"]["path"])
    assert (volume_dir / "out.txt").read_text() == "payload-from-pod\n"
    size_kib = int((volume_dir / "df.txt").read_text().split()[1])
    assert 40 * 1024 < size_kib < 64 * 1024  # a real ext4 of the requested size, less overhead

    kube.delete(ns_path(namespace, "configmaps", "owner"))
    wait_gone(kube, ns_path(namespace, "pods", "writer"))


def test_wait_for_first_consumer_claim_binds_on_this_node_when_a_pod_uses_it(
    cluster: Cluster, kube: Kube, namespace: str
) -> None:
    claims = ns_path(namespace, "persistentvolumeclaims")
    kube.create(claims, pvc_manifest("late", "32Mi", "testkit-fs-wffc"))
    time.sleep(3)
    pvc = kube.get(f"{claims}/late")
    assert pvc["status"]["phase"] == "Pending"
    assert not pvc["spec"].get("volumeName")

    kube.create(
        ns_path(namespace, "pods"),
        pod_manifest(
            "consumer",
            "test -w /vol && echo ok > /vol/ok",
            volumes=[{"name": "vol", "persistentVolumeClaim": {"claimName": "late"}}],
            mounts=[{"name": "vol", "mountPath": "/vol"}],
        ),
    )
    pv = bound_pv(kube, namespace, "late")
    pvc = kube.get(f"{claims}/late")
    node = cluster.config.node_name
    assert pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == node
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == [node]
    pod = wait_pod_phase(kube, namespace, "consumer", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded", pod["status"]
    assert pod["spec"]["nodeName"] == node


def test_block_claim_is_a_real_block_device_of_the_requested_size(
    kube: Kube, namespace: str
) -> None:
    size = 48 * 1024 * 1024
    kube.create(
        ns_path(namespace, "persistentvolumeclaims"),
        pvc_manifest("disk", "48Mi", "testkit-block", mode="Block"),
    )
    script = (
        "test -b /dev/xvda || { echo not a block device; exit 3; }; "
        "blockdev --getsize64 /dev/xvda > /dev/termination-log; "
        "head -c 4096 /dev/urandom | dd of=/dev/xvda bs=4096 conv=fsync 2>/dev/null"
    )
    kube.create(
        ns_path(namespace, "pods"),
        pod_manifest(
            "blocky",
            script,
            volumes=[{"name": "disk", "persistentVolumeClaim": {"claimName": "disk"}}],
            devices=[{"name": "disk", "devicePath": "/dev/xvda"}],
        ),
    )
    pod = wait_pod_phase(kube, namespace, "blocky", ("Succeeded", "Failed"))
    state = terminated(pod)
    assert pod["status"]["phase"] == "Succeeded", state
    assert int(state["message"]) == size
    assert not Path("/dev/xvda").is_block_device()  # the device exists only in the pod


def test_clone_copies_data_and_released_volume_loses_its_backing_file(
    kube: Kube, namespace: str
) -> None:
    claims = ns_path(namespace, "persistentvolumeclaims")
    kube.create(claims, pvc_manifest("src", "32Mi", "testkit-fs"))
    src_pv = bound_pv(kube, namespace, "src")
    (Path(src_pv["spec"]["local"]["path"]) / "seed.txt").write_text("seed\n")
    clone = pvc_manifest("copy", "40Mi", "testkit-fs")
    clone["spec"]["dataSource"] = {"kind": "PersistentVolumeClaim", "name": "src"}
    kube.create(claims, clone)
    copy_pv = bound_pv(kube, namespace, "copy")
    copy_dir = Path(copy_pv["spec"]["local"]["path"])
    assert (copy_dir / "seed.txt").read_text() == "seed\n"
    image = Path(copy_pv["metadata"]["annotations"]["testkit.local/image"])
    assert image.stat().st_size == 40 * 1024 * 1024

    kube.delete(f"{claims}/copy")
    wait_gone(kube, f"/api/v1/persistentvolumes/{copy_pv['metadata']['name']}")
    assert not image.exists()
    assert not copy_dir.exists()


@pytest.mark.parametrize("mode", ["Filesystem", "Block"])
def test_claim_expansion_grows_the_volume(kube: Kube, namespace: str, mode: str) -> None:
    claims = ns_path(namespace, "persistentvolumeclaims")
    sc = "testkit-block" if mode == "Block" else "testkit-fs"
    kube.create(claims, pvc_manifest("grow", "32Mi", sc, mode=mode))
    pv = bound_pv(kube, namespace, "grow")
    kube.patch(f"{claims}/grow", {"spec": {"resources": {"requests": {"storage": "64Mi"}}}})

    def expanded() -> bool:
        pvc = kube.get(f"{claims}/grow")
        return pvc["status"].get("capacity", {}).get("storage") == "64Mi"

    wait_until(expanded, "claim capacity 64Mi", 30)
    path = pv["spec"]["local"]["path"]
    if mode == "Block":
        out = subprocess.run(
            ["blockdev", "--getsize64", path], capture_output=True, text=True, check=True
        ).stdout
        assert int(out) == 64 * 1024 * 1024
    else:
        st = os.statvfs(path)
        assert st.f_blocks * st.f_frsize > 48 * 1024 * 1024  # was about 26 MiB at 32Mi
