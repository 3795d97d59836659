"""Every kind of pod the controller renders, rendered by the project's renderers: the test data
of the controller's pod policy (deploy/15-admission-policy.yaml), on the real API server
(tests/integration/datavolumes/test_admission_policy.py) and in unit tests of the policy's
environment allow-list (tests/unit/test_worker_pod_policy.py)."""

from __future__ import annotations

from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.controller.dataimportcron_desired import Cron, poller_pod
from cdi.render.clone_pod import CloneSourcePod, client_secret_name, render_clone_source_pod
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.size_detection import render_size_detection_pod
from cdi.render.upload_pod import UploadPodConfig, render_upload_pod
from cdi.render.worker_pod import WorkerPod

IMPORTER_IMAGE = "quay.io/cdi-py/cdi-importer:latest"  # the controller's --importer-image


HTTP_SOURCE = {"http": {"url": "http://127.0.0.1:9/disk.img"}}
NODE_PULL_SOURCE = {"registry": {"url": "docker://quay.io/tenant/disk:v1", "pullMethod": "node"}}


def importer_pod(namespace: str, source: dict[str, Any] = HTTP_SOURCE) -> dict[str, Any]:
    dv = DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": namespace, "uid": "dv-uid"},
            "spec": {
                "source": source,
                "pvc": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            },
        }
    )
    pvc = {
        "metadata": {"name": "disk", "namespace": namespace, "uid": "pvc-uid"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    config = ImporterPodConfig(
        image=IMPORTER_IMAGE,
        scratch_pvc_name="disk-scratch",
        proxy_auth_secret="import-proxy-auth-disk-0123456789",
    )
    return render_importer_pod(dv, pvc, config)


UPLOAD_IMAGE = "quay.io/cdi-py/cdi-uploadserver:latest"
CLONER_IMAGE = "quay.io/cdi-py/cdi-cloner:latest"
TARGET_UID = "0f6c2a4e-1b7d-4c55-9a1e-3d2b7c8e9f01"


def claim_of(namespace: str, name: str, mode: str = "Filesystem") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": TARGET_UID, "annotations": {}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": mode,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def datavolume_of(namespace: str, source: dict[str, Any]) -> DataVolume:
    return DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": namespace, "uid": "dv-uid"},
            "spec": {"source": source, "pvc": {"resources": {"requests": {"storage": "1Gi"}}}},
        }
    )


def worker_pods(namespace: str) -> dict[str, dict[str, Any]]:
    """Every kind of pod the controller renders, with every optional Secret and mount, as the
    controller renders them (image entry point, no command)."""
    http_all = {
        "http": {
            "url": "http://127.0.0.1:9/disk.img",
            "secretRef": "creds",
            "certConfigMap": "ca",
            "secretExtraHeaders": ["hdr-a", "hdr-b"],
        }
    }
    entry = ImporterPodConfig(
        image=IMPORTER_IMAGE,
        command=(),
        scratch_pvc_name="disk-scratch",
        proxy_auth_secret="import-proxy-auth-disk-0123456789",
        proxy_ca_config_map="import-proxy-cm-disk",
    )
    claim = claim_of(namespace, "disk")
    cron = Cron.from_obj(
        {
            "metadata": {"name": "cron", "namespace": namespace, "uid": "cron-uid"},
            "spec": {
                "template": {
                    "spec": {"source": {"registry": {"url": "docker://quay.io/t/disk:v1"}}}
                },
                "schedule": "* * * * *",
                "managedDataSource": "golden",
            },
        }
    )
    node_cron = Cron.from_obj(
        {
            "metadata": {"name": "node-cron", "namespace": namespace, "uid": "node-cron-uid"},
            "spec": {
                "template": {"spec": {"source": NODE_PULL_SOURCE}},
                "schedule": "* * * * *",
                "managedDataSource": "node-golden",
            },
        }
    )
    upload = UploadPodConfig(image=UPLOAD_IMAGE, deadline="2030-01-01T00:00:00Z")
    source = claim_of(namespace, "source")
    clone = CloneSourcePod(WorkerPod(image=CLONER_IMAGE), client_secret_name(claim))
    block_source = claim_of(namespace, "source", "Block")
    pods = {
        "importer": render_importer_pod(datavolume_of(namespace, http_all), claim, entry),
        "importer-default-command": importer_pod(namespace),
        "importer-block": render_importer_pod(  # the /scratch emptyDir fallback, sizeLimit
            datavolume_of(namespace, HTTP_SOURCE),
            claim_of(namespace, "disk", "Block"),
            ImporterPodConfig(image=IMPORTER_IMAGE, command=(), scratch_empty_dir=True),
        ),
        "size-detection": render_size_detection_pod(
            source, datavolume_of(namespace, {}), CDIConfig(), IMPORTER_IMAGE
        ),
        "node-pull": render_importer_pod(datavolume_of(namespace, NODE_PULL_SOURCE), claim, entry),
        "poller": poller_pod(cron, entry),
        "node-pull-poller": poller_pod(node_cron, entry),
        "upload": render_upload_pod(claim, upload),
        "upload-block": render_upload_pod(claim_of(namespace, "disk", "Block"), upload),
        "clone-source": render_clone_source_pod(datavolume_of(namespace, {}), source, claim, clone),
        "clone-source-block": render_clone_source_pod(
            datavolume_of(namespace, {}), block_source, claim, clone
        ),
    }
    for pod in pods.values():
        pod["metadata"]["namespace"] = namespace
    return pods
