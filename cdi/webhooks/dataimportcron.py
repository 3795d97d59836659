"""DataImportCron admission rules, with CDI's messages
(``pkg/apiserver/webhooks/dataimportcron-validate.go``).

Pure, like the DataVolume rules: a function of the new and old objects. The template must
import from a registry (a PVC source is CDI's other option; this product's crons poll
registries only, so it is refused with CDI's "Missing source"), may not set the fields the cron
owns, the schedule must parse (croniter: the parser the controller uses, so what is admitted
is what runs), ``importsToKeep`` may not be negative, ``garbageCollect`` is ``Outdated`` or
``Never``, ``managedDataSource`` names something, and the spec never changes after creation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from croniter import croniter

from cdi.webhooks.verdict import Cause, Causes, ValidationResult

UNSETTABLE = ("sourceRef", "contentType", "checkpoints", "finalCheckpoint")
GARBAGE_COLLECT = ("Outdated", "Never")


def validate_dataimportcron(
    new: Mapping[str, Any], old: Mapping[str, Any] | None
) -> ValidationResult:
    spec = new.get("spec") or {}
    if old is not None and (old.get("spec") or {}) != spec:
        return ValidationResult((Cause("Cannot update DataImportCron Spec", "spec"),))
    return ValidationResult(tuple(_spec_causes(spec)))


def _spec_causes(spec: Mapping[str, Any]) -> Causes:
    template = (spec.get("template") or {}).get("spec") or {}
    source = template.get("source") or {}
    if not isinstance(source, Mapping) or not source.get("registry"):
        return [Cause("Missing source", "spec.template.spec.source")]
    if not str((source.get("registry") or {}).get("url") or "").startswith("docker://"):
        url = (source.get("registry") or {}).get("url")
        return [Cause(f"Illegal registry source URL {url}", "spec.template.spec.source.registry")]
    if any(template.get(key) for key in UNSETTABLE):
        return [
            Cause(
                "Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint",
                "spec.template.spec",
            )
        ]
    schedule = spec.get("schedule") or ""
    if schedule and not croniter.is_valid(str(schedule)):
        return [Cause("Illegal cron schedule", "spec.schedule")]
    keep = spec.get("importsToKeep")
    if keep is not None and (not isinstance(keep, int) or keep < 0):
        return [Cause("Illegal ImportsToKeep value", "spec.importsToKeep")]
    collect = spec.get("garbageCollect")
    if collect is not None and collect not in GARBAGE_COLLECT:
        return [Cause("Illegal GarbageCollect value", "spec.garbageCollect")]
    if not spec.get("managedDataSource"):
        return [Cause("Illegal ManagedDataSource value", "spec.managedDataSource")]
    return []
