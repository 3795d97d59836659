"""DataImportCron admission rules, with CDI's messages
(``pkg/apiserver/webhooks/dataimportcron-validate.go``).

Pure, like the DataVolume rules: a function of the new and old objects. The template must
import from a registry or clone a PVC (CDI's two sources; a PVC in any namespace, authorized by
the controller, see ``_pvc_causes``), may not set the fields the cron
owns, the schedule must parse (croniter: the parser the controller uses, so what is admitted
is what runs), ``importsToKeep`` may not be negative, ``garbageCollect`` is ``Outdated`` or
``Never``, ``managedDataSource`` names something, and the spec never changes after creation.

Beyond CDI (``docs/registry.md``): the template may import from ``source.http`` (checked with
the DataVolume's own http rules and messages, ``cdi.webhooks.sources``; its ``checksum`` is the
cron's to set, from ``spec.httpPoll.checksumFile``, which must stay on the image's origin) or
follow a release stream, ``source.stream`` (an http(s) URL, an architecture, an artifact
``kubevirt`` or ``<platform>/<format>``: ``cdi.api.releasestream``'s rules, the poller's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from croniter import croniter

from cdi.api.codec import SchemaError
from cdi.api.httpchange import checksum_url
from cdi.api.releasestream import Artifact, valid_architecture
from cdi.api.types import DataVolumeSpec
from cdi.webhooks.sources import (
    extra_source_causes,
    import_source_causes,
    name_causes,
    source_url_causes,
)
from cdi.webhooks.verdict import Cause, Causes, ValidationResult

UNSETTABLE = ("sourceRef", "contentType", "checkpoints", "finalCheckpoint")
GARBAGE_COLLECT = ("Outdated", "Never")
KINDS = ("registry", "pvc", "http", "stream")


def validate_dataimportcron(
    new: Mapping[str, Any], old: Mapping[str, Any] | None, namespace: str = ""
) -> ValidationResult:
    """``namespace``: the admission request's (the API server's word), else the object's."""
    spec = new.get("spec") or {}
    if old is not None and (old.get("spec") or {}) != spec:
        return ValidationResult((Cause("Cannot update DataImportCron Spec", "spec"),))
    namespace = namespace or str((new.get("metadata") or {}).get("namespace") or "")
    return ValidationResult(tuple(_spec_causes(spec, namespace)))


def _spec_causes(spec: Mapping[str, Any], namespace: str) -> Causes:
    template = (spec.get("template") or {}).get("spec") or {}
    source = template.get("source") or {}
    kinds = [k for k in KINDS if isinstance(source, Mapping) and source.get(k)]
    if not kinds:
        return [Cause("Missing source", "spec.template.spec.source")]
    if len(kinds) > 1 or len([k for k, v in source.items() if v is not None]) > 1:
        return [
            Cause(
                "DataImportCron source must be exactly one of registry, pvc, http, stream",
                "spec.template.spec.source",
            )
        ]
    kind_causes = {
        "registry": _registry_causes,
        "http": _http_causes,
        "stream": _stream_causes,
    }
    causes = _pvc_causes(template) if kinds[0] == "pvc" else kind_causes[kinds[0]](spec, template)
    if causes:
        return causes
    if spec.get("httpPoll") is not None and kinds[0] != "http":
        return [Cause("httpPoll applies to http sources only", "spec.httpPoll")]
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


def _registry_causes(spec: Mapping[str, Any], template: Mapping[str, Any]) -> Causes:
    url = (template["source"].get("registry") or {}).get("url")
    if not str(url or "").startswith("docker://"):
        return [Cause(f"Illegal registry source URL {url}", "spec.template.spec.source.registry")]
    return []


def _pvc_causes(template: Mapping[str, Any]) -> Causes:
    """A claim to clone (CDI #3617), named as a DataVolume's pvc source is, in any namespace.
    Another namespace is authorized by the controller, not here, as CDI does (#3970/#3971):
    the clone is made on each change, long after admission, for the cron namespace's
    ``default`` ServiceAccount (``cdi.api.onbehalf``)."""
    pvc = template["source"]["pvc"]
    field = "spec.template.spec.source.pvc"
    if not isinstance(pvc, Mapping):
        return [Cause("pvc must be an object", field)]
    if not pvc.get("name"):
        return [Cause("Missing source PVC name", f"{field}.name")]
    causes = name_causes(pvc.get("name"), f"{field}.name")
    source_ns = pvc.get("namespace")
    if source_ns is not None and not isinstance(source_ns, str):
        return [Cause("pvc namespace must be a string", f"{field}.namespace")]
    if source_ns:
        causes += name_causes(source_ns, f"{field}.namespace")
    return causes


def _http_causes(spec: Mapping[str, Any], template: Mapping[str, Any]) -> Causes:
    """The DataVolume's http rules (CDI's messages), then the cron's own."""
    try:
        dv_spec = DataVolumeSpec.from_dict({"source": {"http": template["source"]["http"]}})
    except SchemaError as exc:
        return [Cause(str(exc), "spec.template.spec.source.http")]
    causes = import_source_causes(dv_spec) + extra_source_causes(dv_spec)
    if causes:
        return causes
    http = template["source"]["http"]
    if http.get("checksum"):
        return [
            Cause(
                "A DataImportCron sets the http checksum itself (spec.httpPoll.checksumFile)",
                "spec.template.spec.source.http.checksum",
            )
        ]
    checksum_file = (spec.get("httpPoll") or {}).get("checksumFile")
    if checksum_file is not None:
        try:
            checksum_url(str(http.get("url") or ""), str(checksum_file))
        except ValueError as exc:
            return [Cause(f"Illegal checksumFile: {exc}", "spec.httpPoll.checksumFile")]
    return []


def _stream_causes(spec: Mapping[str, Any], template: Mapping[str, Any]) -> Causes:
    stream = template["source"]["stream"]
    field = "spec.template.spec.source.stream"
    if not isinstance(stream, Mapping):
        return [Cause("stream must be an object", field)]
    causes = source_url_causes(str(stream.get("url") or ""), "stream")
    if causes:
        return causes
    architecture = str(stream.get("architecture") or "")
    if not valid_architecture(architecture):
        return [Cause(f"Illegal stream architecture {architecture!r}", f"{field}.architecture")]
    try:
        Artifact.parse(str(stream.get("artifact") or ""))
    except ValueError as exc:
        return [Cause(f"Illegal stream artifact: {exc}", f"{field}.artifact")]
    method = stream.get("pullMethod")
    if method not in (None, "", "pod", "node"):
        return [Cause(f'ImportMethod {method} is neither pod, node or ""', f"{field}.pullMethod")]
    if method == "node" and stream.get("artifact") != "kubevirt":
        return [Cause("pullMethod applies to the kubevirt artifact only", f"{field}.pullMethod")]
    for key in ("secretRef", "certConfigMap"):
        causes += name_causes(stream.get(key), f"{field}.{key}")
    return causes
