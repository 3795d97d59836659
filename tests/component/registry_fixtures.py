"""Registries and containerDisk images for the registry import tests: the real
``docker-registry`` on loopback (anonymous http; TLS + htpasswd; TLS + bearer tokens), images
built with umoci and pushed with skopeo (``testkit.containerdisk``), and an importer config the
way the pod builds it, allowed to reach loopback as an operator would in CDIConfig."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cdi.api.termination import TerminationMessage
from datapath import TargetSpec
from importer.config import ImportConfig, build_plan
from importer.runner import run_import
from importer.sources.http import HttpOptions
from importer.sources.registry import RegistryOptions
from testkit.containerdisk import Edit, Layout, push
from testkit.registry import Registry, Tls, TokenServer
from tests.component.helpers import LOOPBACK_ALLOWED

USER, PASSWORD = "kubevirt", "s3cret-pass"


@dataclass
class Registries:
    anonymous: Registry  # plain http, no auth (an insecure registry)
    basic: Registry  # TLS + htpasswd
    bearer: Registry  # TLS + token server that checks credentials
    tls: Tls
    root: Path
    _built: int = 0

    def publish(
        self, registry: Registry, repo: str, layers: list[Edit], tag: str = "v1", **kw: Any
    ) -> str:
        """Build an image with umoci and push it with skopeo; returns its digest."""
        self._built += 1
        layout = Layout.create(self.root / f"layout{self._built}")
        build = {k: kw.pop(k) for k in ("env", "architecture") if k in kw}
        layout.build(tag, layers, **build)
        creds = (USER, PASSWORD) if registry is not self.anonymous else None
        return push(layout, tag, registry, repo, creds=creds, **kw)


@pytest.fixture(scope="module", name="registries")
def registries_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registries]:
    root = tmp_path_factory.mktemp("registries")
    tls = Tls.make(root / "tls")
    users = {USER: PASSWORD}
    token = TokenServer(root, tls, users)
    started = [
        Registry(root / "anonymous").start(),
        Registry(root / "basic", tls=tls, users=users).start(),
        Registry(root / "bearer", tls=tls, token=token).start(),
    ]
    try:
        yield Registries(*started, tls=tls, root=root)
    finally:
        for registry in started:
            registry.stop()


def registry_config(
    url: str,
    target: Path,
    *,
    registries: Registries | None = None,
    ca: bool = True,
    size: int | None = None,
    **options: Any,
) -> ImportConfig:
    http: dict[str, Any] = {"policy": LOOPBACK_ALLOWED, "backoff_initial": 0.01}
    http["backoff_max"] = 0.05
    if registries is not None and ca:
        http["ca_files"] = (str(registries.tls.ca_pem),)
    http.update(options.pop("http", {}))
    source = RegistryOptions(url=url, http=HttpOptions(url="", **http), **options)
    scratch = target.parent / "scratch"
    plan = build_plan(
        source, TargetSpec(path=str(target), block=False, size=size), scratch_dir=str(scratch)
    )
    return ImportConfig(plan=plan, source=source)


async def import_image(url: str, target: Path, **kw: Any) -> TerminationMessage:
    return await run_import(registry_config(url, target, **kw))
