"""The DataVolume flavours: import, upload and clone behind one protocol (CDI's ``dvController``).

One reconciler owns everything every DataVolume shares: read it fresh, create or adopt its
PVC, wait for binding (or WaitForFirstConsumer), write the status once, emit phase events.
What differs by source is the work that fills the claim, so that is a ``Flavour``:

- ``phases`` (``cdi.controller.status.FlavourPhases``): the phases it reports while its
  worker is scheduled and in progress, and the words its conditions use, so the pure status
  function serves every flavour;
- ``events``: its phase events (reason and message per phase, CDI's);
- ``sync(claim, view) -> (view, Result)``: one level-triggered step of its work on a claim
  that is ready for it (bound, or immediately bindable), returning what it saw;
- ``finish(claim)``: what to do once the outcome is recorded on the PVC (clean up workers);
- plain attributes for what the reconciler treats differently (``claim_from_cache``,
  ``pod_before_bind``, ``fills_unbound``, ``first_record``, ``before_claim``, ``forget``), with
  neutral defaults in ``FlavourDefaults``: the reconciler never asks a flavour's type.

Every worker pod a flavour creates is trusted by one engine, ``cdi.controller.workerpod``.

``select_flavour`` maps the DataVolume's source to a flavour through one table
(``cdi.controller.flavours.table``): import (``import_``), upload (``upload``), clone from a
PVC, a snapshot or a DataSource naming either (``clone``). Sources no flavour fills (imageio,
vddk, a ``sourceRef`` other than a DataSource) map to ``Unsupported``, a value that says why;
the reconciler then leaves the DataVolume untouched. A new source is a new module here plus
one line in the table, not an edit of another flavour.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from cdi.api.config import CDIConfig
from cdi.api.constants import KIND_DATASOURCE, SourceKind
from cdi.api.types import DataVolume
from cdi.controller.importslots import ImportSlots
from cdi.controller.progress import Scraper
from cdi.controller.record import ClaimRecord
from cdi.controller.seal import Seal
from cdi.controller.status import FlavourPhases, View
from cdi.kube.client import AsyncKube
from cdi.kube.events import EventRecorder
from cdi.kube.own_writes import OwnWrites
from cdi.kube.workqueue import Result

JSON = dict[str, Any]


@dataclass(frozen=True)
class PhaseEvent:
    """The event emitted when the DataVolume enters a phase. ``{claim}`` in ``message`` is the
    claim's name; an empty message means the last attempt's "reason: message"."""

    kind: str  # Normal | Warning
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Claim:
    """What the reconciler hands a flavour: the DataVolume (parsed, and as read, for events),
    its PVC with the durable record on it, the pods the DataVolume controls, and the cluster
    configuration as read in this reconcile."""

    dv: DataVolume
    obj: Mapping[str, Any]
    pvc: JSON
    record: ClaimRecord
    pods: Mapping[str, JSON] = field(default_factory=dict)
    cdi_config: CDIConfig = field(default_factory=CDIConfig)
    # the record is the controller's sealed one (``cdi.controller.record.read_sealed``), not the
    # claim's CDI keys: a populator's prime, whose outcome authorizes a PV handover
    sealed: bool = False

    @property
    def name(self) -> str:
        return str(self.pvc["metadata"]["name"])


@dataclass(frozen=True)
class FlavourDeps:
    """The I/O a flavour may do, injected once: the API server, events, the metrics scraper and
    the clock (tests pass a fixed one). ``claims`` remembers what the flavour's claim writes
    returned: the reconciler reads the claim from its informer cache seen through them
    (``cdi.kube.own_writes``), so a follow-up never sees a pod without its UID record.
    ``burst`` says new DataVolumes are waiting for their first reconcile. ``storage_class``
    looks a StorageClass up by name in the reconciler's informer cache (None: not cached)."""

    kube: AsyncKube
    events: EventRecorder
    scraper: Scraper
    clock: Callable[[], float] = time.time
    claims: OwnWrites = field(default_factory=OwnWrites)
    # new DataVolumes wait for their first reconcile (a burst): writes that can wait for a
    # follow-up do (the import flavour's pod UID record, kept in memory until written)
    burst: Callable[[], bool] = field(default=lambda: False)
    storage_class: Callable[[str], Mapping[str, Any] | None] = field(default=lambda name: None)
    # seals every record written beside CDI's keys (``cdi.controller.seal``); None: unsealed
    seal: Seal | None = None
    # every worker pod in the cluster (the informer's): what holds an import slot
    worker_pods: Callable[[], Iterable[Mapping[str, Any]]] = field(default=lambda: ())
    # the queue for CDIConfig's maxConcurrentImports (``cdi.controller.importslots``)
    slots: ImportSlots = field(default_factory=ImportSlots)


class Flavour(Protocol):
    """One kind of DataVolume work (import, upload, clone).

    What the reconciler must know about a flavour is a plain attribute of it, never its type:
    ``claim_from_cache`` (every claim write of the flavour goes through ``FlavourDeps.claims``,
    so its claim may be read from the informer cache seen through them), ``pod_before_bind``
    (its worker pod may be created while a claim of an Immediate class is still Pending: the
    scheduler holds the pod until the bind), ``fills_unbound`` (``sync`` is called while the
    claim is still Pending: a clone waits for its bind there). ``FlavourDefaults`` gives a
    flavour that shapes nothing the neutral ones."""

    @property
    def phases(self) -> FlavourPhases: ...

    @property
    def events(self) -> Mapping[str, PhaseEvent]: ...

    @property
    def claim_from_cache(self) -> bool: ...

    @property
    def pod_before_bind(self) -> bool: ...

    @property
    def fills_unbound(self) -> bool: ...

    def first_record(self, claim_name: str) -> Mapping[str, str]:
        """Annotations a new claim (not a populator's) is created with: the flavour's first
        record, so its worker can follow in the same pass with no write first."""
        ...

    async def before_claim(
        self, dv: DataVolume, obj: Mapping[str, Any], desired: JSON, view: View
    ) -> tuple[JSON | None, View, Result]:
        """The claim to create from the rendered ``desired`` while none exists (a clone picks
        size, strategy, ``dataSource``, a moved volume), or None (not yet) and the result."""
        ...

    async def sync(self, claim: Claim, view: View) -> tuple[View, Result]:
        """Take at most one step of the work on a claim ready for it; say what was seen."""
        ...

    async def finish(self, claim: Claim) -> None:
        """The outcome is on the PVC: release what the work needed (worker pods, Services)."""
        ...

    async def forget(self, namespace: str, name: str) -> None:
        """The DataVolume ``namespace/name`` is gone: undo what no owner reference collects (a
        clone's temporary claim or source pod in another namespace)."""
        ...


class FlavourDefaults:
    """The neutral answers of a flavour that reads its claim fresh, starts its worker on a bound
    claim, and leaves the claim and other namespaces alone."""

    claim_from_cache = False
    pod_before_bind = False
    fills_unbound = False

    def first_record(self, claim_name: str) -> Mapping[str, str]:
        return {}

    async def before_claim(
        self, dv: DataVolume, obj: Mapping[str, Any], desired: JSON, view: View
    ) -> tuple[JSON | None, View, Result]:
        return desired, view, Result()

    async def forget(self, namespace: str, name: str) -> None:
        return None


@dataclass(frozen=True)
class Unsupported:
    """A DataVolume this controller does not fill: which source, and why."""

    source: str
    message: str


# by ``spec.source`` member, plus ``EXTERNAL``: no source, a claim ``dataSourceRef`` instead
FlavourTable = Mapping[str, Flavour | Unsupported]
EXTERNAL = "external"


def select_flavour(dv: DataVolume, table: FlavourTable) -> Flavour | Unsupported:
    """The flavour for ``dv``'s source, or why there is none."""
    if dv.spec.source_ref is not None:
        kind = dv.spec.source_ref.kind or "sourceRef"
        if kind != KIND_DATASOURCE:
            return Unsupported(kind, f"sourceRef {kind} is not supported")
        via = table.get(SourceKind.PVC)  # a DataSource is cloned like the PVC it names
        return via if via is not None else Unsupported(kind, "no flavour for it")
    source = dv.spec.source_kind
    if source is None:
        claim = dv.spec.storage or dv.spec.pvc
        if claim is not None and (claim.data_source_ref or claim.data_source):
            external = table.get(EXTERNAL)  # populated by another populator
            return external if external is not None else Unsupported(EXTERNAL, "no flavour")
        return Unsupported("none", "the DataVolume has no single source")
    chosen = table.get(source)
    return chosen if chosen is not None else Unsupported(str(source), "no flavour for it")
