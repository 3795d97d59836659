"""The clone source pod's configuration, read once from CDI's environment at the process edge.

CDI's clone source pod (``pkg/controller/clone-controller.go``) gets ``UPLOAD_URL`` (the target
upload server's ``/v1beta1/upload``), ``VOLUME_MODE`` and ``MOUNT_POINT`` (the source mounted
read-only, or its block device), ``OWNER_UID`` and ``PREALLOCATION``, plus its client
certificate, whose CN the upload server demands (``srcNs/srcName-tgtNs/tgtName``). We pass
key material as mounted files, never in the environment: ``CLIENT_CERT_FILE``,
``CLIENT_KEY_FILE`` and ``SERVER_CA_CERT_FILE``. ``CONTENT_TYPE`` (``kubevirt`` | ``archive``)
says what the volume holds: a disk image is sent raw, an archive volume as a tar.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from cdi.api.errors import InvalidConfig

TERMINATION_PATH = "/dev/termination-log"
SOURCE_MOUNT = "/var/run/cdi/clone/source"
DISK_IMAGE = "disk.img"


@dataclass(frozen=True)
class CloneConfig:
    upload_url: str
    client_cert: str
    client_key: str
    server_ca: str
    block: bool
    mount_point: str = SOURCE_MOUNT
    archive: bool = False  # the volume holds files, not disk.img: send a tar
    owner_uid: str = ""
    termination_path: str | None = TERMINATION_PATH


def _required(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "").strip()
    if not value:
        raise InvalidConfig(f"{name} is required")
    return value


def from_env(env: Mapping[str, str]) -> CloneConfig:
    url = _required(env, "UPLOAD_URL")
    if urlsplit(url).scheme != "https" or not urlsplit(url).hostname:
        raise InvalidConfig("UPLOAD_URL must be an https:// URL")
    mode = env.get("VOLUME_MODE", "filesystem").strip().lower()
    if mode not in ("block", "filesystem"):
        raise InvalidConfig(f"VOLUME_MODE must be block or filesystem, not {mode!r}")
    content = env.get("CONTENT_TYPE", "kubevirt").strip().lower()
    if content not in ("kubevirt", "archive"):
        raise InvalidConfig(f"CONTENT_TYPE must be kubevirt or archive, not {content!r}")
    return CloneConfig(
        upload_url=url,
        client_cert=_required(env, "CLIENT_CERT_FILE"),
        client_key=_required(env, "CLIENT_KEY_FILE"),
        server_ca=_required(env, "SERVER_CA_CERT_FILE"),
        block=mode == "block",
        mount_point=env.get("MOUNT_POINT", SOURCE_MOUNT),
        archive=content == "archive",
        owner_uid=env.get("OWNER_UID", ""),
        termination_path=env.get("CLONER_TERMINATION_PATH", TERMINATION_PATH),
    )
