"""The one rule for a worker pod the controller creates and then trusts (every flavour's).

The importer, the upload server, the host-assisted clone's source pod and the DataImportCron
poller are each created by the controller at a deterministic name, and what they report (phase,
readiness, restarts, termination message) decides an import, an upload, a clone or the digest a
cron imports. A name, labels and an owner reference are no proof of origin: a tenant who may
create pods in the namespace can create a pod at that name first, labelled and "owned" like
ours, and its termination message would then decide the outcome. So every flavour follows the
same three steps, and only this module says what a pod at the name is:

1. ``assess(pod, recorded_uid, container)``, pure: the pod at the name is ``OURS`` only when its
   UID is the one recorded from the controller's own create (on the claim, or on the cron);
   any other pod there is an ``IMPOSTOR``, also when nothing is recorded (then the controller
   has not created one it knows of); nothing there is ``ABSENT``. Only ours is read: its phase,
   readiness, deletion, container restarts with the last restart's termination, and once it has
   finished its ``Outcome`` (the typed termination message, ``cdi.controller.policy``). An
   impostor's assessment carries the pod only so it can be reported and deleted.
2. ``ABSENT``: ``create_pod``, whose answer is the UID to record before anything reads the pod
   (a 409 is never adoption: someone's pod holds the name, and the next step judges it).
3. ``IMPOSTOR``: ``remove_impostor``: a Warning event (when there is someone to tell) and a
   delete preconditioned on the impostor's UID, so a pod created meanwhile is spared.

What a flavour does with its own pod (the failure policy, an upload's renewal, a clone's
progress) stays the flavour's; where it records the UID (the claim's ``ClaimRecord``, a clone's
``clone.sourcePodUID``, a cron's ``pollerPodUID``) too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from cdi.api.constants import IMPORTER_CONTAINER_NAME
from cdi.controller.policy import Outcome, pod_outcome
from cdi.kube.client import PODS, AsyncKube
from cdi.kube.events import WARNING, EventRecorder

JSON = dict[str, Any]


class Trust(StrEnum):
    ABSENT = "Absent"  # no pod at the name
    OURS = "Ours"  # the pod whose UID the controller recorded from its own create
    IMPOSTOR = "Impostor"  # any other pod at the name: reported and deleted, never read


@dataclass(frozen=True)
class Assessment:
    """What stands at a worker pod's name. Every field but ``impostor`` describes our pod and
    is empty unless ``trust`` is ``OURS``."""

    trust: Trust
    pod: JSON | None = None  # ours: the only pod a flavour may read
    impostor: JSON | None = None  # someone's: only for the event and the delete
    phase: str | None = None  # Pending | Running | Succeeded | Failed
    ready: bool = False
    deleting: bool = False
    restarts: int = 0  # of the worker container (restartPolicy OnFailure)
    last_restart: Outcome | None = None  # how its previous run ended
    outcome: Outcome | None = None  # once the pod has finished: its termination message, read

    @property
    def ours(self) -> bool:
        return self.trust == Trust.OURS

    @property
    def finished(self) -> bool:
        return self.outcome is not None


def pod_uid(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("metadata") or {}).get("uid") or None


def assess(
    pod: Mapping[str, Any] | None,
    recorded_uid: str | None,
    container: str = IMPORTER_CONTAINER_NAME,
) -> Assessment:
    """The verdict on the pod at a worker's name, given the UID recorded from our create."""
    if pod is None:
        return Assessment(Trust.ABSENT)
    if recorded_uid is None or pod_uid(pod) != recorded_uid:
        return Assessment(Trust.IMPOSTOR, impostor=dict(pod))
    ours = dict(pod)
    status = ours.get("status") or {}
    cs = _container_status(status, container)
    return Assessment(
        Trust.OURS,
        pod=ours,
        phase=status.get("phase") or "Pending",
        ready=any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        ),
        deleting=bool((ours.get("metadata") or {}).get("deletionTimestamp")),
        restarts=int(cs.get("restartCount") or 0),
        last_restart=_last_restart(cs, container),
        outcome=pod_outcome(ours, container),
    )


def _container_status(status: Mapping[str, Any], container: str) -> Mapping[str, Any]:
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == container:
            return dict(cs)
    return {}


def _last_restart(cs: Mapping[str, Any], container: str) -> Outcome | None:
    """The outcome of the container's previous run, read as ``pod_outcome`` reads a finished
    pod (the typed termination message, or the kubelet's reason without one)."""
    last = (cs.get("lastState") or {}).get("terminated")
    if not last:
        return None
    shaped = {"status": {"phase": "Failed", "containerStatuses": [
        {"name": container, "state": {"terminated": last}}
    ]}}  # fmt: skip
    return pod_outcome(shaped, container)


# -- the thin apply side ------------------------------------------------------------------------


async def create_pod(kube: AsyncKube, pod: JSON, namespace: str) -> str | None:
    """Create a worker pod; the UID to record (before anything reads the pod), or None when a
    pod already holds the name (409): never adopted, the next assessment judges it."""
    created = await kube.create_if_absent(PODS, pod, namespace)
    return None if created is None else pod_uid(created) or ""


async def remove_impostor(
    kube: AsyncKube,
    pod: Mapping[str, Any],
    namespace: str,
    *,
    events: EventRecorder | None = None,
    about: Mapping[str, Any] | None = None,
    reason: str = "",
    work: str = "",
) -> None:
    """Delete an impostor by its UID (a pod created at the name meanwhile is spared), after a
    Warning event ``reason`` on ``about`` saying it was not created for ``work``. A pod already
    being deleted is left to go."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return
    if events is not None and about is not None:
        await events.emit(
            dict(about),
            WARNING,
            reason,
            f"Pod {meta.get('name')} (uid {meta.get('uid')}) was not created by the controller "
            f"for this {work}; it is ignored and deleted",
        )
    await kube.delete_if_present(PODS, str(meta.get("name")), namespace, uid=meta.get("uid"))
