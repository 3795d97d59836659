"""Manifests, indexes and image configs: Docker schema 2 and OCI, read as untrusted JSON.

Pure functions of bytes, so each rule is unit-tested without a registry. An index (OCI image
index, Docker manifest list) is narrowed to the one manifest for the wanted platform with CDI's
message when none matches; a manifest gives the config descriptor and the layers, bottom first.
The config gives the image's environment: variables containing ``KUBEVIRT_IO_`` become labels
as CDI makes them (``INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=x`` ->
``instancetype.kubevirt.io/default-preference: x``), keeping only keys and values Kubernetes
accepts as labels, since the image author is not trusted. Schema 1 manifests (deprecated,
unsigned content addressing) and bootable-container images are refused, as CDI refuses them.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from importer.registry.errors import NoMatchingPlatform, UnsupportedManifest

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
INDEXES = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFESTS = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
ACCEPT = ", ".join((OCI_INDEX, DOCKER_LIST, OCI_MANIFEST, DOCKER_MANIFEST))
MAX_MANIFEST_BYTES = 4 * 1024 * 1024  # the distribution registry's own limit
MAX_LAYERS = 128
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_LABEL_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)")
_LABEL_PREFIX = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_BOOTC_LABELS = (("containers.bootc", "1"), ("ostree.bootable", "1"))


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: dict[str, str] | None = None


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: tuple[Descriptor, ...]  # bottom first, as in the manifest


def parse_json(body: bytes, what: str) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # "[[[[...": nesting
        raise UnsupportedManifest(f"the {what} is not JSON") from exc
    if not isinstance(data, dict):
        raise UnsupportedManifest(f"the {what} is not a JSON object")
    return data


def media_type(data: dict[str, Any], header: str) -> str:
    """The manifest's type: its own ``mediaType`` field, else the Content-Type, else its shape."""
    found = data.get("mediaType") or header.split(";")[0].strip()
    if not isinstance(found, str):  # a list or object would not even hash
        raise UnsupportedManifest("the manifest's mediaType is not a string")
    if found in INDEXES or found in MANIFESTS:
        return str(found)
    if data.get("schemaVersion") == 2 and isinstance(data.get("manifests"), list):
        return OCI_INDEX
    if data.get("schemaVersion") == 2 and isinstance(data.get("layers"), list):
        return OCI_MANIFEST
    raise UnsupportedManifest(
        f"manifest type {str(found)[:80]!r} (schema {data.get('schemaVersion')!r}) is not "
        "supported: push the image as Docker schema 2 or OCI"
    )


def descriptor(raw: Any, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise UnsupportedManifest(f"{what} is not a descriptor")
    digest, size = raw.get("digest"), raw.get("size")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise UnsupportedManifest(f"{what} has no sha256 digest")
    if not isinstance(size, int) or size < 0:
        raise UnsupportedManifest(f"{what} has no valid size")
    platform = raw.get("platform")
    if platform is not None and not isinstance(platform, dict):
        raise UnsupportedManifest(f"{what} has a platform that is not an object")
    plat = {k: str(v) for k, v in platform.items() if isinstance(v, str)} if platform else None
    return Descriptor(str(raw.get("mediaType", "")), digest, size, plat)


def choose_platform(data: dict[str, Any], architecture: str, variant: str = "") -> Descriptor:
    """The index entry for linux/``architecture`` (CDI's message when there is none)."""
    entries = data.get("manifests")
    if not isinstance(entries, list):
        raise UnsupportedManifest("the image index lists no manifests")
    for i, raw in enumerate(entries):
        entry = descriptor(raw, f"index entry {i}")
        plat = entry.platform or {}
        if (
            plat.get("os", "linux") == "linux"
            and plat.get("architecture") == architecture
            and (not variant or plat.get("variant", "") == variant)
            and entry.media_type in MANIFESTS | {""}
        ):
            return entry
    raise NoMatchingPlatform(
        "Unable to process data: Failed to read registry image: Error retrieving image: "
        f'choosing image instance: no image found in image index for architecture "{architecture}"'
        f', variant "{variant}", OS "linux"'
    )


def parse_manifest(data: dict[str, Any]) -> Manifest:
    config = descriptor(data.get("config"), "the manifest's config")
    layers = data.get("layers")
    if not isinstance(layers, list) or not layers:
        raise UnsupportedManifest("the manifest lists no layers")
    if len(layers) > MAX_LAYERS:
        raise UnsupportedManifest(f"the manifest lists more than {MAX_LAYERS} layers")
    return Manifest(config, tuple(descriptor(x, f"layer {i}") for i, x in enumerate(layers)))


def config_labels(data: dict[str, Any]) -> dict[str, str]:
    """PVC labels from the image config's ``KUBEVIRT_IO_`` environment variables."""
    conf = data.get("config") or {}
    if not isinstance(conf, dict):
        return {}
    refuse_bootable(conf.get("Labels"))
    env = conf.get("Env") or []
    labels: dict[str, str] = {}
    for item in env if isinstance(env, list) else []:
        if not isinstance(item, str) or "=" not in item:
            continue
        name, value = item.split("=", 1)
        if "KUBEVIRT_IO_" not in name:
            continue
        key = env_to_label(name)
        if key is not None and (not value or _LABEL_NAME.fullmatch(value)):
            labels[key] = value
    return labels


def env_to_label(name: str) -> str | None:
    """``TEST_KUBEVIRT_IO_TEST`` -> ``test.kubevirt.io/test``; None if not a valid label key."""
    before, _, after = name.partition("KUBEVIRT_IO_")
    prefix = before.replace("_", ".").lower() + "kubevirt.io"
    label = after.replace("_", "-").lower()
    if len(prefix) > 253 or not _LABEL_PREFIX.fullmatch(prefix):
        return None
    if not _LABEL_NAME.fullmatch(label):
        return None
    return f"{prefix}/{label}"


def refuse_bootable(labels: Any) -> None:
    if not isinstance(labels, dict):
        return
    for key, value in _BOOTC_LABELS:
        if labels.get(key) == value:
            raise UnsupportedManifest(
                f"the image is a bootable container ({key}={value}), not a containerDisk"
            )
