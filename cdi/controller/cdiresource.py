"""The CDI resource reconciler: ``spec.config`` into CDIConfig, and the resource's status.

Keys are CDI resource names (cluster-scoped). The resource in force is the oldest
(``cdi.api.cdiresource.active``); for it, a ``spec.config`` that is set replaces CDIConfig
``config``'s spec whenever they differ (CDI's operator does the same: the CDI resource is the
source of truth for a cluster managed through it, so a direct edit of CDIConfig is put back;
without ``spec.config`` CDIConfig is left to whoever edits it). The copy is the object as the
API server stored it (the CRD's schema for ``config`` is CDIConfig's spec), not a re-encoding.

The rest of the resource reaches the product through CDIConfig's status, written by the
CDIConfig reconciler (``cdi.controller.cdiconfig``) from the resource in force: ``workload``
placement, ``cloneStrategyOverride``, ``certConfig``.

Status (``cdi.render.cdiresource``): phase and CDI's three conditions from the Deployments in
the CDI namespace (read fresh, not watched: the key comes back every ``recheck`` seconds), and
Degraded naming any setting that is ignored. Written only when it differs.

What wakes it (``watches``): any CDI resource wakes every one (which is in force may change),
and a CDIConfig change wakes the one in force (to put a direct edit back).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import Any, Protocol

from cdi.api.cdiresource import CDI, active
from cdi.api.codec import SchemaError
from cdi.api.constants import CDICONFIG_NAME
from cdi.kube.client import CDI_CONFIGS, CDIS, DEPLOYMENTS, AsyncKube
from cdi.kube.errors import Conflict, Forbidden, NotFound
from cdi.kube.watches import Maps, Watches
from cdi.kube.workqueue import Result
from cdi.render import cdiconfig as config_render
from cdi.render import cdiresource as render

log = logging.getLogger(__name__)

JSON = dict[str, Any]
VERSION = "v0.1.0"


class Store(Protocol):
    def items(self) -> list[JSON]: ...


def _name(obj: JSON) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def watches(cdis: Store) -> Watches:
    """``cdis``: the CDI resource cache."""

    def every(_obj: JSON) -> list[str]:
        return [_name(o) for o in cdis.items()]

    def in_force(_obj: JSON) -> list[str]:
        found = active(cdis.items())
        return [_name(dict(found))] if found else []

    return Watches((Maps(CDIS, every), Maps(CDI_CONFIGS, in_force)))


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class CDIResourceReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        cdis: Store,
        namespace: str,
        recheck: float = 60.0,
        now: Callable[[], str] = utc_now,
    ) -> None:
        self.kube = kube
        self.cdis = cdis
        self.namespace = namespace
        self.recheck = recheck
        self.now = now

    async def reconcile(self, key: str) -> Result:
        obj = await self.kube.get_or_none(CDIS, key)
        if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
            return Result()
        found = active([*(o for o in self.cdis.items() if _name(o) != key), obj])
        in_force = _name(dict(found)) if found else None
        problems: list[str] = []
        try:
            problems = render.spec_problems(CDI.from_dict(obj))
        except SchemaError as exc:
            problems = [f"unparsable: {exc}"]
        if in_force == key:
            try:
                await self._copy_config(obj)
            except Conflict:
                return Result(requeue_after=0.5)
        wanted = render.desired_status(
            in_force,
            key,
            await self._deployments(),
            problems,
            obj.get("status") or {},
            self.now(),
            VERSION,
        )
        if wanted != (obj.get("status") or {}):
            await self.kube.replace(CDIS, {**obj, "status": wanted}, sub="status")
        return Result(requeue_after=self.recheck)

    async def _copy_config(self, obj: JSON) -> None:
        """``spec.config``, when set, as CDIConfig ``config``'s spec."""
        spec = obj.get("spec") or {}
        if "config" not in spec or spec["config"] is None:
            return
        wanted = dict(spec["config"])
        current = await self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        if current is None:
            body = {**config_render.new_config(), "spec": wanted}
            await self.kube.create_if_absent(CDI_CONFIGS, body)
            return
        if (current.get("spec") or {}) != wanted:
            await self.kube.replace(CDI_CONFIGS, {**current, "spec": wanted})
            log.info("CDIConfig %s: spec set from CDI %s", CDICONFIG_NAME, _name(obj))

    async def _deployments(self) -> list[JSON]:
        """The product's Deployments (none when we may not look)."""
        try:
            listing = await self.kube.list(DEPLOYMENTS, self.namespace)
        except (NotFound, Forbidden):
            return []
        return list(listing.get("items") or [])
