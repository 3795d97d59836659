"""Registry node pull, the pure and local parts: the holder lookup (``ready``), the nofollow
walk to the one file under ``disk/`` on real directories, labels from an environ, the importer
configuration, the rendered pod, and how the controller reads the kubelet's pull failures,
scheduling failures and ``imageID``."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from cdi.api.constants import Phase
from cdi.api.errors import InvalidConfig, UnsafeImage, WorkerError
from cdi.api.failure import guarded
from cdi.api.termination import TerminationMessage
from cdi.api.types import DataVolume
from cdi.controller.dataimportcron_desired import Cron, poller_pod
from cdi.controller.policy import pod_problem
from cdi.controller.registry_result import with_node_digest
from cdi.controller.status import FlavourPhases, View, compute_status
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from importer.config import from_env, node_pull_dir
from importer.holder import ReadyWait, install_holder, read_pid, wait_ready
from importer.registry.errors import ImagePullFailed, RegistryImageInvalid
from importer.runner import run_import
from importer.sources.containerdisk import environ_labels, open_disk
from importer.sources.registry_options import NodePullOptions

DIGEST = "sha256:" + "ab" * 32
STORAGE = {"requests": {"storage": "1Gi"}}


# -- the holder's pid -------------------------------------------------------------------------
def test_ready_gives_the_holders_pid(tmp_path: Path) -> None:
    assert read_pid(str(tmp_path)) is None
    (tmp_path / "ready").write_text(f"{os.getpid()}\n")
    assert wait_ready(str(tmp_path), ReadyWait(1.0)) == os.getpid()


@pytest.mark.parametrize("content", ["", "12ab", "-3", "9" * 40])
def test_a_ready_file_without_a_pid_is_refused(tmp_path: Path, content: str) -> None:
    (tmp_path / "ready").write_text(content)
    with pytest.raises(InvalidConfig):
        read_pid(str(tmp_path))


def test_no_holder_within_the_bound_is_image_pull_failed(tmp_path: Path) -> None:
    now = [0.0]
    with pytest.raises(ImagePullFailed) as err:
        wait_ready(
            str(tmp_path),
            ReadyWait(timeout=300, interval=10),
            clock=lambda: now[0],
            sleep=lambda s: now.__setitem__(0, now[0] + s),
        )
    assert err.value.transient and err.value.reason == "ImagePullFailed"
    assert str(err.value).startswith("failed to pull image: ")
    assert now[0] == 300


def test_a_ready_pid_that_is_not_running_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ready").write_text("4194304")  # above any pid_max
    with pytest.raises(InvalidConfig):
        wait_ready(str(tmp_path), ReadyWait(1.0))


def test_install_holder_copies_an_executable_atomically(tmp_path: Path) -> None:
    src = tmp_path / "bin"
    src.write_bytes(b"\x7fELF" + b"x" * 5000)
    install_holder(str(src), str(tmp_path / "cdi-holder"))
    dest = tmp_path / "cdi-holder"
    assert dest.read_bytes() == src.read_bytes() and os.access(dest, os.X_OK)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "cdi-holder"]


# -- the nofollow walk ------------------------------------------------------------------------
def _root(tmp_path: Path, **files: bytes) -> Path:
    root = tmp_path / "root"
    (root / "disk").mkdir(parents=True)
    for name, data in files.items():
        (root / "disk" / name).write_bytes(data)
    return root


def _read(root: Path) -> bytes:
    disk = open_disk(str(root))
    try:
        return os.pread(disk.fd, disk.size, 0)
    finally:
        os.close(disk.fd)


def test_the_one_file_under_disk_is_opened(tmp_path: Path) -> None:
    root = _root(tmp_path, **{"disk.qcow2": b"QFI\xfb" + b"\0" * 100})
    assert _read(root) == b"QFI\xfb" + b"\0" * 100


def test_a_symlink_member_is_refused_even_to_a_file_inside(tmp_path: Path) -> None:
    root = _root(tmp_path)
    host = tmp_path / "host-secret"
    host.write_bytes(b"secret")
    os.symlink(host, root / "disk" / "disk.img")  # absolute: would resolve in our root
    with pytest.raises(UnsafeImage, match="symbolic link"):
        open_disk(str(root))
    os.unlink(root / "disk" / "disk.img")
    (root / "real").write_bytes(b"inside")
    os.symlink("../real", root / "disk" / "disk.img")
    with pytest.raises(UnsafeImage, match="symbolic link"):
        open_disk(str(root))


def test_a_symlinked_disk_folder_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "disk.img").write_bytes(b"host data")
    root.mkdir()
    os.symlink(elsewhere, root / "disk")
    with pytest.raises(UnsafeImage, match="not a directory"):
        open_disk(str(root))


def test_a_fifo_member_is_refused_without_blocking(tmp_path: Path) -> None:
    root = _root(tmp_path)
    os.mkfifo(root / "disk" / "disk.img")
    with pytest.raises(UnsafeImage, match="not a regular file"):
        open_disk(str(root))


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"a.img": b"a", "b.img": b"b"}, "image directory contains more than one file: "),
        ({}, "image file does not exist in image directory - directory is empty"),
        ({"sub/": b""}, "image directory contains another directory"),
        (None, "image file does not exist in image directory - directory is empty"),
    ],
)
def test_cdis_messages_for_what_is_not_one_file(
    tmp_path: Path, layout: dict[str, bytes] | None, message: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    if layout is not None:
        (root / "disk").mkdir()
        for name, data in layout.items():
            if name.endswith("/"):
                (root / "disk" / name).mkdir()
            else:
                (root / "disk" / name).write_bytes(data)
    with pytest.raises(RegistryImageInvalid) as err:
        open_disk(str(root))
    assert str(err.value).startswith(message)


def test_labels_come_from_the_kubevirt_io_variables_of_the_environ(tmp_path: Path) -> None:
    env = b"PATH=/bin\0TEST_KUBEVIRT_IO_TEST=v1\0INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=f\0"
    (tmp_path / "environ").write_bytes(env + b"BAD_KUBEVIRT_IO_X=not a label\0")
    assert environ_labels(str(tmp_path)) == {
        "test.kubevirt.io/test": "v1",
        "instancetype.kubevirt.io/default-preference": "f",
    }
    assert environ_labels(str(tmp_path / "missing")) == {}


# -- configuration ----------------------------------------------------------------------------
NODE_ENV = {
    "IMPORTER_SOURCE": "registry",
    "IMPORTER_ENDPOINT": "docker://127.0.0.1:5000/disks/x:v1",
    "IMPORTER_PULL_METHOD": "node",
    "IMPORTER_READY_FILE": "/shared/ready",
    "IMPORTER_DONE_FILE": "/shared/done",
    "IMPORTER_IMAGE_SIZE": "1Gi",
}


def test_node_pull_env_gives_node_pull_options() -> None:
    config = from_env({**NODE_ENV, "IMPORTER_READY_TIMEOUT": "120"})
    assert config.source == NodePullOptions(NODE_ENV["IMPORTER_ENDPOINT"], "/shared", 120.0)
    assert node_pull_dir(NODE_ENV) == "/shared"
    assert node_pull_dir({**NODE_ENV, "IMPORTER_PULL_METHOD": "pod"}) is None
    with pytest.raises(InvalidConfig):
        from_env({**NODE_ENV, "IMPORTER_READY_TIMEOUT": "soon"})


# -- the pod ----------------------------------------------------------------------------------
def _pod(registry: dict[str, Any]) -> dict[str, Any]:
    dv = DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": "d", "namespace": "ns", "uid": "u"},
            "spec": {
                "source": {"registry": registry},
                "pvc": {"resources": STORAGE},
            },
        }
    )
    pvc = {"metadata": {"name": "d", "namespace": "ns"}, "spec": {"resources": STORAGE}}
    return render_importer_pod(dv, pvc, ImporterPodConfig(image="quay.io/cdi-py/cdi-importer:1"))


def test_node_pull_pod_runs_the_containerdisk_as_the_holder() -> None:
    url = "docker://127.0.0.1:5000/disks/x:v1"
    spec = _pod({"url": url, "pullMethod": "node", "platform": {"architecture": "arm64"}})["spec"]
    server, importer = spec["containers"]
    assert server["name"] == "server" and server["image"] == "127.0.0.1:5000/disks/x:v1"
    assert server["command"] == ["/shared/cdi-holder"] and "args" not in server
    assert server["volumeMounts"] == [{"name": "cdi-shared-vol", "mountPath": "/shared"}]
    assert "env" not in server and server["securityContext"]["allowPrivilegeEscalation"] is False
    (init,) = spec["initContainers"]
    assert init["image"] == "quay.io/cdi-py/cdi-importer:1"
    assert init["args"] == ["install-holder", "/shared/cdi-holder"]
    assert spec["shareProcessNamespace"] is True
    assert {"name": "cdi-shared-vol", "emptyDir": {}} in spec["volumes"]
    assert spec["nodeSelector"] == {"kubernetes.io/arch": "arm64"}
    env = {e["name"]: e.get("value") for e in importer["env"]}
    assert env["IMPORTER_PULL_METHOD"] == "node" and env["IMPORTER_DONE_FILE"] == "/shared/done"
    assert {"name": "cdi-shared-vol", "mountPath": "/shared"} in importer["volumeMounts"]


def test_node_pull_mounts_no_registry_secret_or_ca() -> None:
    url = "docker://127.0.0.1:5000/disks/x:v1"
    spec = _pod({"url": url, "pullMethod": "node", "secretRef": "s", "certConfigMap": "c"})["spec"]
    assert not any("secret" in v or "configMap" in v for v in spec["volumes"])


def test_pod_pull_pod_has_no_side_container() -> None:
    spec = _pod({"url": "docker://127.0.0.1:5000/disks/x:v1"})["spec"]
    assert [c["name"] for c in spec["containers"]] == ["importer"]
    assert "initContainers" not in spec and "shareProcessNamespace" not in spec


# -- the controller ---------------------------------------------------------------------------
def _waiting(reason: str, message: str = "") -> dict[str, Any]:
    state = {"waiting": {"reason": reason, "message": message}}
    return {
        "status": {"phase": "Pending", "containerStatuses": [{"name": "server", "state": state}]}
    }


@pytest.mark.parametrize("reason", ["ErrImagePull", "ImagePullBackOff"])
def test_a_container_that_cannot_pull_is_image_pull_failed(reason: str) -> None:
    got = pod_problem(_waiting(reason, 'Failed to pull image "x": not found'))
    assert got == ("ImagePullFailed", 'failed to pull image: Failed to pull image "x": not found')


def test_an_unschedulable_pod_and_a_healthy_one() -> None:
    cond = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
    pod = {"status": {"phase": "Pending", "conditions": [cond]}}
    assert pod_problem(pod) == ("Unschedulable", "Importer pod cannot be scheduled")
    assert pod_problem(_waiting("ContainerCreating")) is None


def test_the_running_condition_shows_the_pods_problem() -> None:
    phases = FlavourPhases(Phase.IMPORT_SCHEDULED, Phase.IMPORT_IN_PROGRESS, "Importer", "Import")
    view = View(
        "d", phases, pvc_phase="Bound", pod_phase="Pending",
        pod_problem=("ImagePullFailed", "failed to pull image: x"),
    )  # fmt: skip
    status = compute_status(view, None, "2026-01-01T00:00:00Z")
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert (running["status"], running["reason"]) == ("False", "ImagePullFailed")
    assert status["phase"] == "ImportScheduled"


def _finished(
    image_id: str, containers: tuple[str, ...] = ("server", "importer")
) -> dict[str, Any]:
    return {
        "spec": {"containers": [{"name": n} for n in containers]},
        "status": {"containerStatuses": [{"name": "server", "imageID": image_id}]},
    }


def test_the_node_pull_digest_is_the_kubelets_image_id() -> None:
    message = TerminationMessage(reason="Completed", message="Import Complete")
    got = with_node_digest(message, _finished(f"127.0.0.1:5000/disks/x@{DIGEST}"))
    assert got.source_digest == DIGEST
    claimed = TerminationMessage(reason="Completed", message="", source_digest="sha256:" + "0" * 64)
    assert with_node_digest(claimed, _finished("docker-pullable://x")).source_digest is None
    pod_pull = with_node_digest(claimed, _finished("x@" + DIGEST, ("importer",)))
    assert pod_pull.source_digest == claimed.source_digest


def test_typed_errors_of_the_walk_are_worker_errors() -> None:
    assert issubclass(RegistryImageInvalid, WorkerError) and not UnsafeImage.transient


# -- a DataImportCron with a node-pull template -----------------------------------------------
def test_a_node_pull_poll_checks_the_held_image_and_reports_no_digest_of_its_own(
    tmp_path: Path,
) -> None:
    """``IMPORTER_REGISTRY_POLL`` with node pull: the importer waits for the holder, checks the
    image holds one disk, reports its labels; the digest is the kubelet's, not the pod's."""
    config = from_env({**NODE_ENV, "IMPORTER_REGISTRY_POLL": "true"})
    assert config.poll_only and isinstance(config.source, NodePullOptions)
    shared, proc = tmp_path / "shared", tmp_path / "proc"
    shared.mkdir()
    pid = os.getpid()  # a live process, as the holder's pid must be
    (shared / "ready").write_text(f"{pid}\n")
    root = proc / str(pid) / "root" / "disk"
    root.mkdir(parents=True)
    (root / "disk.img").write_bytes(b"\0" * 4096)
    (proc / str(pid) / "environ").write_bytes(b"TEST_KUBEVIRT_IO_TEST=cron\0")
    options = NodePullOptions(NODE_ENV["IMPORTER_ENDPOINT"], str(shared), 5.0, str(proc))
    message = asyncio.run(run_import(dataclasses.replace(config, source=options)))
    assert message.succeeded, message
    assert message.source_digest is None
    assert message.labels == {"test.kubevirt.io/test": "cron"}
    (root / "other.img").write_bytes(b"x")  # two files: CDI's InvalidImage, a failed poll
    work = lambda: run_import(dataclasses.replace(config, source=options))  # noqa: E731
    failed = asyncio.run(guarded(work, None, logging.getLogger(__name__)))
    assert not failed.succeeded and failed.reason == "InvalidImage", failed


def test_a_node_pull_cron_poller_is_cdis_pod_with_the_tag_pulled_always() -> None:
    cron = Cron.from_obj(
        {
            "metadata": {"name": "c", "namespace": "ns", "uid": "cron-uid-1234"},
            "spec": {
                "schedule": "* * * * *",
                "managedDataSource": "golden",
                "template": {
                    "spec": {
                        "source": {
                            "registry": {
                                "url": "docker://127.0.0.1:5000/disks/x:latest",
                                "pullMethod": "node",
                            }
                        }
                    }
                },
            },
        }
    )
    pod = poller_pod(cron, ImporterPodConfig(image="quay.io/cdi-py/cdi-importer:1"))
    assert pod["metadata"]["name"] == "poller-c-cron-uid"
    spec = pod["spec"]
    server, importer = spec["containers"]
    assert server["name"] == "server" and server["image"] == "127.0.0.1:5000/disks/x:latest"
    assert server["imagePullPolicy"] == "Always"  # the tag is resolved afresh on every poll
    assert server["command"] == ["/shared/cdi-holder"] and "env" not in server
    assert [c["name"] for c in spec["initContainers"]] == ["holder-init"]
    env = {e["name"]: e.get("value") for e in importer["env"]}
    assert env["IMPORTER_REGISTRY_POLL"] == "true" and env["IMPORTER_PULL_METHOD"] == "node"
    assert not any("persistentVolumeClaim" in v for v in spec["volumes"])
