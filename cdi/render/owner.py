"""The one place an owner reference is built.

Every object a DataVolume owns (its PVC, its importer pod) carries the same controller reference,
so garbage collection and the controller's "map a child to its owner's key" watch agree. Our
importer pod is owned by the DataVolume, not by the PVC as in CDI: one reconciler per primary
kind needs children that point at that kind (CONVENTIONS.md), and an adopted PVC that outlives
its DataVolume must not keep an importer pod alive.
"""

from __future__ import annotations

from typing import Any

from cdi.api.types import DataVolume


def controller_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def datavolume_reference(dv: DataVolume) -> dict[str, Any]:
    return controller_reference(dv.api_version, dv.kind, dv.name, dv.uid)
