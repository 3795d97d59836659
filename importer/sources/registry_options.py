"""What a registry import is configured with, apart from the registry client itself (pod
pull), and what a node pull is configured with.

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


@dataclass(frozen=True)
class NodePullOptions:
    """``pullMethod: node``: the kubelet pulled the image; its ``server`` container holds it
    (``importer.holder``, ``importer.sources.containerdisk``)."""

    url: str  # the DataVolume's docker:// URL: what the node pulled (the checkpoint's identity)
    shared_dir: str = "/shared"  # the emptyDir shared with the holder
    ready_timeout: float = 600.0  # seconds to wait for the holder's pid
    proc: str = "/proc"
