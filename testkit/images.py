"""Which local command a container image stands for on the testkit node.

The node has no container runtime: a pod's image only selects an entrypoint, a default
command, environment and working directory from a small YAML map (``images.yaml`` beside this
module, or one passed with ``--images``). Resolution follows Kubernetes' rules for ``command``
and ``args`` against an image's ENTRYPOINT and CMD. An image the map does not know is pulled
for real (``testkit.runtime``).
"""

from __future__ import annotations

import fnmatch
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

DEFAULT_MAP = Path(__file__).with_name("images.yaml")
REPO_ROOT = Path(__file__).resolve().parent.parent


class UnknownImage(LookupError):
    """No entry of the image map matches the image."""


@dataclass(frozen=True)
class Image:
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"

    def argv(self, command: list[str] | None, args: list[str] | None) -> list[str]:
        """Kubernetes semantics: ``command`` replaces ENTRYPOINT (and drops CMD), ``args``
        replaces CMD."""
        if command:
            return list(command) + list(args or [])
        return list(self.entrypoint) + (list(args) if args else list(self.cmd))


def strip_reference(image: str) -> str:
    """``registry:5000/ns/name:tag@sha256:..`` -> ``registry:5000/ns/name``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if ":" in last[-1]:
        last[-1] = last[-1].split(":", 1)[0]
    return "/".join(last)


@dataclass(frozen=True)
class ImageMap:
    entries: tuple[tuple[tuple[str, ...], Image], ...]

    @classmethod
    def load(cls, path: Path = DEFAULT_MAP) -> ImageMap:
        doc = yaml.safe_load(path.read_text()) or {}
        entries = []
        for item in doc.get("images", []):
            entries.append((tuple(item["match"]), _image(item)))
        return cls(tuple(entries))

    def resolve(self, image: str) -> Image:
        ref = strip_reference(image)
        for patterns, img in self.entries:
            if any(fnmatch.fnmatchcase(ref, p) for p in patterns):
                return img
        raise UnknownImage(f"image {image!r} is not in the node's image map")


def _subst(text: str) -> str:
    text = text.replace("{python}", sys.executable).replace("{repo}", str(REPO_ROOT))
    if "{holder}" in text:  # compiled on first use, then cached
        from testkit.runtime import holder_binary

        text = text.replace("{holder}", str(holder_binary()))
    return text


def _image(item: dict) -> Image:
    return Image(
        entrypoint=tuple(_subst(s) for s in item.get("entrypoint", [])),
        cmd=tuple(_subst(s) for s in item.get("cmd", [])),
        env={k: _subst(str(v)) for k, v in (item.get("env") or {}).items()},
        workdir=_subst(item.get("workdir", "/")),
    )
