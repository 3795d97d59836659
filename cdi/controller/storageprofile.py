"""The StorageProfile reconciler: one profile per StorageClass, created and kept current.

Keyed by StorageClass name (the profile has the same name). Level-triggered, as the other
reconcilers: it reads the class and the profile fresh from the API server, and

1. no class (or a class being deleted): delete the profile, if any;
2. no profile: create an empty one (``spec: {}``), as CDI does, so users have an object to put
   their overrides in;
3. add the advised ``minimumSupportedPvcSize`` annotation if the provisioner has one and the
   profile none;
4. compute the status (``cdi.render.storageprofile``; the VolumeSnapshotClass for the class's
   provisioner, chosen as a clone would, decides the default clone strategy: no snapshot API,
   no class), merge condition timestamps, and write
   it once, only when it differs, by replacing the status subresource (a merge patch could not
   remove a field that is no longer wanted). A stale resourceVersion is a 409: the work queue
   retries with the fresh object.

What wakes it (``watches``): a StorageClass or StorageProfile maps to the profile of its name,
so a user's spec change is applied at once, and a hand-edited status is put back; a
VolumeSnapshotClass (``cdi.controller.snapshotwatch``) to every profile, since the default
clone strategy depends on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from cdi.api.codec import SchemaError
from cdi.api.config import StorageProfileSpec
from cdi.controller.status import merge_conditions
from cdi.kube.client import (
    STORAGE_CLASSES,
    STORAGE_PROFILES,
    VOLUME_SNAPSHOT_CLASSES,
    AsyncKube,
    object_key,
)
from cdi.kube.errors import NotFound
from cdi.kube.watches import For, Maps, Watches, one
from cdi.kube.workqueue import Result
from cdi.render import storageprofile as render
from cdi.render.clone_snapshot import choose_snapshot_class

log = logging.getLogger(__name__)

JSON = dict[str, Any]


class Store(Protocol):
    def items(self) -> list[JSON]: ...


def watches(storage_classes: Store) -> Watches:
    def every_profile(_obj: JSON) -> list[str]:
        return [object_key(sc) for sc in storage_classes.items()]

    return Watches(
        (
            Maps(STORAGE_CLASSES, one(object_key)),  # the profile has its class's name
            For(STORAGE_PROFILES),
            Maps(VOLUME_SNAPSHOT_CLASSES, every_profile),
        )
    )


class StorageProfileReconciler:
    def __init__(self, kube: AsyncKube, now: Callable[[], str]) -> None:
        self.kube = kube
        self.now = now

    async def reconcile(self, key: str) -> Result:
        sc = await self.kube.get_or_none(STORAGE_CLASSES, key)
        profile = await self.kube.get_or_none(STORAGE_PROFILES, key)
        if sc is None or (sc.get("metadata") or {}).get("deletionTimestamp"):
            if profile is not None:
                await self._delete(key)
            return Result()
        if profile is None:
            profile = await self.kube.create_if_absent(STORAGE_PROFILES, render.new_profile(sc))
            if profile is None:
                return Result(requeue_after=0.5)  # created meanwhile: read it next time
        try:
            spec = StorageProfileSpec.from_dict(profile.get("spec") or {})
        except SchemaError as exc:
            log.warning("StorageProfile %s: unparsable spec: %s", key, exc)
            return Result()
        profile = await self._annotate(sc, profile)
        snapshot_class = await self._snapshot_class(str(sc.get("provisioner") or ""), spec)
        await self._write_status(profile, render.desired_status(sc, spec, snapshot_class))
        return Result()

    async def _snapshot_class(self, provisioner: str, spec: StorageProfileSpec) -> str | None:
        try:
            found = await self.kube.list(VOLUME_SNAPSHOT_CLASSES)
        except NotFound:
            return None  # no snapshot API on this cluster
        choice = choose_snapshot_class(provisioner, found.get("items") or [], spec.snapshot_class)
        return choice.name if choice else None

    async def _delete(self, name: str) -> None:
        await self.kube.delete_if_present(STORAGE_PROFILES, name)

    async def _annotate(self, sc: JSON, profile: JSON) -> JSON:
        meta = profile.get("metadata") or {}
        extra = render.missing_annotations(sc, meta.get("annotations") or {})
        if not extra:
            return profile
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": extra}}
        return await self.kube.patch(STORAGE_PROFILES, str(meta["name"]), patch)

    async def _write_status(self, profile: JSON, wanted: JSON) -> None:
        old = dict(profile.get("status") or {})
        new = dict(wanted)
        new["conditions"] = merge_conditions(
            old.get("conditions") or [], wanted["conditions"], self.now()
        )
        if new == old:
            return
        await self.kube.replace(STORAGE_PROFILES, {**profile, "status": new}, sub="status")
