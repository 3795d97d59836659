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
With ``pullMethod: node`` the poller is CDI's shape: the kubelet pulls the tag (policy
``Always``) and runs it as the pod's ``server`` container with the holder, the importer checks
it holds one disk and reports its labels, and the digest is the kubelet's ``imageID`` of that
container (never anything the pod wrote); a pull the kubelet cannot make is a poll error.
The schedule is parsed by croniter; an empty schedule polls once and then only when the
annotation asks. A ``source.pvc`` (CDI #3617) is known by ``uid:<the claim's UID>`` and imported
by a clone DataVolume; with the ``snapshot`` source format each import becomes a VolumeSnapshot
named as its claim (``desired_snapshot``) and the DataSource points at it; claims and snapshots
beyond ``importsToKeep`` go least recently used first (``beyond_keep``).

Beyond CDI, two more sources (``docs/registry.md``): ``source.http`` (the poller reads the
image's validators or its checksum file, ``IMPORTER_POLL=http``; the import is the template as
written, with the polled checksum when there is one) and ``source.stream`` (a release stream
document, ``IMPORTER_POLL=stream``; the import is a registry DataVolume pinned to the artifact's
digest reference or an HTTP one with the stream's sha256). Whatever the kind, the poll reports
an identity ``sha256:<hex>`` that names the import exactly as a registry digest does; what
else it found (a stream's release) is the annotation ``storage.import.sourceDesiredRelease``,
and a failed poll's reason is ``storage.import.pollError``, shown in ``UpToDate``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from croniter import croniter

from cdi.api.constants import (
    ANN_IMMEDIATE_BINDING,
    LABEL_COMPONENT,
    NODE_PULL_CONTAINER_NAME,
    ImporterEnv,
)
from cdi.api.onbehalf import ON_BEHALF_KEYS
from cdi.api.releasestream import KIND_REGISTRY, StreamRelease
from cdi.api.types import DataVolume
from cdi.kube.client import Resource
from cdi.render.importer_pod import (
    DATA_VOLUME,
    SCRATCH_VOLUME,
    ImporterPodConfig,
    render_importer_pod,
)

JSON = dict[str, Any]
Condition = tuple[bool, str, str]  # status, reason, message
DATAIMPORTCRONS = Resource("cdi.kubevirt.io", "v1beta1", "dataimportcrons", "DataImportCron")
_A = "cdi.kubevirt.io/"
ANN_DESIRED_DIGEST = _A + "storage.import.sourceDesiredDigest"
ANN_NEXT_CRON_TIME = _A + "storage.import.nextCronTime"
ANN_LAST_USE_TIME = _A + "storage.import.lastUseTime"
ANN_LAST_CRON_TIME = _A + "storage.import.lastCronTime"
ANN_STORAGE_CLASS = _A + "storage.import.storageClass"
ANN_SNAPSHOT_CLASS_FOR_CRON = _A + "snapshotClassForDataImportCron"  # on a StorageProfile
ANN_RWO_FOR_CRON = _A + "useReadWriteOnceForDataImportCron"  # on a StorageProfile
ANN_SOURCE_VOLUME_MODE = _A + "storage.import.sourceVolumeMode"
ANN_ADVISED_RESTORE_SIZE = _A + "storage.import.advisedRestoreSize"
ANN_POLLER_UID = _A + "storage.import.pollerPodUID"  # not CDI: the poller pod we created
ANN_DESIRED_RELEASE = _A + "storage.import.sourceDesiredRelease"  # not CDI: JSON, see above
ANN_POLL_ERROR = _A + "storage.import.pollError"  # not CDI: JSON {reason, message}
LABEL_STREAM_RELEASE = _A + "stream.release"
LABEL_STREAM_ARTIFACT = _A + "stream.artifact"
LABEL_STREAM_DIGEST = _A + "stream.digest"  # sha256-<12 hex>: a label value is 63 characters
ANN_STREAM_DIGEST = _A + "stream.releaseDigest"  # the whole sha256:<hex>
ANN_STREAM_LOCATION = _A + "stream.location"
KIND_HTTP, KIND_STREAM, KIND_PVC = "http", "stream", "pvc"
FORMAT_PVC, FORMAT_SNAPSHOT = "pvc", "snapshot"  # StorageProfile dataImportCronSourceFormat
DIGEST_PREFIXES = ("sha256:", "uid:")  # CDI's createDvName
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
    checksum_file: str = ""  # spec.httpPoll.checksumFile (http crons)

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
            checksum_file=str((spec.get("httpPoll") or {}).get("checksumFile") or ""),
        )

    @property
    def source(self) -> JSON:
        return dict((self.template.get("spec") or {}).get("source") or {})

    @property
    def kind(self) -> str:
        """registry or pvc (CDI's), http or stream (ours); the first present, as admission
        allows one."""
        for kind in (KIND_REGISTRY, KIND_PVC, KIND_HTTP, KIND_STREAM):
            if self.source.get(kind):
                return kind
        return ""

    @property
    def source_url(self) -> str:
        return str((self.source.get(self.kind) or {}).get("url") or "") if self.kind else ""

    @property
    def usable(self) -> bool:
        """A source the reconciler can follow (the webhook refuses anything else)."""
        if self.kind == KIND_PVC:
            return bool(self.source_claim[1])
        return bool(self.kind and self.source_url)

    @property
    def source_claim(self) -> tuple[str, str]:
        """A pvc source's (namespace, name); the namespace defaults to the cron's."""
        pvc = self.source.get(KIND_PVC) or {}
        return str(pvc.get("namespace") or self.namespace), str(pvc.get("name") or "")

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
    poll sets it to a retry time; a permanent failure without a schedule waits to be asked)."""
    when = parse_time(cron.annotations.get(ANN_NEXT_CRON_TIME))
    if when is None:
        return (
            not cron.annotations.get(ANN_DESIRED_DIGEST) and ANN_POLL_ERROR not in cron.annotations
        )
    return when <= now


def _json_annotation(cron: Cron, key: str) -> dict[str, str]:
    try:
        value = json.loads(cron.annotations.get(key) or "{}")
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def desired_release(cron: Cron) -> dict[str, str]:
    """What the last good poll found beside the identity (a stream's release record)."""
    return _json_annotation(cron, ANN_DESIRED_RELEASE)


def poll_error(cron: Cron) -> Condition | None:
    """The last poll's failure as an ``UpToDate`` condition (None: the last poll succeeded).
    Our sources only: a registry cron's conditions stay CDI's (``UpToDate`` speaks of the
    import, and CDI's ``CDIDataImportCronOutdated`` alert is computed from it)."""
    if ANN_POLL_ERROR not in cron.annotations or cron.kind == KIND_REGISTRY:
        return None
    error = _json_annotation(cron, ANN_POLL_ERROR)
    return (False, error.get("reason") or "PollFailed", error.get("message") or "Poll failed")


def import_name(managed: str, digest: str) -> str:
    """CDI's ``createDvName``: ``<managed>-<12 characters after the sha256: or uid: prefix>``."""
    for prefix in DIGEST_PREFIXES:
        digest = digest.removeprefix(prefix)
    return f"{managed}-{digest[:12]}"


def pvc_digest(uid: str) -> str:
    """A pvc source's identity, CDI's: ``uid:<the source claim's UID>``. A claim replaced by a
    new one (deleted and created again, e.g. by a pipeline that publishes an image) is a new
    source; metadata or status changes of the same claim are not (its resourceVersion would
    re-import on every label or status write)."""
    return f"uid:{uid}"


def pinned_url(url: str, digest: str) -> str:
    """``docker://host/repo:tag`` -> ``docker://host/repo@sha256:...`` (tag dropped)."""
    base = url.split("@", 1)[0]
    head, _, last = base.rpartition("/")
    name = last.split(":", 1)[0]
    return f"{head}/{name}@{digest}"


def imported_source(cron: Cron, digest: str, release: Mapping[str, str]) -> JSON:
    """The import's ``spec.source``: a registry tag pinned to the digest; an HTTP image as
    written, checked against the polled checksum; a stream's artifact by its digest reference
    or its URL and sha256 (``StreamRelease.from_record`` checks the record again)."""
    source = cron.source
    if cron.kind == KIND_PVC:
        namespace, name = cron.source_claim
        return {"pvc": {"namespace": namespace, "name": name}}
    if cron.kind == KIND_REGISTRY:
        return {"registry": {**source["registry"], "url": pinned_url(cron.source_url, digest)}}
    if cron.kind == KIND_HTTP:
        http = dict(source["http"])
        if release.get("checksum"):
            http["checksum"] = release["checksum"]
        return {"http": http}
    stream = source[KIND_STREAM]
    found = StreamRelease.from_record(release)
    common = {k: stream[k] for k in ("secretRef", "certConfigMap") if stream.get(k)}
    if found.kind == KIND_REGISTRY:
        pull = {"pullMethod": stream["pullMethod"]} if stream.get("pullMethod") else {}
        return {"registry": {**common, **pull, "url": found.location}}
    return {"http": {**common, "url": found.location, "checksum": found.digest}}


def release_labels(release: Mapping[str, str]) -> dict[str, str]:
    """A stream release as labels (a label value: at most 63 of [A-Za-z0-9._-])."""
    if not release.get("release"):
        return {}
    found = StreamRelease.from_record(release)
    return {
        LABEL_STREAM_RELEASE: _label_value(found.release),
        LABEL_STREAM_ARTIFACT: _label_value(found.artifact.replace("/", "_")),
        LABEL_STREAM_DIGEST: "sha256-" + found.digest.removeprefix("sha256:")[:12],
    }


def release_annotations(release: Mapping[str, str]) -> dict[str, str]:
    if not release.get("release"):
        return {}
    return {ANN_STREAM_DIGEST: release["digest"], ANN_STREAM_LOCATION: release["location"]}


def _label_value(text: str) -> str:
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "_" for c in text)
    return cleaned[:63].strip("._-")


def desired_import(
    cron: Cron,
    digest: str,
    release: Mapping[str, str] | None = None,
    now: str = "",
    read_write_once: bool = False,
) -> JSON:
    """The DataVolume importing ``digest``: the template, pinned, named and labelled, bound at
    once and stamped with its last use (CDI's ``newSourceDataVolume``). ``read_write_once``:
    the class's profile says ``useReadWriteOnceForDataImportCron``, so a ``storage`` template
    without access modes gets ReadWriteOnce (a golden image is read by clones, never shared)."""
    template = cron.template
    release = release or {}
    spec = dict(template.get("spec") or {})
    spec["source"] = imported_source(cron, digest, release)
    storage = spec.get("storage")
    if read_write_once and isinstance(storage, Mapping) and not storage.get("accessModes"):
        spec["storage"] = {**storage, "accessModes": ["ReadWriteOnce"]}
    meta_in = template.get("metadata") or {}
    labels = {**(meta_in.get("labels") or {}), **release_labels(release), LABEL_CRON: cron.name}
    if cron.retention == RETAIN_NONE:
        labels[LABEL_CLEANUP] = "true"
    # the on-behalf record is the controller's to write, after its own check (onbehalf)
    given = meta_in.get("annotations") or {}
    written = {k: v for k, v in given.items() if k not in ON_BEHALF_KEYS}
    meta: JSON = {
        "name": import_name(cron.managed, digest),
        "namespace": cron.namespace,
        "labels": labels,
        "annotations": {
            **written,
            **release_annotations(release),
            ANN_DESIRED_DIGEST: digest,
            ANN_IMMEDIATE_BINDING: "true",
            **({ANN_LAST_USE_TIME: now} if now else {}),
        },
    }
    if cron.retention == RETAIN_NONE:
        meta["ownerReferences"] = [cron.reference()]
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": meta,
        "spec": spec,
    }


def _poll_env(cron: Cron) -> list[JSON]:
    """What the importer polls, by kind (``importer.poll``; a registry: the digest)."""
    if cron.kind == KIND_REGISTRY:
        return [{"name": POLL_ENV, "value": "true"}]
    if cron.kind == KIND_HTTP:
        env = [{"name": ImporterEnv.POLL.value, "value": KIND_HTTP}]
        if cron.checksum_file:
            env.append({"name": ImporterEnv.POLL_CHECKSUM_FILE.value, "value": cron.checksum_file})
        return env
    stream = cron.source[KIND_STREAM]
    return [
        {"name": ImporterEnv.POLL.value, "value": KIND_STREAM},
        {
            "name": ImporterEnv.POLL_STREAM_ARCHITECTURE.value,
            "value": str(stream.get("architecture") or ""),
        },
        {
            "name": ImporterEnv.POLL_STREAM_ARTIFACT.value,
            "value": str(stream.get("artifact") or ""),
        },
    ]


def _poll_template(cron: Cron) -> JSON:
    """The DataVolume the poller pod is rendered from: a stream's document is read like an
    HTTP image (its URL, the CA), without the template's checksum (a poll checks none)."""
    spec = dict(cron.template.get("spec") or {})
    if cron.kind == KIND_STREAM:
        stream = cron.source[KIND_STREAM]
        http = {"url": stream["url"]}
        if stream.get("certConfigMap"):
            http["certConfigMap"] = stream["certConfigMap"]
        spec["source"] = {"http": http}
    elif cron.kind == KIND_HTTP:
        spec["source"] = {"http": {k: v for k, v in cron.source["http"].items() if k != "checksum"}}
    return {**cron.template, "spec": spec}


def poller_pod(cron: Cron, config: ImporterPodConfig) -> JSON:
    """The importer pod for the cron's source in poll mode: no volume, only the digest."""
    dv = DataVolume.from_dict(
        {**_poll_template(cron), "metadata": {"name": cron.managed, "namespace": cron.namespace}}
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
        if container["name"] == NODE_PULL_CONTAINER_NAME:
            # registry pullMethod node (CDI's poller pod): the kubelet resolves the tag afresh
            # on every poll and reports the digest as the container's imageID; the tenant's
            # image gets nothing of ours but the holder (deploy/15-admission-policy.yaml)
            container["imagePullPolicy"] = "Always"
            continue
        container["env"] = [*container.get("env", []), *_poll_env(cron)]
    return pod


def desired_data_source(
    cron: Cron,
    pvc: str,
    labels: Mapping[str, str],
    annotations: Mapping[str, str] | None = None,
    source_format: str = FORMAT_PVC,
) -> JSON:
    """The managed DataSource: at the claim, or at the snapshot of the same name when the
    StorageProfile's ``dataImportCronSourceFormat`` is ``snapshot`` (CDI's
    ``populateDataSource``)."""
    meta: JSON = {
        "name": cron.managed,
        "namespace": cron.namespace,
        "labels": {**labels, LABEL_CRON: cron.name},
    }
    if annotations:
        meta["annotations"] = dict(annotations)
    if cron.retention == RETAIN_NONE:
        meta["ownerReferences"] = [cron.reference()]
    kind = "snapshot" if source_format == FORMAT_SNAPSHOT else "pvc"
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataSource",
        "metadata": meta,
        "spec": {"source": {kind: {"name": pvc, "namespace": cron.namespace}}},
    }


def source_format(profile: Mapping[str, Any] | None) -> str:
    """CDI's ``getSourceFormat``: the profile's ``status.dataImportCronSourceFormat``, pvc
    without a profile or a value."""
    found = str(((profile or {}).get("status") or {}).get("dataImportCronSourceFormat") or "")
    return FORMAT_SNAPSHOT if found == FORMAT_SNAPSHOT else FORMAT_PVC


def template_claim(cron: Cron) -> Mapping[str, Any]:
    spec = cron.template.get("spec") or {}
    return spec.get("storage") or spec.get("pvc") or {}


def desired_snapshot(
    cron: Cron,
    claim: Mapping[str, Any],
    snapshot_class: str,
    labels: Mapping[str, str],
    now: str,
) -> JSON:
    """CDI's ``handleSnapshot``: a VolumeSnapshot of the imported claim, named as the claim, in
    the cron's namespace, labelled as CDI labels it, stamped with its last use, the advised
    restore size (the template's size, else the claim's) and the claim's volume mode."""
    meta_in = claim.get("metadata") or {}
    spec_in = claim.get("spec") or {}
    name = str(meta_in.get("name"))
    size = ((template_claim(cron).get("resources") or {}).get("requests") or {}).get("storage")
    size = size or ((spec_in.get("resources") or {}).get("requests") or {}).get("storage")
    annotations = {ANN_LAST_USE_TIME: now}
    if size:
        annotations[ANN_ADVISED_RESTORE_SIZE] = str(size)
    if spec_in.get("volumeMode"):
        annotations[ANN_SOURCE_VOLUME_MODE] = str(spec_in["volumeMode"])
    all_labels = {
        **labels,
        "app": "containerized-data-importer",
        "cdi.kubevirt.io": "",
        LABEL_CRON: cron.name,
    }
    if cron.retention == RETAIN_NONE:
        all_labels[LABEL_CLEANUP] = "true"
    meta: JSON = {
        "name": name,
        "namespace": cron.namespace,
        "labels": all_labels,
        "annotations": annotations,
    }
    if cron.retention == RETAIN_NONE:
        meta["ownerReferences"] = [cron.reference()]
    spec: JSON = {"source": {"persistentVolumeClaimName": name}}
    if snapshot_class:
        spec["volumeSnapshotClassName"] = snapshot_class
    return {
        "apiVersion": "snapshot.storage.k8s.io/v1",
        "kind": "VolumeSnapshot",
        "metadata": meta,
        "spec": spec,
    }


def condition(
    previous: Sequence[Mapping[str, Any]],
    kind: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
) -> JSON:
    """A condition whose lastTransitionTime moves only when its status changes, and its
    lastHeartbeatTime when anything in it does (CDI's ``updateConditionState``)."""
    text = "True" if status else "False"
    old = next((c for c in previous if c.get("type") == kind), None) or {}
    since = old.get("lastTransitionTime") if old.get("status") == text else now
    same = (old.get("status"), old.get("reason"), old.get("message")) == (text, reason, message)
    return {
        "type": kind,
        "status": text,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since or now,
        "lastHeartbeatTime": (old.get("lastHeartbeatTime") if same else None) or now,
    }


def last_use(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("metadata") or {}).get("annotations") or {}).get(ANN_LAST_USE_TIME) or "")


def beyond_keep(sources: Sequence[Mapping[str, Any]], current: str, keep: int) -> list[str]:
    """CDI's ``garbageCollectPVCs`` / ``garbageCollectSnapshots``: of the cron's claims (or
    snapshots), the ones beyond ``keep`` when sorted by ``lastUseTime``, most recent first.
    Unlike CDI, ``current`` (what the DataSource serves) always stays: with
    ``importsToKeep: 0`` CDI's code deletes it too, and its next reconcile imports the same
    digest again."""
    names = [str(o["metadata"]["name"]) for o in sources]
    if len(names) <= keep:
        return []
    ordered = sorted(sources, key=last_use, reverse=True)
    rest = [str(o["metadata"]["name"]) for o in ordered if o["metadata"]["name"] != current]
    kept = max(keep - (1 if current in names else 0), 0)
    return sorted(rest[kept:])


def unfinished(imports: Sequence[Mapping[str, Any]], current: str) -> list[str]:
    """The cron's other import DataVolumes that never succeeded (a digest superseded while it
    was importing, a failed import): deleted once ``current`` succeeded (CDI deletes a failed
    one when the digest moves on, ``deleteErroneousDataVolume``)."""
    return sorted(
        str(dv["metadata"]["name"])
        for dv in imports
        if dv["metadata"]["name"] != current
        and (dv.get("status") or {}).get("phase") != "Succeeded"
    )


NO_IMPORT: Condition = (False, "NoImport", "No current import")
UP_TO_DATE: Condition = (True, "UpToDate", "Latest import is up to date")
OUTDATED: Condition = (False, "Outdated", "Source digest updated since last import")
IMPORTING: Condition = (False, "ImportProgressing", "Import is progressing")
SNAPSHOTTING: Condition = (False, "ImportProgressing", "Snapshot of imported data is progressing")
NOT_AUTHORIZED: Condition = (False, "NotAuthorized", "Not authorized to create DataVolume")


def import_progressing(phase: str) -> Condition:
    """``Progressing`` from the import DataVolume's phase, as CDI words it."""
    if phase == "ImportScheduled":
        return (False, "ImportScheduled", "Import is scheduled")
    if phase == "ImportInProgress":
        return (True, "ImportProgressing", "Import is progressing")
    shown = phase or "Pending"
    return (False, shown, f"Import DataVolume phase {shown}")


def import_up_to_date(digest: str, imports: Sequence[Mapping[str, Any]]) -> Condition:
    """``UpToDate`` while an import runs: ``Outdated`` when the desired digest is not the one
    ``currentImports`` shows yet (CDI's ``digestUpdated``), else ``ImportProgressing``."""
    current = str((imports[0] if imports else {}).get("Digest") or "")
    return OUTDATED if digest != current else IMPORTING


def cron_conditions(
    previous: Sequence[Mapping[str, Any]], now: str, progressing: Condition, up_to_date: Condition
) -> list[JSON]:
    return [
        condition(previous, "Progressing", *progressing, now),
        condition(previous, "UpToDate", *up_to_date, now),
    ]
