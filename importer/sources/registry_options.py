"""What a registry import is configured with, apart from the registry client itself.

Its own module so that ``importer.config`` (and so every ``cdi import``, registry or not) does
not import the registry client, manifest and layer code at start-up: ~30 ms of a one-second
import (issue 9's benchmark rows). ``importer.runner`` imports the source only for this type.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from importer.sources.http import HttpOptions


@dataclass(frozen=True)
class RegistryOptions:
    url: str  # docker://host[:port]/repo[:tag|@sha256:...]
    http: HttpOptions = field(default_factory=lambda: HttpOptions(url=""))  # trust, policy...
    username: str | None = None
    password: str | None = None
    insecure_registry: bool = False  # CDIConfig insecureRegistries: no TLS check, http fallback
    architecture: str = ""  # "" -> this node's
