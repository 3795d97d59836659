"""The status of a CDI resource, as a pure function of the resource and the deployed product.

CDI's operator reports its lifecycle in ``status.phase`` (``Deploying``, ``Deployed``,
``Error`` ...) and three conditions, ``Available``, ``Progressing`` and ``Degraded``
(controller-lifecycle-operator-sdk). We have no operator: ``deploy/`` installs the product, so
the phase and conditions say what that install is doing, read from the Deployments in the CDI
namespace:

- every Deployment available: ``Deployed``; Available True, Progressing False, Degraded False;
- some not yet (a rollout, a crash loop): ``Deploying``; Available False, Progressing True,
  naming them;
- a resource that is not the one in force (``cdi.api.cdiresource.active``: CDI serves the
  first and sets the others to ``Error``): ``Error``, Degraded True;
- a setting we had to ignore (``problems``: an unusable certConfig, an unknown
  cloneStrategyOverride) keeps the phase and sets Degraded True with the reasons.

A condition's ``lastTransitionTime`` moves only when its status does (``previous``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cdi.api.cdiresource import (
    CDI,
    CLONE_STRATEGIES,
    PHASE_DEPLOYED,
    PHASE_DEPLOYING,
    PHASE_ERROR,
    lifetimes,
)

JSON = dict[str, Any]
AVAILABLE, PROGRESSING, DEGRADED = "Available", "Progressing", "Degraded"


def spec_problems(cdi: CDI) -> list[str]:
    """Settings of ``cdi`` that are ignored, and why."""
    problems = list(lifetimes(cdi.spec.cert_config).problems)
    override = cdi.spec.clone_strategy_override
    if override and override not in CLONE_STRATEGIES:
        problems.append(
            f"cloneStrategyOverride {override!r} is not one of copy, snapshot, csi-clone"
        )
    return problems


def unavailable(deployments: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the Deployments whose ``Available`` condition is not True."""
    out = []
    for dep in deployments:
        conditions = (dep.get("status") or {}).get("conditions") or []
        ok = any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)
        if not ok:
            out.append(str((dep.get("metadata") or {}).get("name")))
    return sorted(out)


def desired_status(
    in_force: str | None,
    name: str,
    deployments: Sequence[Mapping[str, Any]],
    problems: Sequence[str],
    previous: Mapping[str, Any],
    now: str,
    version: str,
) -> JSON:
    """The status of CDI resource ``name`` when ``in_force`` is the one in force."""
    if in_force != name:
        message = f"There can be only one CDI resource: {in_force} is in force"
        phase = PHASE_ERROR
        wanted = [
            (AVAILABLE, "False", "NotInForce", message),
            (PROGRESSING, "False", "NotInForce", message),
            (DEGRADED, "True", "NotInForce", message),
        ]
    else:
        waiting = unavailable(deployments)
        if waiting:
            phase = PHASE_DEPLOYING
            message = "Deployments not available yet: " + ", ".join(waiting)
            wanted = [
                (AVAILABLE, "False", "DeploymentsNotAvailable", message),
                (PROGRESSING, "True", "DeploymentsNotAvailable", message),
            ]
        else:
            phase = PHASE_DEPLOYED
            wanted = [
                (AVAILABLE, "True", "DeployCompleted", "Deployment Completed"),
                (PROGRESSING, "False", "DeployCompleted", "Deployment Completed"),
            ]
        if problems:
            wanted.append((DEGRADED, "True", "SettingsIgnored", "; ".join(problems)))
        else:
            wanted.append((DEGRADED, "False", "AsExpected", ""))
    old = {c.get("type"): c for c in previous.get("conditions") or []}
    conditions = [_condition(old.get(t), t, s, r, m, now) for t, s, r, m in wanted]
    status: JSON = {"phase": phase, "conditions": conditions}
    if phase != PHASE_ERROR:
        status.update(observedVersion=version, operatorVersion=version, targetVersion=version)
    return status


def _condition(
    old: Mapping[str, Any] | None, kind: str, status: str, reason: str, message: str, now: str
) -> JSON:
    same = old is not None and old.get("status") == status
    since = str(old.get("lastTransitionTime")) if same and old else now
    out: JSON = {"type": kind, "status": status, "reason": reason, "lastTransitionTime": since}
    if message:
        out["message"] = message
    return out
