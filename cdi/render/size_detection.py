"""The size-detection pod of a clone (CDI ``makeSizeDetectionPodSpec``) and what it leaves.

A host-assisted clone without a size, of a filesystem source holding a ``kubevirt`` image, is
sized from the image (``cdi.render.clone``, "Sizing"). CDI measures it with a pod; so do we:

- named ``size-detection-<source claim UID>`` in the source's namespace, labelled ``app:
  containerized-data-importer`` and ``cdi.kubevirt.io: importer`` (CDI's), owned by the
  DataVolume when it is in the same namespace (CDI: otherwise no owner; the controller deletes
  it once read, whatever happened);
- the importer image with ``IMPORTER_SIZE_DETECTION_PATH=/data/disk.img`` (not CDI's separate
  binary: ``importer.size_detection``), the source claim mounted read-only at ``/data`` (the
  clone's in-use rule counts only writers, so the measuring pod never blocks it), the workers'
  restricted security, resources and placement, ``restartPolicy: Never``, the termination
  message at ``/dev/termination-log``: the typed ``TerminationMessage`` whose
  ``virtual_size`` is the answer;
- the answer is cached on the source claim as CDI caches it: ``cdi.Kubervirt.io/virtualSize``
  (bytes) and ``cdi.Kubervirt.io/sourceCapacity`` (the claim's ``status.capacity.storage`` it
  was measured at; CDI's keys, typo included). A later clone of the same capacity reads it
  without a pod (``cdi.render.clone.content_size``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    DATA_MOUNT_PATH,
    LABEL_APP,
    LABEL_APP_VALUE,
    LABEL_COMPONENT,
    TERMINATION_LOG_PATH,
    TMP_DIR,
    ImporterEnv,
)
from cdi.api.types import DataVolume
from cdi.render.clone import ANN_SOURCE_CAPACITY, ANN_VIRTUAL_SIZE
from cdi.render.owner import datavolume_reference
from cdi.render.placement import pod_placement
from cdi.render.worker_pod import (
    admission_fields,
    container_security_context,
    pod_security_context,
    worker_resources,
)

CONTAINER = "size-detection-volume"  # CDI's container name
DATA_VOLUME = "cdi-data-vol"
TMP_VOLUME = "tmp"
IMAGE_PATH = f"{DATA_MOUNT_PATH}/disk.img"
COMPONENT = "importer"  # CDI labels the pod as an importer


def size_detection_pod_name(source: Mapping[str, Any]) -> str:
    return f"size-detection-{(source.get('metadata') or {}).get('uid')}"


def render_size_detection_pod(
    source: Mapping[str, Any],
    dv: DataVolume,
    cdi: CDIConfig,
    image: str,
    pull_policy: str = "IfNotPresent",
) -> dict[str, Any]:
    """The pod that measures ``source``'s ``disk.img`` for ``dv``'s clone."""
    meta = source.get("metadata") or {}
    namespace = str(meta.get("namespace") or dv.namespace)
    pod_meta: dict[str, Any] = {
        "name": size_detection_pod_name(source),
        "namespace": namespace,
        "labels": {LABEL_APP: LABEL_APP_VALUE, LABEL_COMPONENT: COMPONENT},
    }
    if namespace == dv.namespace:
        pod_meta["ownerReferences"] = [datavolume_reference(dv)]
    container = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "env": [{"name": str(ImporterEnv.SIZE_DETECTION_PATH), "value": IMAGE_PATH}],
        "resources": worker_resources(cdi),
        "terminationMessagePath": TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": DATA_VOLUME, "mountPath": DATA_MOUNT_PATH, "readOnly": True},
            {"name": TMP_VOLUME, "mountPath": TMP_DIR},
        ],
    }
    claim = {"claimName": str(meta.get("name")), "readOnly": True}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [
            {"name": DATA_VOLUME, "persistentVolumeClaim": claim},
            {"name": TMP_VOLUME, "emptyDir": {}},
        ],
    }
    spec.update(admission_fields(cdi, dv.spec.priority_class_name))
    spec.update(pod_placement(cdi.workload, {}, None))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec}


def measured_annotations(source: Mapping[str, Any], virtual_size: int) -> dict[str, str] | None:
    """The cache CDI writes on the source claim, or None when the claim reports no capacity
    (a measurement that cannot be tied to a capacity is not kept)."""
    capacity = ((source.get("status") or {}).get("capacity") or {}).get("storage")
    if capacity is None or virtual_size <= 0:
        return None
    return {ANN_VIRTUAL_SIZE: str(virtual_size), ANN_SOURCE_CAPACITY: str(capacity)}
