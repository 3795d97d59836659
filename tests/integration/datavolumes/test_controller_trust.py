"""The controller trusts only what it made, end to end: the real API server, the controller as a
process, pods on the local node. A tenant's forged CDI annotations on a DataVolume do not become
the import's record, and a tenant's pod squatting the importer's or the upload server's name
(labels, owner reference and all) is never followed: it is reported, deleted, and the real
worker runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cdi.api.termination import TerminationMessage
from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    ControllerProcess,
    datavolume,
    dv_path,
    events_for,
    pv_of,
    wait_phase,
)

pytestmark = pytest.mark.integration

FORGED = {
    "cdi.kubevirt.io/storage.pod.phase": "Failed",
    "cdi.kubevirt.io/storage.import.fatalError": "true",
    "cdi.kubevirt.io/storage.condition.running.reason": "Forged",
    "cdi.kubevirt.io/storage.condition.running.message": "forged by the tenant",
    "cdi.kubevirt.io/storage.requester.username": "system:admin",
    "cdi.kubevirt.io/storage.clone.token": "forged",
}


def test_forged_record_annotations_on_a_datavolume_are_not_state(
    kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    manifest = datavolume("forged", {"blank": {}}, size="8Mi", annotations=FORGED)
    kube.create(dv_path(namespace), manifest)
    dv = wait_phase(kube, namespace, "forged", ("Succeeded", "Failed"), 90)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "forged"))
    ann = pvc["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/storage.pod.phase"] == "Succeeded"
    for key in (
        "cdi.kubevirt.io/storage.import.fatalError",
        "cdi.kubevirt.io/storage.requester.username",
        "cdi.kubevirt.io/storage.clone.token",
    ):
        assert key not in ann, key
    assert (Path(pv_of(kube, namespace, "forged")["spec"]["local"]["path"]) / "disk.img").exists()


def test_a_pod_squatting_the_upload_server_name_is_deleted_and_never_read(
    kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    """The same engine judges the upload server (``cdi.controller.workerpod``): a tenant's pod at
    ``cdi-upload-<claim>`` that "reports" a finished upload is reported and deleted, and the
    controller's own server is created in its place; the upload is never called done."""
    manifest = datavolume("squatup", {"upload": {}}, size="8Mi", storage_class="testkit-fs-wffc")
    created = kube.create(dv_path(namespace), manifest)
    wait_phase(kube, namespace, "squatup", ("WaitForFirstConsumer",), 30)
    done = TerminationMessage("Completed", "Upload Complete").to_json()
    pod = impostor("cdi-upload-squatup", created, verdict=done, exit_code=0)
    pod["metadata"]["labels"] = {"cdi.kubevirt.io": "cdi-upload-server"}
    pod["spec"]["containers"][0]["name"] = "cdi-upload-server"  # read, it would end the upload
    theirs = kube.create(ns_path(namespace, "pods"), pod)["metadata"]["uid"]
    dv = wait_phase(kube, namespace, "squatup", ("UploadReady", "Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "UploadReady", dv["status"]
    server = kube.get(ns_path(namespace, "pods", "cdi-upload-squatup"))
    assert server["metadata"]["uid"] != theirs
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "squatup"))
    assert (
        pvc["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.importPodUID"]
        == (server["metadata"]["uid"])
    )
    assert "cdi.kubevirt.io/storage.pod.phase" not in pvc["metadata"]["annotations"]
    wait_until(
        lambda: any(
            e["type"] == "Warning" and e["reason"] == "UnrecordedUploadPod"
            for e in events_for(kube, namespace, "squatup")
        ),
        "a Warning event about the unrecorded upload server pod",
        10,
    )


def impostor(
    name: str, dv: dict[str, Any], *, verdict: str | None = None, exit_code: int = 1
) -> dict[str, Any]:
    """A tenant's pod dressed as the importer: its name, labels, a controller reference to the
    DataVolume, the claim mounted; it "reports" a permanent failure through its log."""
    verdict = verdict or TerminationMessage("SourceNotFound", "forged by the tenant").to_json()
    meta = dv["metadata"]
    ref = {
        "apiVersion": dv["apiVersion"],
        "kind": "DataVolume",
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "containerized-data-importer", "cdi.kubevirt.io": "importer"},
            "ownerReferences": [ref],
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "importer",
                    "image": "busybox",
                    "command": ["/bin/sh", "-c", f"echo '{verdict}'; exit {exit_code}"],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": meta["name"]}}],
        },
    }


def test_a_pod_squatting_the_importer_name_is_deleted_and_never_read(
    kube: Kube, namespace: str, controller: ControllerProcess
) -> None:
    # WaitForFirstConsumer without immediate binding: the controller creates no pod, so the
    # tenant's pod comes first and binds the claim.
    manifest = datavolume("squat", {"blank": {}}, size="8Mi", storage_class="testkit-fs-wffc")
    created = kube.create(dv_path(namespace), manifest)
    wait_phase(kube, namespace, "squat", ("WaitForFirstConsumer",), 30)
    kube.create(ns_path(namespace, "pods"), impostor("importer-squat", created))
    dv = wait_phase(kube, namespace, "squat", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    wait_until(
        lambda: any(
            e["type"] == "Warning" and e["reason"] == "UnrecordedImporterPod"
            for e in events_for(kube, namespace, "squat")
        ),
        "a Warning event about the unrecorded pod",
        10,
    )
    volume = Path(pv_of(kube, namespace, "squat")["spec"]["local"]["path"])
    assert os.stat(volume / "disk.img").st_size > 0  # the real importer ran
