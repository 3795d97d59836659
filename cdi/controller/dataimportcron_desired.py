"""DataImportCron, the pure part: what the cron's children and status should be, from the cron,
the clock and what was read. The reconciler (``dataimportcron``) only reads and applies.

CDI's shapes, names and reasons (``pkg/controller/dataimportcron-controller.go``): imports are
DataVolumes named ``<managedDataSource>-<first 12 hex of the digest>`` whose registry URL is
pinned to ``@sha256:`` (the tag dropped), labelled ``cdi.kubevirt.io/dataImportCron: <cron>``;
the desired digest and the next poll time are the cron's annotations
``storage.import.sourceDesiredDigest`` and ``storage.import.nextCronTime`` (set it to a past
time to force a poll); conditions ``Progressing`` and ``UpToDate``. Polls run in a poller pod
(the importer with ``IMPORTER_REGISTRY_POLL=true``: registry credentials, trust and the import
network policy stay in the data plane) that reports the digest in its termination message.
The schedule is parsed by croniter; an empty schedule polls once and then only when the
annotation asks.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from croniter import croniter

from cdi.api.constants import LABEL_COMPONENT
from cdi.api.types import DataVolume
from cdi.kube.client import Resource
from cdi.render.importer_pod import (
    DATA_VOLUME,
    SCRATCH_VOLUME,
    ImporterPodConfig,
    render_importer_pod,
)

JSON = dict[str, Any]
DATAIMPORTCRONS = Resource("cdi.kubevirt.io", "v1beta1", "dataimportcrons", "DataImportCron")
_A = "cdi.kubevirt.io/"
ANN_DESIRED_DIGEST = _A + "storage.import.sourceDesiredDigest"
ANN_NEXT_CRON_TIME = _A + "storage.import.nextCronTime"
ANN_LAST_USE_TIME = _A + "storage.import.lastUseTime"
ANN_POLLER_UID = _A + "storage.import.pollerPodUID"  # not CDI: the poller pod we created
LABEL_CRON = _A + "dataImportCron"
LABEL_CLEANUP = _A + "dataImportCron.cleanup"
POLL_ENV = "IMPORTER_REGISTRY_POLL"
RETAIN_NONE = "None"
GC_NEVER = "Never"
DEFAULT_IMPORTS_TO_KEEP = 3


@dataclass(frozen=True)
class Cron:
    name: str
    namespace: str
    uid: str
    template: JSON
    schedule: str
    managed: str
    keep: int
    garbage_collect: str
    retention: str
    annotations: Mapping[str, str]

    @classmethod
    def from_obj(cls, obj: Mapping[str, Any]) -> Cron:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        keep = spec.get("importsToKeep")
        return cls(
            name=str(meta.get("name")),
            namespace=str(meta.get("namespace")),
            uid=str(meta.get("uid") or ""),
            template=dict(spec.get("template") or {}),
            schedule=str(spec.get("schedule") or ""),
            managed=str(spec.get("managedDataSource") or ""),
            keep=DEFAULT_IMPORTS_TO_KEEP if keep is None else int(keep),
            garbage_collect=str(spec.get("garbageCollect") or "Outdated"),
            retention=str(spec.get("retentionPolicy") or "RetainAll"),
            annotations=dict(meta.get("annotations") or {}),
        )

    @property
    def source_url(self) -> str:
        registry = ((self.template.get("spec") or {}).get("source") or {}).get("registry") or {}
        return str(registry.get("url") or "")

    @property
    def poller_name(self) -> str:
        return f"poller-{self.name}-{self.uid[:8]}"[:63].rstrip("-")

    def reference(self) -> JSON:
        """Owner reference for what ``retentionPolicy: None`` deletes with the cron."""
        return {
            "apiVersion": DATAIMPORTCRONS.api_version,
            "kind": DATAIMPORTCRONS.kind,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": False,
        }


def rfc3339(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def valid_schedule(schedule: str) -> bool:
    return not schedule or croniter.is_valid(schedule)


def next_poll(schedule: str, now: dt.datetime) -> dt.datetime | None:
    """The next scheduled poll after ``now``; None without a schedule (external polling)."""
    if not schedule:
        return None
    return croniter(schedule, now).get_next(dt.datetime)


def poll_due(cron: Cron, now: dt.datetime) -> bool:
    """At creation (no digest, no poll time yet), and when ``nextCronTime`` has come (a failed
    poll sets it to a retry time)."""
    when = parse_time(cron.annotations.get(ANN_NEXT_CRON_TIME))
    if when is None:
        return not cron.annotations.get(ANN_DESIRED_DIGEST)
    return when <= now


def import_name(managed: str, digest: str) -> str:
    return f"{managed}-{digest.removeprefix('sha256:')[:12]}"


def pinned_url(url: str, digest: str) -> str:
    """``docker://host/repo:tag`` -> ``docker://host/repo@sha256:...`` (tag dropped)."""
    base = url.split("@", 1)[0]
    head, _, last = base.rpartition("/")
    name = last.split(":", 1)[0]
    return f"{head}/{name}@{digest}"


def desired_import(cron: Cron, digest: str) -> JSON:
    """The DataVolume importing ``digest``: the template, pinned, named and labelled."""
    template = cron.template
    spec = dict(template.get("spec") or {})
    source = dict(spec.get("source") or {})
    source["registry"] = {
        **(source.get("registry") or {}),
        "url": pinned_url(cron.source_url, digest),
    }
    spec["source"] = source
    meta_in = template.get("metadata") or {}
    labels = {**(meta_in.get("labels") or {}), LABEL_CRON: cron.name}
    if cron.retention == RETAIN_NONE:
        labels[LABEL_CLEANUP] = "true"
    meta: JSON = {
        "name": import_name(cron.managed, digest),
        "namespace": cron.namespace,
        "labels": labels,
        "annotations": {**(meta_in.get("annotations") or {}), ANN_DESIRED_DIGEST: digest},
    }
    if cron.retention == RETAIN_NONE:
        meta["ownerReferences"] = [cron.reference()]
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": meta,
        "spec": spec,
    }


def poller_pod(cron: Cron, config: ImporterPodConfig) -> JSON:
    """The importer pod for the cron's source in poll mode: no volume, only the digest."""
    dv = DataVolume.from_dict(
        {**cron.template, "metadata": {"name": cron.managed, "namespace": cron.namespace}}
    )
    # The claim is never mounted (its volumes are dropped below); the renderer needs a size.
    spec = {"resources": {"requests": {"storage": "1Mi"}}}
    claim = {"metadata": {"name": cron.managed, "namespace": cron.namespace}, "spec": spec}
    pod = render_importer_pod(dv, claim, config)
    meta = pod["metadata"]
    meta["name"] = cron.poller_name
    meta["labels"] = {**meta["labels"], LABEL_CRON: cron.name, LABEL_COMPONENT: "importer"}
    meta["ownerReferences"] = [cron.reference()]
    spec = pod["spec"]
    dropped = {DATA_VOLUME, SCRATCH_VOLUME}
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in dropped]
    for container in spec["containers"]:
        mounts = container.get("volumeMounts") or []
        container["volumeMounts"] = [m for m in mounts if m["name"] not in dropped]
        container.pop("volumeDevices", None)
        container["env"] = [*container.get("env", []), {"name": POLL_ENV, "value": "true"}]
    return pod


def desired_data_source(cron: Cron, pvc: str, labels: Mapping[str, str]) -> JSON:
    meta: JSON = {
        "name": cron.managed,
        "namespace": cron.namespace,
        "labels": {**labels, LABEL_CRON: cron.name},
    }
    if cron.retention == RETAIN_NONE:
        meta["ownerReferences"] = [cron.reference()]
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataSource",
        "metadata": meta,
        "spec": {"source": {"pvc": {"name": pvc, "namespace": cron.namespace}}},
    }


def condition(
    previous: Sequence[Mapping[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
) -> JSON:
    """A condition whose lastTransitionTime moves only when its status changes."""
    text = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == kind), None)
    since = old.get("lastTransitionTime") if old and old.get("status") == text else now
    return {
        "type": kind,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
        "lastHeartbeatTime": (old or {}).get("lastHeartbeatTime") or now,
    }


def to_collect(imports: Sequence[Mapping[str, Any]], current: str, keep: int) -> list[str]:
    """Imports to delete once ``current`` succeeded: the failed and unfinished ones, and the
    succeeded ones beyond ``keep`` (``current`` counts), oldest first."""
    others = [dv for dv in imports if dv["metadata"]["name"] != current]
    done = [dv for dv in others if (dv.get("status") or {}).get("phase") == "Succeeded"]
    done.sort(key=lambda dv: str(dv["metadata"].get("creationTimestamp") or ""), reverse=True)
    survivors = {dv["metadata"]["name"] for dv in done[: max(keep - 1, 0)]}
    return sorted(
        dv["metadata"]["name"] for dv in others if dv["metadata"]["name"] not in survivors
    )


Condition = tuple[bool, str, str]  # status, reason, message
NO_IMPORT: Condition = (False, "NoImport", "No current import")


def cron_conditions(
    previous: Sequence[Mapping[str, Any]], now: str, progressing: Condition, up_to_date: Condition
) -> list[JSON]:
    return [
        condition(previous, "Progressing", *progressing, now),
        condition(previous, "UpToDate", *up_to_date, now),
    ]
