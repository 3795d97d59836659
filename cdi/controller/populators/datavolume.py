"""The DataVolume reconciler's side of populators: make the claim a populated one, read it.

On CSI storage (and whenever ``storage.usePopulator: "true"`` asks; ``"false"`` opts out) a
DataVolume with an import or upload source does not run importer pods or an upload server on
its own claim (``POPULATED_KINDS``: the kinds whose claims it reads this way). Instead:

- ``populated_claim``: before the claim is created, the DataVolume's ``VolumeImportSource``
  is created (owned by the DataVolume) and the rendered claim names it in ``dataSourceRef``;
  from then on the claim is the populator's target (``cdi.controller.populators.import_``),
  unbound until its data is complete, so a VM pod that mounts it waits in Pending;
- ``population_view``: the DataVolume's status is read from what the populator mirrors onto
  the claim (the import record, the live pod phase, ``storage.populator.progress``), so
  status stays the pure function it is for every flavour. CDI's phases: PendingPopulation
  while WaitForFirstConsumer storage waits for a consumer to be scheduled (a VM runtime treats
  it as ready to start its pod, which is what triggers the population), ImportScheduled /
  ImportInProgress while the prime is filled, RebindInProgress between the import's success
  and the claim's binding, then Succeeded, or Failed with the import's reason.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Protocol

from cdi.api.constants import (
    ANN_IMMEDIATE_BINDING,
    ANN_POD_PHASE,
    ANN_POPULATOR_PROGRESS,
    ANN_PVC_PRIME_NAME,
    ANN_SELECTED_NODE,
    KIND_VOLUME_IMPORT_SOURCE,
    KIND_VOLUME_UPLOAD_SOURCE,
    Phase,
)
from cdi.api.types import DataVolume
from cdi.controller.progress import Progress
from cdi.controller.record import OUTCOME_SUCCEEDED, ClaimRecord
from cdi.controller.status import View
from cdi.kube.client import CSI_DRIVERS, VOLUME_IMPORT_SOURCES, VOLUME_UPLOAD_SOURCES, AsyncKube
from cdi.kube.errors import Conflict
from cdi.render.prime import render_import_source, uses_populator, with_data_source_ref

JSON = dict[str, Any]
_PERCENT = re.compile(r"^(\d{1,3}(?:\.\d+)?)%$")


class Store(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...


async def csi_storage(kube: AsyncKube, storage_class: Mapping[str, Any] | None) -> bool:
    """Whether the class's provisioner is a registered CSI driver."""
    provisioner = str((storage_class or {}).get("provisioner") or "")
    if not provisioner or "/" in provisioner:  # not a DNS subdomain: cannot be a CSIDriver
        return False
    return await kube.get_or_none(CSI_DRIVERS, provisioner) is not None


async def populated_claim(
    kube: AsyncKube, dv: DataVolume, desired: JSON, storage_classes: Store
) -> JSON:
    """``desired`` as the DataVolume's claim should be created: unchanged, or naming the
    (now existing) VolumeImportSource when the DataVolume goes through the populator."""
    sc_name = (desired.get("spec") or {}).get("storageClassName")
    storage_class = storage_classes.get(str(sc_name)) if sc_name else None
    if not uses_populator(dv, await csi_storage(kube, storage_class)):
        return desired
    source = render_import_source(dv)
    try:
        if source["kind"] == KIND_VOLUME_UPLOAD_SOURCE:
            await kube.create(VOLUME_UPLOAD_SOURCES, source, dv.namespace)
        else:
            await kube.create(VOLUME_IMPORT_SOURCES, source, dv.namespace)
    except Conflict:
        pass  # created by an earlier reconcile
    return with_data_source_ref(desired, source)


# The populator kinds a DataVolume's claim may name (its status is then read from the claim).
POPULATED_KINDS = (KIND_VOLUME_IMPORT_SOURCE, KIND_VOLUME_UPLOAD_SOURCE)


def parse_progress(text: str | None) -> Progress | None:
    found = _PERCENT.match(text or "")
    return Progress(percent=float(found.group(1))) if found else None


def pending_population(pvc: Mapping[str, Any], waits_for_consumer: bool) -> bool:
    """WaitForFirstConsumer storage, no consumer scheduled, no immediate binding asked for."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    if not waits_for_consumer or ann.get(ANN_IMMEDIATE_BINDING) is not None:
        return False
    return not ann.get(ANN_SELECTED_NODE) and not ann.get(ANN_PVC_PRIME_NAME)


def population_view(view: View, pvc: Mapping[str, Any], waits_for_consumer: bool) -> View:
    """What the DataVolume's status depends on, read from its populated claim."""
    ann = (pvc.get("metadata") or {}).get("annotations") or {}
    record = ClaimRecord.from_pvc(pvc)
    phase = (pvc.get("status") or {}).get("phase") or "Pending"
    bound = phase == "Bound"
    view = dataclasses.replace(view, pvc_phase=phase)
    progress = parse_progress(ann.get(ANN_POPULATOR_PROGRESS))
    if record.outcome == OUTCOME_SUCCEEDED and not bound:
        record = dataclasses.replace(record, outcome=None)
        return dataclasses.replace(
            view, record=record, step=Phase.REBIND_IN_PROGRESS, progress=progress
        )
    if record.done:
        return dataclasses.replace(view, record=record)
    if pending_population(pvc, waits_for_consumer):
        return dataclasses.replace(view, record=record, step=Phase.PENDING_POPULATION)
    pod_phase = ann.get(ANN_POD_PHASE)
    return dataclasses.replace(
        view,
        record=record,
        pod_phase=pod_phase if pod_phase in ("Pending", "Running") else None,
        progress=progress,
    )
