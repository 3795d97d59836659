"""Uploads into plain PVCs: a PVC annotated ``cdi.kubevirt.io/storage.upload.target`` that no
DataVolume owns gets an upload server, as CDI's PVC-level upload controller gives it.

Why a reconciler of its own rather than a flavour: the flavour machinery is keyed by
DataVolume (it reads one, writes its status, emits its phase events); a plain PVC has none of
that. What fills the claim is the same, so this reconciler drives the same ``UploadWorker`` the
DataVolume flavour drives; only the reading and the waiting differ:

- a PVC being deleted loses its server first (the server pod holds the claim's protection
  finalizer, so the claim could never go otherwise), whoever owns it;
- a PVC owned by a DataVolume (or created for one) is otherwise the DataVolume reconciler's,
  and a populator's prime claim the upload populator's (``cdi.controller.populators.upload``);
- a PVC without the annotation (removed, or never there) gets its server, Service and Secret
  deleted, if it has any (CDI: removing the annotation deletes the upload pod);
- a PVC that is not Bound waits, unless its class is WaitForFirstConsumer and the PVC asks for
  immediate binding (``storage.bind.immediate.requested``, CDI's force-bind): then the server
  pod is its first consumer;
- once the outcome is recorded, the worker's cleanup runs (pod, Service and Secret go).

What wakes it (``watches``): a PVC maps to itself when it is a plain upload target, or when
it has an upload server and is no target any more or is being deleted (the server must go
first); an upload server pod to the claim that controls it.

Events (``UploadReady``, ``UploadSucceeded``, ``UploadFailed``) go to the PVC.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from cdi.api.config import CDIConfig
from cdi.api.constants import (
    ANN_CREATED_FOR_DATAVOLUME,
    ANN_IMMEDIATE_BINDING,
    ANN_UPLOAD_REQUEST,
    KIND_DATAVOLUME,
    LABEL_COMPONENT,
)
from cdi.controller.flavours.upload import Action, Target, UploadWorker
from cdi.controller.record import ClaimRecord
from cdi.kube.client import PODS, PVCS, AsyncKube, object_key, split_key
from cdi.kube.events import NORMAL, WARNING, EventRecorder
from cdi.kube.watches import Maps, Owns, Watches, one
from cdi.kube.workqueue import Result
from cdi.render.prime import PVC_KIND, is_prime
from cdi.render.upload_pod import UPLOAD_COMPONENT, upload_pod_name

log = logging.getLogger(__name__)


class Store(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...


def owned_by_datavolume(pvc: Mapping[str, Any]) -> bool:
    meta = pvc.get("metadata") or {}
    if (meta.get("annotations") or {}).get(ANN_CREATED_FOR_DATAVOLUME):
        return True
    refs = meta.get("ownerReferences") or []
    return any(r.get("controller") and r.get("kind") == KIND_DATAVOLUME for r in refs)


def is_upload_target(pvc: Mapping[str, Any]) -> bool:
    return ANN_UPLOAD_REQUEST in ((pvc.get("metadata") or {}).get("annotations") or {})


def is_upload_pod(pod: Mapping[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_COMPONENT) == UPLOAD_COMPONENT


def upload_key(pvc: dict[str, Any], pods: Store) -> str | None:
    """A plain PVC that is an upload target, or any PVC with an upload server (in ``pods``)
    that is no target any more or is being deleted (the server must go first)."""
    meta = pvc.get("metadata") or {}
    server = f"{meta.get('namespace')}/{upload_pod_name(str(meta.get('name')))}"
    has_server = pods.get(server) is not None
    if has_server and meta.get("deletionTimestamp"):
        return object_key(pvc)
    if owned_by_datavolume(pvc) or is_prime(pvc):
        return None
    return object_key(pvc) if is_upload_target(pvc) or has_server else None


def watches(pods: Store) -> Watches:
    return Watches(
        (
            Maps(PVCS, one(lambda pvc: upload_key(pvc, pods))),
            Owns(PODS, (KIND_DATAVOLUME, PVC_KIND), where=is_upload_pod),
        )
    )


class UploadPVCReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        worker: UploadWorker,
        events: EventRecorder,
        storage_classes: Store,
        cdi_config: Callable[[], CDIConfig],  # the DataVolume reconciler's view of the config
    ) -> None:
        self.kube, self.worker, self.events = kube, worker, events
        self.storage_classes = storage_classes
        self.cdi_config = cdi_config

    async def reconcile(self, key: str) -> Result:
        namespace, name = split_key(key)
        pvc = await self.kube.get_or_none(PVCS, name, namespace)
        if pvc is None:
            return Result()
        if (pvc.get("metadata") or {}).get("deletionTimestamp"):
            # The server pod uses the claim, so the claim's protection finalizer waits for it,
            # while garbage collection waits for the claim: the server goes first (also for a
            # DataVolume's claim, whose reconciler no longer runs once the DataVolume is gone).
            await self.worker.remove(pvc)
            return Result()
        if owned_by_datavolume(pvc) or is_prime(pvc):
            return Result()
        if not is_upload_target(pvc):
            await self.worker.remove(pvc)
            return Result()
        record = ClaimRecord.from_pvc(pvc)
        config = self.cdi_config()
        claim = Target(pvc, record, config)
        if record.done:
            await self.worker.cleanup(claim)
            return Result()
        if not self._may_start(pvc):
            return Result()
        seen = await self.worker.step(claim, pvc)
        await self._event(pvc, seen.assessment.action, seen.record)
        return Result(requeue_after=seen.requeue_after)

    def _may_start(self, pvc: Mapping[str, Any]) -> bool:
        if (pvc.get("status") or {}).get("phase") == "Bound":
            return True
        sc_name = (pvc.get("spec") or {}).get("storageClassName")
        sc = self.storage_classes.get(str(sc_name)) if sc_name else None
        waiting = bool(sc and sc.get("volumeBindingMode") == "WaitForFirstConsumer")
        annotations = (pvc.get("metadata") or {}).get("annotations") or {}
        return waiting and ANN_IMMEDIATE_BINDING in annotations

    async def _event(self, pvc: dict[str, Any], action: Action, record: ClaimRecord) -> None:
        ann = pvc["metadata"].get("annotations") or {}
        name = pvc["metadata"]["name"]
        if action == Action.READY and ann.get("cdi.kubevirt.io/storage.pod.ready") != "true":
            await self.events.emit(pvc, NORMAL, "UploadReady", f"Upload into {name} ready")
        elif action == Action.SUCCEED:
            message = f"Successfully uploaded into {name}"
            await self.events.emit(pvc, NORMAL, "UploadSucceeded", message)
        elif action == Action.FAIL:
            await self.events.emit(
                pvc, WARNING, "UploadFailed", f"{record.reason}: {record.message}"
            )
