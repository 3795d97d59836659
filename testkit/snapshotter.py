"""The CSI snapshotter of the local provisioner's ``loop.testkit.local`` volumes.

The test cluster runs the upstream snapshot-controller (kubernetes-csi/external-snapshotter,
built by hack/kube/build.sh): it binds VolumeSnapshots to VolumeSnapshotContents, adds the
finalizers and reports errors. What a storage vendor ships next to it, the csi-snapshotter
sidecar that turns a content into a snapshot on the storage, is this module. It follows the
sidecar's rules (pkg/sidecar-controller/snapshot_controller.go), for contents whose
``spec.driver`` is ours:

* ``spec.source.volumeHandle`` and not yet ready: annotate the content
  ``volumesnapshot-being-created``, copy the volume's backing image at one point in time
  (filesystem frozen, block device flushed; a sparse copy, as for clones) to
  ``<state>/snapshots/<handle>.img``, then write ``snapshotHandle``, ``readyToUse``,
  ``creationTime`` (ns) and ``restoreSize`` (bytes) through the status subresource and drop the
  annotation. A failure is written to ``status.error`` and retried, as the sidecar does.
* ``spec.source.snapshotHandle`` (pre-provisioned): ready if that snapshot exists here.
* Deletion, once the snapshot-controller has marked the content ``volumesnapshot-being-deleted``
  and deleted it: with ``deletionPolicy: Delete`` remove the copy and clear the status
  handle, then remove the ``volumesnapshotcontent-bound-protection`` finalizer (which the
  snapshot-controller added; the sidecar only removes it).

:meth:`Snapshotter.restore` plays the external-provisioner's part for a claim whose data source
is a VolumeSnapshot: the same checks (bound content of our driver, ready, size, volume mode)
and a sparse copy of the snapshot, under the provisioner's source-protection finalizer.

Snapshot and volume handles are file names here, and a pre-provisioned content's handle is
whatever its author wrote, so a handle that is not a plain name is refused.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kubernetes.utils import parse_quantity

from testkit import storage
from testkit.kubeclient import JSON, ApiError, Kube

log = logging.getLogger("testkit.snapshotter")

GROUP = "snapshot.storage.k8s.io"
API = f"/apis/{GROUP}/v1"
CONTENTS = f"{API}/volumesnapshotcontents"
CLASSES = f"{API}/volumesnapshotclasses"
SNAPSHOT_CLASS = "testkit-csi-snapclass"
ANN_DEFAULT_CLASS = "snapshot.storage.kubernetes.io/is-default-class"
ANN_BEING_CREATED = "snapshot.storage.kubernetes.io/volumesnapshot-being-created"
ANN_BEING_DELETED = "snapshot.storage.kubernetes.io/volumesnapshot-being-deleted"
ANN_ALLOW_MODE_CHANGE = "snapshot.storage.kubernetes.io/allow-volume-mode-change"
CONTENT_FINALIZER = "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection"
# The external-provisioner's, held on a VolumeSnapshot while a volume is restored from it.
SOURCE_FINALIZER = "provisioner.storage.kubernetes.io/volumesnapshot-as-source-protection"
HANDLE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


def snapshot_class(driver: str) -> JSON:
    """The cluster's default VolumeSnapshotClass for ``driver``."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "VolumeSnapshotClass",
        "metadata": {"name": SNAPSHOT_CLASS, "annotations": {ANN_DEFAULT_CLASS: "true"}},
        "driver": driver,
        "deletionPolicy": "Delete",
    }


def snapshot_path(ns: str, name: str = "") -> str:
    path = f"{API}/namespaces/{ns}/volumesnapshots"
    return f"{path}/{name}" if name else path


def should_delete(content: JSON) -> bool:
    """The sidecar's ``shouldDelete``: the content is being deleted and either is an unbound
    pre-provisioned one or the snapshot-controller marked it, and no creation is in flight."""
    meta, spec = content["metadata"], content["spec"]
    if not meta.get("deletionTimestamp"):
        return False
    ann = meta.get("annotations") or {}
    if spec["source"].get("snapshotHandle") and not (spec.get("volumeSnapshotRef") or {}).get(
        "uid"
    ):
        return True
    if ANN_BEING_CREATED in ann:
        return False
    return ANN_BEING_DELETED in ann


def is_ready(content: JSON) -> bool:
    return bool((content.get("status") or {}).get("readyToUse"))


def valid_handle(handle: str) -> bool:
    return bool(HANDLE.match(handle))


class Snapshotter:
    """Snapshots of ``<volumes>/<volumeHandle>.img`` kept as ``<snapshots>/<handle>.img``."""

    def __init__(self, kube: Kube, volumes: Path, snapshots: Path, driver: str) -> None:
        self.kube = kube
        self.volumes = volumes
        self.snapshots = snapshots
        self.driver = driver
        snapshots.mkdir(parents=True, exist_ok=True)
        # content name -> (monotonic time of the next try, delay): failures back off from 1 s
        # to 10 s, as the sidecar's rate-limited queue does, instead of every poll.
        self._backoff: dict[str, tuple[float, float]] = {}

    def image(self, handle: str) -> Path:
        if not valid_handle(handle):
            raise storage.StorageError(f"invalid snapshot handle {handle!r}")
        return self.snapshots / f"{handle}.img"

    def ensure_class(self) -> None:
        try:
            self.kube.create(CLASSES, snapshot_class(self.driver))
        except ApiError as e:
            if not e.conflict:
                raise

    # -- the sidecar loop -------------------------------------------------------------------
    def sync_once(self) -> None:
        now = time.monotonic()
        contents = self.kube.get(CONTENTS)["items"]
        listed = {c["metadata"]["name"] for c in contents}
        self._backoff = {k: v for k, v in self._backoff.items() if k in listed}
        for content in contents:
            name = content["metadata"]["name"]
            if content["spec"].get("driver") != self.driver:
                continue
            if self._backoff.get(name, (0.0, 0.0))[0] > now:
                continue
            try:
                self.sync_content(content)
                self._backoff.pop(name, None)
            except (ApiError, storage.StorageError) as e:
                delay = min(10.0, 2 * self._backoff.get(name, (0.0, 0.5))[1])
                self._backoff[name] = (now + delay, delay)
                log.warning("content %s: %s (retry in %.0f s)", name, e, delay)

    def sync_content(self, content: JSON) -> None:
        source = content["spec"]["source"]
        if should_delete(content):
            status = content.get("status") or {}
            if content["spec"].get("deletionPolicy") == "Delete" and status.get("snapshotHandle"):
                self._delete_snapshot(content)
            else:
                self._remove_finalizer(content)
        elif is_ready(content):
            self._drop_being_created(content)
        elif source.get("volumeHandle"):
            self._create(content)
        elif source.get("snapshotHandle"):
            self._check_existing(content)

    def _create(self, content: JSON) -> None:
        name = content["metadata"]["name"]
        content = self._mark_being_created(content)
        handle = f"snapshot-{content['metadata']['uid']}"
        image = self.image(handle)
        try:
            if not image.exists():
                self._cut(content["spec"]["source"]["volumeHandle"], image)
        except storage.StorageError as e:
            content = self._drop_being_created(content)  # a final answer: nothing in flight
            self._set_error(content, f"Failed to create snapshot: {e}")
            raise
        self._drop_being_created(self._set_ready(content, handle, image))
        log.info("content %s: snapshot %s ready", name, handle)

    def _cut(self, volume_handle: str, image: Path) -> None:
        """Copy volume ``volume_handle`` at this instant; the image's mtime records when."""
        if not valid_handle(volume_handle):
            raise storage.StorageError(f"invalid volume handle {volume_handle!r}")
        src = self.volumes / f"{volume_handle}.img"
        if not src.exists():
            raise storage.StorageError(f"volume {volume_handle} not found")
        mount = self.volumes / volume_handle
        began = time.time_ns()
        storage.copy_consistent(src, image, mount if storage.is_mountpoint(mount) else None)
        storage.set_mtime_ns(image, began)

    def _check_existing(self, content: JSON) -> None:
        handle = content["spec"]["source"]["snapshotHandle"]
        if not valid_handle(handle):
            problem = f"invalid snapshot handle {handle!r}"
        elif not self.image(handle).exists():
            problem = f"{handle} not found"
        else:
            self._set_ready(content, handle, self.image(handle))
            return
        self._set_error(content, f"Failed to check and update snapshot content: {problem}")

    def _delete_snapshot(self, content: JSON) -> None:
        handle = content["status"]["snapshotHandle"]
        self.image(handle).unlink(missing_ok=True)
        cleared = {"snapshotHandle": None, "readyToUse": None}
        cleared |= {"creationTime": None, "restoreSize": None}
        self._patch_status(content, cleared)
        log.info("content %s: snapshot %s deleted", content["metadata"]["name"], handle)

    # -- API writes -------------------------------------------------------------------------
    def _patch_status(self, content: JSON, status: JSON) -> JSON:
        meta = content["metadata"]
        body = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": status}
        return self.kube.patch(f"{CONTENTS}/{meta['name']}/status", body)

    def _set_ready(self, content: JSON, handle: str, image: Path) -> JSON:
        st = image.stat()
        status = {"snapshotHandle": handle, "readyToUse": True, "error": None}
        status |= {"creationTime": st.st_mtime_ns, "restoreSize": st.st_size}
        return self._patch_status(content, status)

    def _set_error(self, content: JSON, message: str) -> None:
        error = (content.get("status") or {}).get("error") or {}
        if error.get("message") == message:
            return  # the same error already stands: no new write, no new event
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._patch_status(
            content, {"readyToUse": False, "error": {"time": now, "message": message}}
        )

    def _mark_being_created(self, content: JSON) -> JSON:
        if ANN_BEING_CREATED in (content["metadata"].get("annotations") or {}):
            return content
        return self._patch_meta(content, {"annotations": {ANN_BEING_CREATED: "yes"}})

    def _drop_being_created(self, content: JSON) -> JSON:
        if ANN_BEING_CREATED not in (content["metadata"].get("annotations") or {}):
            return content
        return self._patch_meta(content, {"annotations": {ANN_BEING_CREATED: None}})

    def _remove_finalizer(self, content: JSON) -> None:
        finalizers = content["metadata"].get("finalizers") or []
        if CONTENT_FINALIZER not in finalizers:
            return
        kept = [f for f in finalizers if f != CONTENT_FINALIZER]
        self._patch_meta(content, {"finalizers": kept})

    def _patch_meta(self, content: JSON, meta: JSON) -> JSON:
        """A merge patch carrying the resourceVersion read: 409 if someone wrote meanwhile."""
        body = {"metadata": {"resourceVersion": content["metadata"]["resourceVersion"], **meta}}
        return self.kube.patch(f"{CONTENTS}/{content['metadata']['name']}", body)

    # -- restore (the external-provisioner's part) ------------------------------------------
    def restore(self, pvc: JSON, snapshot_name: str, dst: Path) -> None:
        """Copy the snapshot ``snapshot_name`` (in the claim's namespace) to image ``dst``;
        raise ``StorageError`` (retried by the provisioner) while it cannot be used yet."""
        ns = pvc["metadata"]["namespace"]
        snap = self.kube.get(snapshot_path(ns, snapshot_name))
        content = self._usable_content(pvc, snap)
        image = self.image(content["status"]["snapshotHandle"])
        if not image.exists():
            raise storage.StorageError(f"snapshot {image.stem} of {snapshot_name} not found")
        with self._protected(snap):
            storage.sparse_copy(image, dst)

    def _usable_content(self, pvc: JSON, snap: JSON) -> JSON:
        name = snap["metadata"]["name"]
        if snap["metadata"].get("deletionTimestamp") and SOURCE_FINALIZER not in (
            snap["metadata"].get("finalizers") or []
        ):
            raise storage.StorageError(f"snapshot {name} is being deleted")
        status = snap.get("status") or {}
        bound = status.get("boundVolumeSnapshotContentName")
        if not bound:
            raise storage.StorageError(f"snapshot {name} not bound")
        content = self.kube.get(f"{CONTENTS}/{bound}")
        ref = content["spec"].get("volumeSnapshotRef") or {}
        if ref.get("uid") != snap["metadata"]["uid"] or content["spec"]["driver"] != self.driver:
            raise storage.StorageError(f"snapshot {name} not bound")
        if not status.get("readyToUse"):
            raise storage.StorageError(f"snapshot {name} is not Ready")
        if not (content.get("status") or {}).get("snapshotHandle"):
            raise storage.StorageError(f"snapshot handle {name} is not available")
        check_size_and_mode(pvc, status, content)
        return content

    @contextmanager
    def _protected(self, snap: JSON) -> Iterator[None]:
        """Hold the source-protection finalizer on the snapshot while copying from it."""
        path = snapshot_path(snap["metadata"]["namespace"], snap["metadata"]["name"])
        finalizers = snap["metadata"].get("finalizers") or []
        if SOURCE_FINALIZER not in finalizers:
            version = snap["metadata"]["resourceVersion"]
            body = {"metadata": {"resourceVersion": version}}
            body["metadata"]["finalizers"] = [*finalizers, SOURCE_FINALIZER]
            snap = self.kube.patch(path, body)
        try:
            yield
        finally:
            self._release_source(path)

    def _release_source(self, path: str) -> None:
        for _ in range(5):  # others (the snapshot-controller) write finalizers too
            snap = self.kube.get_or_none(path)
            finalizers = (snap or {}).get("metadata", {}).get("finalizers") or []
            if snap is None or SOURCE_FINALIZER not in finalizers:
                return
            meta = {"resourceVersion": snap["metadata"]["resourceVersion"]}
            meta["finalizers"] = [f for f in finalizers if f != SOURCE_FINALIZER]
            try:
                self.kube.patch(path, {"metadata": meta})
                return
            except ApiError as e:
                if not e.conflict:
                    raise


def check_size_and_mode(pvc: JSON, snap_status: JSON, content: JSON) -> None:
    """The external-provisioner's checks: a claim at least the snapshot's size, and of the
    source volume's mode unless the content allows a change."""
    name = pvc["metadata"]["name"]
    want = int(parse_quantity(pvc["spec"]["resources"]["requests"]["storage"]))
    restore = snap_status.get("restoreSize")
    if restore is not None and want < int(parse_quantity(restore)):
        raise storage.StorageError(
            f"requested volume size {want} is less than the size {int(parse_quantity(restore))}"
            " for the source snapshot"
        )
    source_mode = content["spec"].get("sourceVolumeMode")
    mode = pvc["spec"].get("volumeMode") or "Filesystem"
    allowed = (content["metadata"].get("annotations") or {}).get(ANN_ALLOW_MODE_CHANGE, "")
    if source_mode and source_mode != mode and allowed.lower() != "true":
        raise storage.StorageError(
            f"requested volume {name} modifies the mode of the source volume but does not have"
            f" permission to do so: {ANN_ALLOW_MODE_CHANGE} is not true on snapshotcontent"
            f" {content['metadata']['name']}"
        )
