"""An import's scratch claim: made when an importer pod asked for scratch space, gone when the
import ends (CDI's ``createScratchPvcForPod`` and its cleanup; the claim's shape and class are
the pure ``cdi.render.scratch``).

The import flavour calls three things here:

- ``prepare`` before it creates a pod for a claim whose record says ``requires_scratch``: the
  scratch claim exists (created before the pod, so the pod never waits for a create that a
  crash skipped), or the pod gets the emptyDir fallback when no class can be found. A claim
  at the name that this import did not create (no owner reference to its owner's UID) is never
  mounted: the attempt waits with CDI's ``ErrResourceExists`` until it is gone. One being
  deleted (the previous import's) is waited for, as CDI breaks that deadlock.
- ``pending``: the scratch claim is not bound yet (the DataVolume's Bound condition says
  ``CreatingScratchSpace`` "Creating scratch space", CDI's words).
- ``release`` when the import has ended, succeeded or failed for good: ours is deleted by its
  UID. A failed importer pod kept for its logs holds it until that pod goes (the API server's
  ``kubernetes.io/pvc-protection``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.constants import ConditionReason
from cdi.controller.flavours import Claim, FlavourDeps
from cdi.kube.client import PVCS
from cdi.render.naming import scratch_pvc_name
from cdi.render.owner import datavolume_reference
from cdi.render.scratch import render_scratch_pvc, scratch_storage_class

CREATING_MESSAGE = "Creating scratch space"  # CDI's Bound condition message


@dataclass(frozen=True)
class ScratchChoice:
    """What the next importer pod mounts at ``/scratch``: a claim, the emptyDir fallback, or
    nothing yet (``wait``: the Running condition's reason and message meanwhile)."""

    claim_name: str | None = None
    empty_dir: bool = False
    wait: tuple[str, str] | None = None


def _namespace(claim: Claim) -> str:
    return str((claim.pvc.get("metadata") or {}).get("namespace") or claim.dv.namespace)


def _ours(found: Mapping[str, Any], owner: Mapping[str, Any]) -> bool:
    refs = (found.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner.get("uid") for ref in refs if owner.get("uid"))


class ScratchClaims:
    def __init__(self, deps: FlavourDeps) -> None:
        self.deps = deps

    async def prepare(self, claim: Claim) -> ScratchChoice:
        """The scratch space of the next pod of ``claim`` (see the module docstring). Raises
        ``RenderError`` when the target's size or overhead cannot be read."""
        storage_class = scratch_storage_class(claim.cdi_config, claim.pvc)
        if storage_class is None:
            return ScratchChoice(empty_dir=True)
        owner = datavolume_reference(claim.dv)
        body = render_scratch_pvc(claim.pvc, owner, claim.cdi_config, storage_class)
        name, namespace = str(body["metadata"]["name"]), _namespace(claim)
        if await self.deps.kube.create_if_absent(PVCS, body, namespace) is not None:
            return ScratchChoice(claim_name=name)
        found = await self.deps.kube.get_or_none(PVCS, name, namespace)
        if found is None:  # deleted between the two calls: again, next time
            return ScratchChoice(wait=(ConditionReason.CREATING_SCRATCH_SPACE, CREATING_MESSAGE))
        if (found.get("metadata") or {}).get("deletionTimestamp"):
            message = f"waiting for the earlier scratch claim {name} to be deleted"
            return ScratchChoice(wait=(ConditionReason.CREATING_SCRATCH_SPACE, message))
        if not _ours(found, owner):
            message = f"claim {name} exists and was not created for this import"
            return ScratchChoice(wait=(ConditionReason.ERR_RESOURCE_EXISTS, message))
        return ScratchChoice(claim_name=name)

    async def pending(self, claim: Claim) -> bool:
        """Our scratch claim exists and is not bound yet."""
        found = await self.deps.kube.get_or_none(
            PVCS, scratch_pvc_name(claim.name), _namespace(claim)
        )
        if found is None or not _ours(found, datavolume_reference(claim.dv)):
            return False
        return (found.get("status") or {}).get("phase") != "Bound"

    async def release(self, claim: Claim) -> None:
        """Delete our scratch claim of ``claim``, if there is one."""
        name, namespace = scratch_pvc_name(claim.name), _namespace(claim)
        found = await self.deps.kube.get_or_none(PVCS, name, namespace)
        if found is None or not _ours(found, datavolume_reference(claim.dv)):
            return
        if (found.get("metadata") or {}).get("deletionTimestamp"):
            return
        uid = (found.get("metadata") or {}).get("uid")
        await self.deps.kube.delete_if_present(PVCS, name, namespace, uid=uid)
