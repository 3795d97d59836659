"""The ``CDI`` kind (``cdis.cdi.kubevirt.io``): the cluster's one CDI resource, CDI's shape.

CDI's operator reads this resource to deploy the product; here ``deploy/`` is the install, and
the controller's CDI reconciler (``cdi.controller.cdiresource``) carries out what the resource
says about the running product instead:

- ``spec.config`` becomes CDIConfig ``config``'s spec (CDI's rule: the CDI resource is the
  source of truth when it sets one);
- ``spec.workload`` (nodeSelector, tolerations, affinity) is applied to every worker pod,
  ``spec.cloneStrategyOverride`` beats every StorageProfile's clone strategy, and
  ``spec.certConfig`` sets the lifetimes of the certificates the controller issues: these three
  are copied into CDIConfig's status (``cdi.api.config.CDIConfigStatus``) by the CDIConfig
  reconciler, the one object every renderer already reads;
- ``spec.uninstallStrategy: BlockUninstallIfWorkloadsExist``: the webhook refuses to delete the
  resource while DataVolumes exist (``cdi.webhooks.cdiresource``);
- ``spec.infra`` places Deployments, which only an operator manages: it is recorded, not
  applied (``docs/controller.md``, "The CDI resource").

This module is the shapes and the pure rules about them: Go durations (``48h``, ``1h30m``), the
certificate lifetimes they give (``Lifetimes``), and which of several resources is the one.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cdi.api.codec import ApiObject
from cdi.api.config import CDICertConfig, CDIConfigSpec, CertConfig, NodePlacement
from cdi.api.types import Condition, ObjectMeta

UNINSTALL_BLOCK = "BlockUninstallIfWorkloadsExist"
UNINSTALL_REMOVE = "RemoveWorkloads"
CLONE_STRATEGIES = ("copy", "snapshot", "csi-clone")
# CDI's phases (controller-lifecycle-operator-sdk) that we reach
PHASE_DEPLOYING, PHASE_DEPLOYED, PHASE_ERROR = "Deploying", "Deployed", "Error"
UNINSTALL_REFUSED = (
    "Rejecting the uninstall request, since there are still DataVolumes present. Either delete "
    "all DataVolumes or change the uninstall strategy before uninstalling CDI."
)


@dataclass(frozen=True)
class ComponentConfig(ApiObject):
    """CDI's ``infra``: a ``NodePlacement`` inline plus replica counts."""

    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    affinity: Any = None
    tolerations: tuple[Any, ...] = ()
    deployment_replicas: int | None = None
    api_server_replicas: int | None = None
    upload_proxy_replicas: int | None = None


@dataclass(frozen=True)
class CDISpec(ApiObject):
    image_pull_policy: str | None = None
    uninstall_strategy: str | None = None
    infra: ComponentConfig | None = None
    workload: NodePlacement | None = None
    customize_components: Any = None
    clone_strategy_override: str | None = None
    config: CDIConfigSpec | None = None
    cert_config: CDICertConfig | None = None
    priority_class: str | None = None


@dataclass(frozen=True)
class CDIStatus(ApiObject):
    phase: str | None = None
    conditions: tuple[Condition, ...] = ()
    operator_version: str | None = None
    target_version: str | None = None
    observed_version: str | None = None


@dataclass(frozen=True)
class CDI(ApiObject):
    metadata: ObjectMeta = dataclasses.field(default_factory=ObjectMeta)
    spec: CDISpec = dataclasses.field(default_factory=CDISpec)
    status: CDIStatus | None = None

    @property
    def blocks_uninstall(self) -> bool:
        return self.spec.uninstall_strategy == UNINSTALL_BLOCK


def active(resources: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The CDI resource in force: the oldest (then the first by name), as CDI's operator
    serves the first and sets every later one to ``Error``."""
    live = [r for r in resources if not (r.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        return None
    return min(live, key=_age_key)


def _age_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("creationTimestamp") or ""), str(meta.get("name") or ""))


# --- Go durations and certificate lifetimes --------------------------------------------------

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class DurationError(ValueError):
    """A text that is not a Go duration (``time.ParseDuration``)."""


def parse_duration(text: str) -> dt.timedelta:
    """A Go duration (``48h``, ``1h30m0s``, ``90s``); no sign, at least one unit."""
    rest, seconds = text.strip(), 0.0
    if not rest or rest == "0":
        if rest == "0":
            return dt.timedelta(0)
        raise DurationError(f"invalid duration {text!r}")
    pos = 0
    while pos < len(rest):
        found = _PART.match(rest, pos)
        if found is None:
            raise DurationError(f"invalid duration {text!r}")
        seconds += float(found.group(1)) * _UNITS[found.group(2)]
        pos = found.end()
    return dt.timedelta(seconds=seconds)


@dataclass(frozen=True)
class Lifetime:
    """How long a certificate lives and how long before its end it is replaced."""

    duration: dt.timedelta
    renew_before: dt.timedelta

    def renew_at(self, not_before: dt.datetime, not_after: dt.datetime) -> dt.datetime:
        """When a certificate valid ``not_before``..``not_after`` is due: ``renew_before`` before
        its end, but never in the first half of its life (a setting that would rotate a
        certificate again right after issuing it)."""
        half = not_before + (not_after - not_before) / 2
        return max(not_after - self.renew_before, half)

    def due(self, not_before: dt.datetime, not_after: dt.datetime, now: dt.datetime) -> bool:
        return now >= self.renew_at(not_before, not_after)


# Without a certConfig: the lifetimes the product always used (CA a year, serving and client
# certificates 30 days, an upload server 24 hours), renewed with a fifth of their life left.
DEFAULT_CA = Lifetime(dt.timedelta(days=365), dt.timedelta(days=73))
DEFAULT_SERVER = Lifetime(dt.timedelta(days=30), dt.timedelta(days=6))
DEFAULT_CLIENT = Lifetime(dt.timedelta(days=30), dt.timedelta(days=6))
DEFAULT_UPLOAD_SERVER = Lifetime(dt.timedelta(hours=24), dt.timedelta(hours=24) * 0.2)


@dataclass(frozen=True)
class Lifetimes:
    ca: Lifetime = DEFAULT_CA
    server: Lifetime = DEFAULT_SERVER
    client: Lifetime = DEFAULT_CLIENT
    upload_server: Lifetime = DEFAULT_UPLOAD_SERVER
    problems: tuple[str, ...] = ()  # settings ignored, and why (the CDI status shows them)


def lifetime_of(given: CertConfig | None, default: Lifetime, name: str) -> tuple[Lifetime, str]:
    """``given`` over ``default`` (a missing part keeps the default's); a setting that cannot
    be used (unparsable, not positive, renewBefore not shorter than duration) is ignored with
    a message."""
    if given is None or (given.duration is None and given.renew_before is None):
        return default, ""
    try:
        duration = parse_duration(given.duration) if given.duration else default.duration
        renew = parse_duration(given.renew_before) if given.renew_before else None
    except DurationError as exc:
        return default, f"certConfig.{name}: {exc}"
    if renew is None:  # the default's share of the new duration
        renew = duration * (default.renew_before / default.duration)
    if duration <= dt.timedelta(0) or not dt.timedelta(0) < renew < duration:
        msg = f"certConfig.{name}: renewBefore must be positive and shorter than duration"
        return default, msg
    return Lifetime(duration, renew), ""


def lifetimes(config: CDICertConfig | None, upload_server: Lifetime | None = None) -> Lifetimes:
    """The lifetimes in force. ``certConfig.server`` also sets the upload servers'
    certificates; without it they keep ``upload_server`` (the controller's flag)."""
    config = config or CDICertConfig()
    ca, p1 = lifetime_of(config.ca, DEFAULT_CA, "ca")
    server, p2 = lifetime_of(config.server, DEFAULT_SERVER, "server")
    client, p3 = lifetime_of(config.client, DEFAULT_CLIENT, "client")
    upload = upload_server or DEFAULT_UPLOAD_SERVER
    if config.server is not None and not p2:
        upload = server
    return Lifetimes(ca, server, client, upload, tuple(p for p in (p1, p2, p3) if p))
