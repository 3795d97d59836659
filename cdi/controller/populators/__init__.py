"""Volume populators: claims that name a CDI source in ``spec.dataSourceRef`` (CDI
``pkg/controller/populators``).

Kubernetes keeps such a claim unbound (the CSI external-provisioner leaves a ``dataSourceRef``
it does not own alone), and a pod that mounts an unbound claim is not started. So a VM's pod
created at the same moment as its disk waits in Pending until the data is complete: the gate
is Kubernetes' own, not a convention a VM runtime must follow. The populator fills a *prime*
claim and moves its PV to the target (``cdi.render.prime``).

One reconciler per source kind, keyed by the *target* claim ("namespace/name"):
``import_.ImportPopulator`` for ``VolumeImportSource``, ``upload.UploadPopulator`` for
``VolumeUploadSource``, ``clone.ClonePopulator`` for ``VolumeCloneSource``, all on the
prime's life in ``handover.PrimePopulator``. What wakes each (``watches``, given its
``kinds``): a claim whose ``dataSourceRef`` names one of them maps to itself, its prime claim
and importer pods to it, an upload server pod through the prime that owns it
(``claim_target_key``, ``worker_pod_target_key``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.constants import ANN_POPULATOR_KIND
from cdi.kube.client import PODS, PVCS
from cdi.kube.watches import Maps, Watches, one
from cdi.render.prime import PVC_KIND, is_prime, populator_kind


def _owner_claim(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == PVC_KIND:
            return str(ref.get("name"))
    return None


def claim_target_key(pvc: Mapping[str, Any], kinds: tuple[str, ...]) -> str | None:
    """The target key of a PVC: itself when it names one of ``kinds``, its owner when it is a
    prime; None for any other claim."""
    meta = pvc.get("metadata") or {}
    ns = meta.get("namespace")
    if populator_kind(pvc) in kinds:
        return f"{ns}/{meta.get('name')}"
    owner = _owner_claim(meta)
    if owner and (meta.get("annotations") or {}).get(ANN_POPULATOR_KIND):
        return f"{ns}/{owner}"
    return None


def pod_target_key(pod: Mapping[str, Any]) -> str | None:
    """The target key of a worker pod: the claim that controls it."""
    meta = pod.get("metadata") or {}
    owner = _owner_claim(meta)
    return f"{meta.get('namespace')}/{owner}" if owner else None


def worker_pod_target_key(
    pod: Mapping[str, Any],
    claims: Callable[[str], Mapping[str, Any] | None],
    kinds: tuple[str, ...],
) -> str | None:
    """The target key of any worker pod: an importer pod's owner is the target itself, an
    upload server's is the prime (its Service is named after the prime, which the proxy
    dials), so that one maps on through the prime (``claims``: a PVC by key) to its owner."""
    key = pod_target_key(pod)
    owner = claims(key) if key else None
    if owner is not None and is_prime(owner):
        return claim_target_key(owner, kinds)
    return key


def watches(kinds: tuple[str, ...], claims: Callable[[str], Mapping[str, Any] | None]) -> Watches:
    """What wakes the populator of ``kinds`` (``claims``: a PVC by key, from the claim cache)."""
    return Watches(
        (
            Maps(PVCS, one(lambda pvc: claim_target_key(pvc, kinds))),
            Maps(PODS, one(lambda pod: worker_pod_target_key(pod, claims, kinds))),
        )
    )
