"""The clone source pod's configuration, read once from CDI's environment at the process edge.

CDI's clone source pod (``pkg/controller/clone-controller.go``) gets ``UPLOAD_URL`` (the target
upload server's ``/v1beta1/upload``), ``VOLUME_MODE`` and ``MOUNT_POINT`` (the source mounted
read-only, or its block device), ``OWNER_UID`` and ``PREALLOCATION``, plus its client
certificate, whose CN the upload server demands (``srcNs/srcName-tgtNs/tgtName``). We pass
key material as mounted files, never in the environment: ``CLIENT_CERT_FILE``,
``CLIENT_KEY_FILE`` and ``SERVER_CA_CERT_FILE``. ``UPLOAD_SERVER_NAME`` (ours) is the name the
server's certificate is verified for when ``UPLOAD_URL`` names the Service by its ClusterIP.
``CLONE_STREAM`` (ours) is ``tar`` (default: a filesystem source as CDI's sparse tar) or
``raw`` (its ``disk.img`` alone, for a block target, which the controller knows and the source
pod does not). ``CLONER_METRICS_PORT`` and ``CLONER_METRICS_ADDR`` (ours; the controller renders
8443, CDI's cloner port, and the pod IP) serve the clone's progress as CDI's
``kubevirt_cdi_clone_progress_total``; unset, no metrics are served.
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
    raw: bool = False  # a filesystem source sends disk.img raw (for a block target)
    owner_uid: str = ""
    server_name: str = ""  # verify the server's certificate for this name (else the URL's host)
    termination_path: str | None = TERMINATION_PATH
    metrics_port: int | None = None  # serve progress here (None: not at all)
    metrics_addr: str = "0.0.0.0"


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
    stream = env.get("CLONE_STREAM", "tar").strip().lower()
    if stream not in ("tar", "raw"):
        raise InvalidConfig(f"CLONE_STREAM must be tar or raw, not {stream!r}")
    return CloneConfig(
        upload_url=url,
        client_cert=_required(env, "CLIENT_CERT_FILE"),
        client_key=_required(env, "CLIENT_KEY_FILE"),
        server_ca=_required(env, "SERVER_CA_CERT_FILE"),
        block=mode == "block",
        mount_point=env.get("MOUNT_POINT", SOURCE_MOUNT),
        raw=stream == "raw",
        owner_uid=env.get("OWNER_UID", ""),
        server_name=env.get("UPLOAD_SERVER_NAME", "").strip(),
        termination_path=env.get("CLONER_TERMINATION_PATH", TERMINATION_PATH),
        metrics_port=_port(env.get("CLONER_METRICS_PORT", "").strip()),
        metrics_addr=env.get("CLONER_METRICS_ADDR", "").strip() or "0.0.0.0",
    )


def _port(text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise InvalidConfig(f"CLONER_METRICS_PORT {text!r} is not a port")
    return int(text)
