"""Build importer configs for tests the way the CLI and the pod do, with fast retry timings.

The servers are on loopback, which the import policy refuses by default: the configs allow
127.0.0.0/8 (and ::1) explicitly, as an operator would in CDIConfig, unless a test passes its
own ``policy``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from cdi.api.constants import ContentType
from cdi.api.netpolicy import LOOPBACK, NetPolicy
from cdi.api.termination import TerminationMessage
from datapath import TargetSpec, parse_checksum
from importer.config import (
    FileOptions,
    HttpOptions,
    ImportConfig,
    SourceOptions,
    WorkerEdges,
    build_plan,
)
from importer.runner import run_import

LOOPBACK_ALLOWED = NetPolicy.parse(LOOPBACK)


def http_config(
    url: str,
    target: Path | str,
    *,
    size: int | None = None,
    block: bool = False,
    checksum: str | None = None,
    content_type: str = "kubevirt",
    termination: Path | None = None,
    scratch_dir: str | None = None,
    spill_limit: int | None = None,
    **http: Any,
) -> ImportConfig:
    http.setdefault("policy", LOOPBACK_ALLOWED)
    source: SourceOptions = (
        HttpOptions(url=url, backoff_initial=0.01, backoff_max=0.05, **http)
        if url.startswith("http")
        else FileOptions(url)
    )
    plan = build_plan(
        source,
        TargetSpec(path=str(target), block=block, size=size),
        content_type=ContentType(content_type),
        checksum=parse_checksum(checksum) if checksum else None,
        scratch_dir=scratch_dir,
    )
    if spill_limit is not None:
        plan = replace(plan, spill_limit=spill_limit)
    edges = WorkerEdges(termination_path=str(termination) if termination else None)
    return ImportConfig(plan=plan, source=source, edges=edges)


async def import_url(url: str, target: Path | str, **kw: Any) -> TerminationMessage:
    return await run_import(http_config(url, target, **kw))


def with_target(config: ImportConfig, **changes: Any) -> ImportConfig:
    plan = config.plan
    return replace(config, plan=replace(plan, target=replace(plan.target, **changes)))
