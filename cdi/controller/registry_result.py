"""What a successful import adds to its PVC: that preallocation was applied, and for a registry
import the image's labels and its digest.

``cdi.kubevirt.io/storage.preallocation: "true"`` when the importer preallocated the target
(its termination message says so), as CDI records it; KubeVirt reads it (``IsPreallocated``).

CDI copies a containerDisk's ``KUBEVIRT_IO_`` environment variables to the PVC as labels
(``test.kubevirt.io/test``, ``instancetype.kubevirt.io/default-preference``); the importer
reports them in its termination message. The message comes from a pod that ran tenant-chosen
bytes, so only label keys of the ``<prefix>.kubevirt.io/<name>`` shape are taken, never
``cdi.kubevirt.io/*`` (the controller's own), and at most ``MAX_LABELS``. The manifest digest a
tag resolved to is recorded as ``cdi.kubevirt.io/storage.import.sourceDigest``, so the import
is reproducible (``docker://repo@<digest>``). For a node pull the kubelet pulled the image, so
the digest is the ``imageID`` the node reports for the pod's ``server`` container
(``<repo>@sha256:...``), never anything the pod wrote.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from cdi.api.constants import ANN_PREALLOCATION_APPLIED, NODE_PULL_CONTAINER_NAME
from cdi.api.termination import TerminationMessage

ANN_SOURCE_DIGEST = "cdi.kubevirt.io/storage.import.sourceDigest"
MAX_LABELS = 16
_KEY = re.compile(
    r"[a-z0-9]([-a-z0-9.]{0,200}[a-z0-9])?\.kubevirt\.io/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)
_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def result_patch(message: TerminationMessage | None) -> dict[str, Any] | None:
    """A merge patch for the PVC, or None when the import reported nothing to record."""
    if message is None:
        return None
    labels = {
        k: v
        for k, v in sorted(message.labels.items())[:MAX_LABELS]
        if isinstance(k, str) and isinstance(v, str) and _KEY.fullmatch(k) and _VALUE.fullmatch(v)
        and not k.startswith("cdi.kubevirt.io/")
    }  # fmt: skip
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = labels
    annotations = {}
    if message.source_digest and _DIGEST.fullmatch(message.source_digest):
        annotations[ANN_SOURCE_DIGEST] = message.source_digest
    if message.preallocation_applied:
        annotations[ANN_PREALLOCATION_APPLIED] = "true"
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta} if meta else None


def node_pull_digest(pod: dict[str, Any]) -> str | None:
    """The manifest digest the kubelet reports for the node-pull ``server`` container."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == NODE_PULL_CONTAINER_NAME:
            digest = str(cs.get("imageID") or "").rpartition("@")[2]
            return digest if _DIGEST.fullmatch(digest) else None
    return None


def with_node_digest(message: TerminationMessage, pod: dict[str, Any]) -> TerminationMessage:
    """``message`` with the node-pull digest, for a node-pull pod (the pod has a ``server``
    container only then); any digest the worker itself claimed is replaced."""
    containers = (pod.get("spec") or {}).get("containers") or []
    if not any(c.get("name") == NODE_PULL_CONTAINER_NAME for c in containers):
        return message
    return dataclasses.replace(message, source_digest=node_pull_digest(pod))
