"""The claim record: the durable state of the work that fills a claim, in annotations on it.

Worker pods are deleted after success and a controller may restart at any moment, so what
has happened so far must live in the cluster, not in memory. CDI keeps it on the PVC
(``storage.pod.restarts``, ``storage.pod.phase``, ``storage.import.fatalError``,
``storage.condition.running.*``) for every worker (its upload controller writes the same keys
as its import controller); so do we, with the same keys, so ``kubectl describe pvc`` reads the
same. ``ClaimRecord`` is that record whatever fills the claim (import, upload, host-assisted
clone, a populator's prime): it parses and renders those annotations; the flavours write them
with one merge patch per decision, before acting on the decision (bump the attempt count, then
create the next pod), so a crash in between is repaired by the next reconcile.

The record also names the worker pod the controller created for the current attempt by UID
(``ANN_IMPORT_POD_UID``, ours, not CDI's; the key keeps its historical name for every flavour):
a pod is the worker pod only when its UID is the one recorded from the create response, never
because of its name, labels or owner reference, which any tenant allowed to create pods can copy
(``cdi.controller.workerpod.assess``). Only ``pod_name`` (``storage.import.importPodName``) is
the import flavour's own.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from cdi.api.constants import (
    ANN_FATAL_ERROR,
    ANN_IMPORT_POD_NAME,
    ANN_POD_PHASE,
    ANN_POD_RESTARTS,
    ANN_REQUIRES_SCRATCH,
    ANN_VERIFICATION,
)
from cdi.controller.seal import Seal, object_uid

ANN_RUNNING_REASON = "cdi.kubevirt.io/storage.condition.running.reason"
ANN_RUNNING_MESSAGE = "cdi.kubevirt.io/storage.condition.running.message"
ANN_IMPORT_POD_UID = "cdi.kubevirt.io/storage.import.importPodUID"
ANN_BYTES_WRITTEN = "cdi.kubevirt.io/storage.import.bytesWritten"
# Ours: the whole record, sealed by the controller (``cdi.controller.seal``), written in the same
# patch as CDI's keys above. Where the record authorizes an act beyond the tenant's reach (a
# populator's PV handover), the controller reads this, never the keys a tenant can rewrite.
ANN_SEALED_RECORD = "cdi.kubevirt.io/storage.import.sealedRecord"
SEAL_PURPOSE = "import-record"

# record fields added after records were sealed
_LATER = frozenset({"requires_scratch", "verification"})
OUTCOME_SUCCEEDED = "Succeeded"
OUTCOME_FAILED = "Failed"


@dataclass(frozen=True)
class ClaimRecord:
    failed_attempts: int = 0  # = index of the current attempt
    outcome: str | None = None  # Succeeded | Failed once the import is over
    reason: str | None = None  # of the last finished attempt
    message: str | None = None
    pod_name: str | None = None
    pod_uid: str | None = None  # of the pod the controller created for the current attempt
    # CDI's ``storage.import.requiresScratch``: an importer pod without scratch space said the
    # source needs some; every later pod of this claim gets a scratch claim (cdi.render.scratch)
    requires_scratch: bool = False
    # A verified volume (issue 28): the worker's ``Verification.result`` once it succeeded
    # (Verified, VerificationNotSupported); the DataVolume's Verified condition says it.
    verification: str | None = None

    @property
    def done(self) -> bool:
        return self.outcome in (OUTCOME_SUCCEEDED, OUTCOME_FAILED)

    @classmethod
    def from_pvc(cls, pvc: Mapping[str, Any] | None) -> ClaimRecord:
        ann = ((pvc or {}).get("metadata") or {}).get("annotations") or {}
        try:
            restarts = max(0, int(ann.get(ANN_POD_RESTARTS) or 0))
        except ValueError:
            restarts = 0
        outcome = ann.get(ANN_POD_PHASE)
        if outcome == OUTCOME_FAILED and ann.get(ANN_FATAL_ERROR) != "true":
            outcome = None  # CDI: a failed pod is terminal only with fatalError
        return cls(
            failed_attempts=restarts,
            outcome=outcome if outcome in (OUTCOME_SUCCEEDED, OUTCOME_FAILED) else None,
            reason=ann.get(ANN_RUNNING_REASON) or None,
            message=ann.get(ANN_RUNNING_MESSAGE) or None,
            pod_name=ann.get(ANN_IMPORT_POD_NAME) or None,
            pod_uid=ann.get(ANN_IMPORT_POD_UID) or None,
            requires_scratch=ann.get(ANN_REQUIRES_SCRATCH) == "true",
            verification=ann.get(ANN_VERIFICATION) or None,
        )

    def annotations(self) -> dict[str, str | None]:
        """A merge patch of the PVC's annotations (None deletes a key)."""
        return {
            ANN_POD_RESTARTS: str(self.failed_attempts),
            ANN_POD_PHASE: self.outcome,
            ANN_FATAL_ERROR: "true" if self.outcome == OUTCOME_FAILED else None,
            ANN_RUNNING_REASON: self.reason,
            ANN_RUNNING_MESSAGE: self.message,
            ANN_IMPORT_POD_NAME: self.pod_name,
            ANN_IMPORT_POD_UID: self.pod_uid,
            ANN_REQUIRES_SCRATCH: "true" if self.requires_scratch else None,
            ANN_VERIFICATION: self.verification,
        }

    def differs_from(self, pvc: Mapping[str, Any] | None) -> bool:
        ann = ((pvc or {}).get("metadata") or {}).get("annotations") or {}
        return any(ann.get(k) != v for k, v in self.annotations().items())

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> ClaimRecord | None:
        """The record ``to_json`` wrote, or None if ``text`` is not one."""
        try:
            raw = json.loads(text)
        except ValueError:
            return None
        names = {f.name for f in fields(cls)}
        # a record sealed before a later field existed lacks only such keys
        if not isinstance(raw, dict) or not (names - _LATER) <= set(raw) <= names:
            return None
        try:
            return cls(**raw)
        except TypeError:
            return None


def sealed_annotations(seal: Seal | None, pvc: Mapping[str, Any], record: ClaimRecord) -> dict:
    """What to write beside ``record.annotations()`` so the record can be read back sealed."""
    if seal is None or not object_uid(pvc):
        return {}
    return {ANN_SEALED_RECORD: seal.seal(SEAL_PURPOSE, object_uid(pvc), record.to_json())}


@dataclass(frozen=True)
class SealedRead:
    """The record the controller sealed on a claim, and whether the claim's CDI keys were
    changed since by someone else (``altered``: they are ignored)."""

    record: ClaimRecord
    altered: bool


def read_sealed(seal: Seal, pvc: Mapping[str, Any]) -> SealedRead:
    """The controller's own record on ``pvc``: a claim it never wrote a record on has a fresh
    one; a seal that does not verify (forged, copied, altered) counts as none, and says so."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    raw = ann.get(ANN_SEALED_RECORD)
    value = seal.open(SEAL_PURPOSE, object_uid(pvc), raw)
    record = (ClaimRecord.from_json(value) if value is not None else None) or ClaimRecord()
    broken = raw is not None and value is None
    return SealedRead(record, broken or ClaimRecord.from_pvc(pvc) != record)
