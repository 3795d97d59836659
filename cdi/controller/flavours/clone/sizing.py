"""CDI's size detection for a clone: run the pod, read its answer once, cache it on the source.

``measure`` is one step, called while an unsized host-assisted clone of a filesystem source
holding a ``kubevirt`` image waits for its size (``source.SourceSteps._sized_from_content``):

- the source claim already carries CDI's cache for its current capacity: nothing to run;
- no pod: create ``size-detection-<source uid>`` (``cdi.render.size_detection``) and remember
  the UID the create returned. Only that pod is ever read (the trust rule of every worker pod,
  ``cdi.controller.workerpod``): a pod at the name with another UID (a tenant's look-alike in
  the source namespace, or one an earlier leader made) is deleted by its UID and made again. The
  UID lives in memory, so a new leader measures again (safe, one more pod);
- our pod finished: its typed termination message's ``virtual_size`` is written on the source
  claim (``cdi.Kubervirt.io/virtualSize`` and ``sourceCapacity``, CDI's keys) and the pod is
  deleted. A pod that failed (no image, an unreadable one) gets CDI's Warning event
  ``SizeDetectionFailed``-style reason from its termination message and the clone goes on with
  the source's usable space (the rule before size detection), so a broken image never blocks
  a clone that the size rule allows;
- still running: wait (``None``).

The cache is read by ``cdi.render.clone.content_size``, which never lets it exceed the source's
usable space.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.controller.flavours import FlavourDeps
from cdi.controller.policy import pod_outcome
from cdi.controller.workerpod import pod_uid
from cdi.kube.client import PODS, PVCS
from cdi.kube.events import NORMAL, WARNING
from cdi.render.size_detection import (
    CONTAINER,
    measured_annotations,
    render_size_detection_pod,
    size_detection_pod_name,
)

# CDI's event reasons and messages (pvc-clone-controller.go)
SIZE_DETECTION_POD_CREATED = "SizeDetectionPodCreated"
MESSAGE_POD_CREATED = "Size-detection pod created"
SIZE_DETECTION_FAILED = "SizeDetectionFailed"  # CDI names the exit code; we name the reason


@dataclass(frozen=True)
class SizeSettings:
    """The size-detection pod runs the importer image."""

    image: str = "quay.io/cdi-py/cdi-importer:latest"
    pull_policy: str = "IfNotPresent"


@dataclass(frozen=True)
class Measured:
    """The source claim after a finished measurement (patched, or as it was after a failure)."""

    source: Mapping[str, Any]


class SizeDetection:
    def __init__(self, deps: FlavourDeps, settings: SizeSettings) -> None:
        self.deps, self.settings = deps, settings
        self._ours: dict[tuple[str, str], str] = {}  # (namespace, pod name) -> UID we created

    async def measure(
        self,
        dv: DataVolume,
        obj: Mapping[str, Any],
        source: Mapping[str, Any],
        cdi: CDIConfig,
    ) -> Measured | None:
        """One step (module docstring): the source to size from, or None while measuring."""
        kube = self.deps.kube
        meta = source.get("metadata") or {}
        ns, name = str(meta.get("namespace")), size_detection_pod_name(source)
        key = (ns, name)
        pod = await kube.get_or_none(PODS, name, ns)
        if pod is None:
            body = render_size_detection_pod(
                source, dv, cdi, self.settings.image, self.settings.pull_policy
            )
            created = await kube.create_if_absent(PODS, body, ns)
            if created is not None:
                self._ours[key] = str(pod_uid(created) or "")
                await self.deps.events.emit(
                    dict(obj), NORMAL, SIZE_DETECTION_POD_CREATED, MESSAGE_POD_CREATED
                )
            return None
        uid = pod_uid(pod)
        if not uid or self._ours.get(key) != uid:  # not the pod this process made: never read
            if not (pod.get("metadata") or {}).get("deletionTimestamp"):
                await kube.delete_if_present(PODS, name, ns, uid=uid)
            return None
        outcome = pod_outcome(dict(pod), CONTAINER)
        if outcome is None:
            return None
        await kube.delete_if_present(PODS, name, ns, uid=uid)
        self._ours.pop(key, None)
        term = outcome.termination
        size = term.virtual_size if term is not None and outcome.succeeded else 0
        patch = measured_annotations(source, size)
        if patch is None:
            message = f"size-detection pod failed: {outcome.reason}: {outcome.message}"
            await self.deps.events.emit(dict(obj), WARNING, SIZE_DETECTION_FAILED, message[:1024])
            return Measured(source)
        written = await kube.patch(
            PVCS, str(meta.get("name")), {"metadata": {"annotations": patch}}, ns
        )
        return Measured(written)
