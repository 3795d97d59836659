"""Image references: ``docker://host[:port]/repo[:tag|@sha256:hex]`` as CDI accepts them.

Parsed once into a frozen ``Reference`` so nothing downstream splits strings again. The rules
are the container tools' (``containers/image``'s docker reference): the first path component
is a registry host when it has a dot or a port or is ``localhost``, otherwise the image is on
Docker Hub (``registry-1.docker.io``, ``library/`` for one-component names); the tag defaults to
``latest``; a digest pins the content and wins over a tag given beside it. Only sha256
digests are accepted: it is what every registry serves and what we can verify.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cdi.api.errors import InvalidConfig

DOCKER_HUB = "registry-1.docker.io"
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HOST = re.compile(r"[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[[0-9A-Fa-f:.]+\](?::[0-9]{1,5})?")


@dataclass(frozen=True)
class Reference:
    registry: str  # host[:port] as written (lower-cased host)
    repository: str  # "library/ubuntu", "kubevirt/fedora"
    tag: str | None = None
    digest: str | None = None  # "sha256:<64 hex>"

    @property
    def reference(self) -> str:
        """What goes after ``/manifests/``: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def pinned(self, digest: str) -> Reference:
        """The same image pinned to ``digest`` (the tag dropped, as CDI's DataImportCron does)."""
        return Reference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        tail = f"@{self.digest}" if self.digest else f":{self.tag or 'latest'}"
        return f"docker://{self.registry}/{self.repository}{tail}"


def parse_reference(url: str) -> Reference:
    """A ``docker://`` URL as a ``Reference``; anything else is ``InvalidConfig``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme != "docker":
        raise InvalidConfig(f"registry URL must start with docker://, got {url[:80]!r}")
    rest, _, digest = rest.partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        raise InvalidConfig(f"{url[:200]!r}: only sha256 digests of 64 hex digits are accepted")
    first, slash, path = rest.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost" or first.startswith("[")):
        registry = first.lower()
    else:
        registry, path = DOCKER_HUB, rest
        if "/" not in path:
            path = f"library/{path}"
    if not _HOST.fullmatch(registry):
        raise InvalidConfig(f"{url[:200]!r}: {registry!r} is not a registry host")
    repository, tag = _split_tag(path, url)
    return Reference(registry, repository, tag or (None if digest else "latest"), digest or None)


def _split_tag(path: str, url: str) -> tuple[str, str | None]:
    head, colon, tag = path.rpartition(":")
    if colon and "/" not in tag:
        path = head
    else:
        tag = ""
    if tag and not _TAG.fullmatch(tag):
        raise InvalidConfig(f"{url[:200]!r}: {tag[:130]!r} is not a valid tag")
    parts = path.split("/")
    if not path or not all(_COMPONENT.fullmatch(p) for p in parts) or len(path) > 255:
        raise InvalidConfig(f"{url[:200]!r}: {path[:100]!r} is not a valid repository name")
    return path, tag or None
