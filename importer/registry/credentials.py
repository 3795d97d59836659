"""Registry credentials from the mounted ``secretRef`` Secret, in either of its two shapes.

CDI's shape: keys ``accessKeyId`` and ``secretKey`` (user name and password or token). The
shape every registry user already has: a ``kubernetes.io/dockerconfigjson`` Secret whose
``.dockerconfigjson`` maps registry hosts to ``auth`` (base64 ``user:password``) or
``username``/``password``. Only the entry for the image's own registry is used, so a Secret
holding credentials for several registries never sends one registry's password to another.
Read once at the process edge; values are never put in messages.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from cdi.api.constants import ImporterEnv
from cdi.api.errors import InvalidConfig
from importer.registry.reference import DOCKER_HUB, parse_reference

DOCKER_CONFIG = ".dockerconfigjson"
_HUB_KEYS = ("docker.io", "index.docker.io", "registry-1.docker.io")


def _read(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


def registry_credentials(env: Mapping[str, str], url: str) -> tuple[str | None, str | None]:
    """(user, password) for the registry of ``url``, or (None, None) for anonymous pulls."""
    key_file = env.get(ImporterEnv.ACCESS_KEY_ID_FILE)
    user = _read(key_file) or env.get("IMPORTER_ACCESS_KEY_ID")
    password = _read(env.get(ImporterEnv.SECRET_KEY_FILE)) or env.get("IMPORTER_SECRET_KEY")
    if user:
        return user, password
    folder = os.path.dirname(key_file) if key_file else env.get("IMPORTER_AUTH_DIR")
    text = _read(os.path.join(folder, DOCKER_CONFIG)) if folder else None
    if text is None:
        return None, None
    return docker_config_credentials(text, parse_reference(url).registry)


def docker_config_credentials(text: str, registry: str) -> tuple[str | None, str | None]:
    """The entry of a docker config JSON for ``registry`` (host[:port])."""
    try:
        auths = json.loads(text).get("auths") or {}
    except (ValueError, AttributeError) as exc:
        raise InvalidConfig(f"{DOCKER_CONFIG} of the secretRef Secret is not valid JSON") from exc
    wanted = {registry} | (set(_HUB_KEYS) if registry == DOCKER_HUB else set())
    for key, entry in auths.items() if isinstance(auths, dict) else ():
        host = urlsplit(key).netloc if "://" in key else key.split("/")[0]
        if host.lower() not in wanted or not isinstance(entry, dict):
            continue
        if entry.get("username"):
            return str(entry["username"]), str(entry.get("password") or "")
        try:
            user, _, password = base64.b64decode(str(entry.get("auth", ""))).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise InvalidConfig(f"{DOCKER_CONFIG}: the auth of {host} is not base64") from exc
        return user or None, password
    return None, None
