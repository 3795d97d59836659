"""Build importer configs for tests the way the CLI and the pod do, with fast retry timings.

The servers are on loopback, which the import policy refuses by default: the configs allow
127.0.0.0/8 (and ::1) explicitly, as an operator would in CDIConfig, unless a test passes its
own ``policy``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from cdi.api.netpolicy import LOOPBACK, NetPolicy
from cdi.api.termination import TerminationMessage
from datapath.decode import ContentType
from datapath.taps import parse_checksum
from datapath.target import TargetSpec
from importer.config import ImportConfig
from importer.runner import run_import
from importer.sources.http import HttpOptions

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
    **http: Any,
) -> ImportConfig:
    http.setdefault("policy", LOOPBACK_ALLOWED)
    options = HttpOptions(url=url, backoff_initial=0.01, backoff_max=0.05, **http)
    return ImportConfig(
        source="http" if url.startswith("http") else "file",
        file_path=None if url.startswith("http") else url,
        target=TargetSpec(path=str(target), block=block, size=size),
        http=options if url.startswith("http") else None,
        content_type=ContentType(content_type),
        checksum=parse_checksum(checksum) if checksum else None,
        scratch_dir=scratch_dir,
        termination_path=str(termination) if termination else None,
        metrics_port=None,
    )


async def import_url(url: str, target: Path | str, **kw: Any) -> TerminationMessage:
    return await run_import(http_config(url, target, **kw))


def with_target(config: ImportConfig, **changes: Any) -> ImportConfig:
    return replace(config, target=replace(config.target, **changes))
