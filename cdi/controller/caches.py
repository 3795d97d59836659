"""The controller's informer caches: one per kind, made on first use and shared by every
reconciler that reads or watches that kind.

The reconcilers ask for the caches they read when they are built, the manager for the kinds
their watch declarations name (``cdi.kube.watches``) when it wires them; either way a kind gets
one informer, shaped as ``SHAPES`` says (a kind not listed is cached whole). Kinds that some
clusters do not serve are deferred (``defer``): their informers belong to whoever starts them
(``cdi.controller.snapshotwatch``) and stay out of the start-up and the cache-sync wait.

What the caches of tenant-written kinds keep (``cdi.kube.informer_slim``, security review N8):
DataVolumes whole but bounded (their labels and annotations are copied to the claim; the
reconciler reads a partial one fresh), claims and DataSources only the keys the controller
reads of them, DataImportCrons their keys, conditions and template class (the reconciler
GETs the cron; the metrics read the rest, ``metrics.cron_view``). Pods only the worker pods
the controller follows (importers and upload servers), by label. Nodes only their name and
import slots (``cdi.controller.nodeslots``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from cdi.api.constants import ANN_SELECTED_NODE, LABEL_COMPONENT
from cdi.controller.dataimportcron_desired import DATAIMPORTCRONS
from cdi.controller.metrics import cron_view
from cdi.controller.nodeslots import node_view
from cdi.kube.client import (
    DATA_SOURCES,
    DATAVOLUMES,
    NODES,
    PODS,
    PVCS,
    Kube,
    Resource,
)
from cdi.kube.informer import Informer
from cdi.kube.informer_slim import SLIM_PAGE, Slim, Transform, kubevirt_and
from cdi.render.clone import ANN_CLONE_OF, ANN_CLONE_REQUEST
from cdi.render.upload_pod import UPLOAD_COMPONENT

# The worker pods the controller follows: importers and upload servers.
WORKER_PODS = f"{LABEL_COMPONENT} in (importer,{UPLOAD_COMPONENT})"
CLAIM_KEYS = kubevirt_and({ANN_SELECTED_NODE, ANN_CLONE_REQUEST, ANN_CLONE_OF})


@dataclass(frozen=True)
class Shape:
    """What one kind's informer lists and keeps."""

    label_selector: str | None = None
    transform: Transform | None = None
    page_size: int = 500


SHAPES: dict[Resource, Shape] = {
    DATAVOLUMES: Shape(transform=Slim(), page_size=SLIM_PAGE),
    PVCS: Shape(transform=Slim(CLAIM_KEYS), page_size=SLIM_PAGE),
    PODS: Shape(label_selector=WORKER_PODS),
    DATAIMPORTCRONS: Shape(transform=cron_view, page_size=SLIM_PAGE),
    DATA_SOURCES: Shape(transform=Slim(CLAIM_KEYS), page_size=SLIM_PAGE),
    NODES: Shape(transform=node_view, page_size=SLIM_PAGE),  # name and import slots only
}


def informer(kube: Kube, resource: Resource, resync: float) -> Informer:
    shape = SHAPES.get(resource, Shape())
    return Informer(
        kube,
        resource,
        resync=resync,
        label_selector=shape.label_selector,
        transform=shape.transform,
        page_size=shape.page_size,
    )


class Informers:
    """The informers of one controller term, by kind (each made once, on first use)."""

    def __init__(self, kube: Kube, resync: float) -> None:
        self.kube = kube
        self.resync = resync
        self._informers: dict[Resource, Informer] = {}
        self._deferred: set[Resource] = set()

    def __getitem__(self, resource: Resource) -> Informer:
        if resource not in self._informers:
            self._informers[resource] = informer(self.kube, resource, self.resync)
        return self._informers[resource]

    def defer(self, *informers: Informer) -> None:
        """Informers someone else starts (and stops) once their kind is served."""
        for one in informers:
            self._informers[one.resource] = one
            self._deferred.add(one.resource)

    def kinds(self) -> list[Resource]:
        """Every kind with an informer, in the order they were made."""
        return list(self._informers)

    def started_here(self) -> Iterator[Informer]:
        """The informers the manager starts, stops and waits for."""
        return (i for r, i in list(self._informers.items()) if r not in self._deferred)


def controller_informers(kube: Kube, resync: float) -> dict[Resource, Informer]:
    """An informer of every kind shaped in ``SHAPES`` (what the cache bounds are tested on)."""
    return {resource: informer(kube, resource, resync) for resource in SHAPES}
