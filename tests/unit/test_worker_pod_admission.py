"""Every worker pod carries what a namespace's ResourceQuota, LimitRange and scheduler look at:
container requests and limits from CDIConfig, the DataVolume's priorityClassName, CDIConfig's
imagePullSecrets and (where CDI sets it) the DataVolume's service account; and a 403 from the
quota admission plugin is told apart from any other 403, once, in the gateway."""

from __future__ import annotations

import json
from typing import Any

import pytest

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.controller.dataimportcron_desired import Cron, poller_pod
from cdi.kube.errors import Forbidden, QuotaExceeded, from_status
from cdi.render.clone_pod import CloneSourcePod, render_clone_source_pod
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.pvc import render_pvc
from cdi.render.upload_pod import UploadPodConfig, render_upload_pod
from cdi.render.worker_pod import WorkerPod

RESOURCES = {
    "requests": {"cpu": "200m", "memory": "100M"},
    "limits": {"cpu": "1", "memory": "1G"},
}
CONFIG = CDIConfig.from_dict(
    {
        "metadata": {"name": "config"},
        "spec": {"imagePullSecrets": [{"name": "pull"}]},
        "status": {"defaultPodResourceRequirements": RESOURCES},
    }
)


def datavolume(source: dict[str, Any]) -> DataVolume:
    return DataVolume.from_dict(
        {
            "metadata": {"name": "disk", "namespace": "tenant", "uid": "dv-uid"},
            "spec": {
                "source": source,
                "pvc": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
                "priorityClassName": "urgent",
                "serviceAccountName": "importer-sa",
            },
        }
    )


def claim_for(dv: DataVolume) -> dict[str, Any]:
    """The claim as the controller renders it (priority class and SA as annotations)."""
    pvc = render_pvc(dv, None, CONFIG)
    pvc["metadata"]["uid"] = "pvc-uid"
    return pvc


def importer() -> dict[str, Any]:
    dv = datavolume({"http": {"url": "http://example.com/disk.img"}})
    return render_importer_pod(dv, claim_for(dv), ImporterPodConfig(image="i", cdi_config=CONFIG))


def poller() -> dict[str, Any]:
    cron = Cron.from_obj(
        {
            "metadata": {"name": "cron", "namespace": "tenant", "uid": "cron-uid"},
            "spec": {
                "template": {
                    "spec": {
                        "source": {"registry": {"url": "docker://quay.io/t/disk:v1"}},
                        "priorityClassName": "urgent",
                        "serviceAccountName": "importer-sa",
                    }
                },
                "schedule": "* * * * *",
                "managedDataSource": "golden",
            },
        }
    )
    return poller_pod(cron, ImporterPodConfig(image="i", cdi_config=CONFIG))


def upload_server() -> dict[str, Any]:
    dv = datavolume({"upload": {}})
    return render_upload_pod(claim_for(dv), UploadPodConfig(image="u", cdi_config=CONFIG))


def clone_source() -> dict[str, Any]:
    dv = datavolume({"pvc": {"namespace": "golden", "name": "fedora"}})
    source = {"metadata": {"name": "fedora", "namespace": "golden"}, "spec": {}}
    config = CloneSourcePod(WorkerPod(image="c"), "secret", cdi_config=CONFIG)
    return render_clone_source_pod(dv, source, claim_for(dv), config)


WORKERS = {
    "importer": importer,
    "poller": poller,
    "upload server": upload_server,
    "clone source": clone_source,
}


@pytest.mark.parametrize("render", WORKERS.values(), ids=list(WORKERS))
def test_every_container_of_every_worker_pod_has_cdiconfigs_requests_and_limits(
    render: Any,
) -> None:
    pod = render()
    containers = [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]
    assert containers
    for container in containers:
        assert container["resources"] == RESOURCES, container["name"]


@pytest.mark.parametrize("render", WORKERS.values(), ids=list(WORKERS))
def test_every_worker_pod_has_the_priority_class_and_pull_secrets(render: Any) -> None:
    spec = render()["spec"]
    assert spec["priorityClassName"] == "urgent"
    assert spec["imagePullSecrets"] == [{"name": "pull"}]


@pytest.mark.parametrize("render", [importer, poller, upload_server], ids=str)
def test_pods_in_the_datavolumes_namespace_run_as_its_service_account(render: Any) -> None:
    assert render()["spec"]["serviceAccountName"] == "importer-sa"


def test_the_clone_source_pod_names_no_service_account_of_the_target_namespace() -> None:
    assert "serviceAccountName" not in clone_source()["spec"]


def test_without_cdiconfig_the_pods_get_cdis_default_requests_and_limits() -> None:
    dv = datavolume({"pvc": {"namespace": "golden", "name": "fedora"}})
    source = {"metadata": {"name": "fedora", "namespace": "golden"}, "spec": {}}
    pod = render_clone_source_pod(
        dv, source, claim_for(dv), CloneSourcePod(WorkerPod(image="c"), "s")
    )
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {
        "requests": {"cpu": "100m", "memory": "60M"},
        "limits": {"cpu": "750m", "memory": "600M"},
    }
    assert "imagePullSecrets" not in pod["spec"]


def status_body(message: str) -> bytes:
    body = {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403}
    return json.dumps({**body, "message": message, "details": {"kind": "pods"}}).encode()


def test_a_refusal_by_a_resource_quota_is_its_own_forbidden() -> None:
    err = from_status(
        403,
        status_body(
            'pods "importer-disk" is forbidden: exceeded quota: small, requested: '
            "limits.cpu=750m, used: limits.cpu=0, limited: limits.cpu=500m"
        ),
    )
    assert isinstance(err, QuotaExceeded) and isinstance(err, Forbidden)
    assert err.reason == "Forbidden" and "exceeded quota" in err.message


def test_other_refusals_stay_plain_forbidden() -> None:
    rbac = from_status(403, status_body('pods is forbidden: User "x" cannot create resource'))
    assert type(rbac) is Forbidden
    other = from_status(422, status_body("exceeded quota: looks alike, but is not a 403"))
    assert not isinstance(other, Forbidden)
