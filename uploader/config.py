"""Upload server configuration, read once at the process edge into a frozen dataclass.

The pod is rendered by the controller's upload flavour with CDI's environment variable names
(``TLS_CERT_FILE``, ``CLIENT_NAME``, ``DESTINATION``, ``UPLOAD_IMAGE_SIZE`` ...; the contract
is in docs/upload.md), so ``from_env`` is the only reader of the environment. Everything an
upload needs to build its data-path plan is here; the plan itself is made per upload
(``plan_for``) because the content type depends on the request: the archive endpoint, or
CDI's clone marker header ``x-cdi-content-type``.
"""

from __future__ import annotations

import datetime as dt
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass

from cdi.api.constants import ContentType
from cdi.api.content import parse_content_type
from cdi.api.errors import InvalidConfig
from cdi.api.quantity import Quantity, QuantityError
from cdi.api.tlsprofile import INTERMEDIATE, TLSProfile
from cdi.api.tlsprofile import from_env as tls_profile_from_env
from datapath import CheckpointPlan, ProcessPlan, TargetSpec
from datapath.checkpoint import INTERVAL as CHECKPOINT_INTERVAL

CERT_DIR = "/etc/cdi/upload-server"
DEFAULT_DESTINATION = "/data/disk.img"
SCRATCH_DIR = "/scratch"
TERMINATION_PATH = "/dev/termination-log"
CHECKPOINT_NAME = ".cdi-upload-checkpoint"
IDLE_TIMEOUT = 300.0  # a cut upload waits this long for its continuation, then is abandoned
HANDSHAKE_TIMEOUT = 10.0  # a TLS handshake, in total (N4)
HEAD_TIMEOUT = 30.0  # a verified client's first request head, in total after its handshake


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    client_ca: str  # the bundle client certificates must verify against (CLIENT_CERT_FILE)
    client_name: str  # the CN a client certificate must carry (CLIENT_NAME)
    profile: TLSProfile = INTERMEDIATE  # TLS_MIN_VERSION, TLS_CIPHERS: CDIConfig's profile


@dataclass(frozen=True)
class UploadConfig:
    tls: TlsFiles
    destination: str  # /data/disk.img (filesystem) or /dev/cdi-block-volume (block)
    block: bool
    size: int | None  # the PVC's requested bytes (UPLOAD_IMAGE_SIZE)
    filesystem_overhead: float = 0.0
    preallocate: bool = False
    content_type: ContentType = ContentType.KUBEVIRT
    owner_uid: str = ""
    deadline: dt.datetime | None = None
    address: str = "0.0.0.0"
    port: int = 8443
    scratch_dir: str = SCRATCH_DIR
    termination_path: str | None = TERMINATION_PATH
    checkpoint_path: str | None = None
    checkpoint_interval: int = CHECKPOINT_INTERVAL
    idle_timeout: float = IDLE_TIMEOUT
    handshake_timeout: float = HANDSHAKE_TIMEOUT
    head_timeout: float = HEAD_TIMEOUT
    verify: bool = False  # UPLOAD_VERIFY: read the volume back once filled (datapath.verify)

    def plan_for(self, content_type: ContentType, *, length: int | None) -> ProcessPlan:
        """The data path's plan for one upload of ``content_type``; a raw upload of known
        ``length`` checkpoints, so it survives a restart of the pod."""
        tree = content_type in (ContentType.ARCHIVE, ContentType.FILESYSTEM_CLONE)
        target = TargetSpec(
            path=os.path.dirname(self.destination) if tree else self.destination,
            block=self.block,
            size=self.size,
            filesystem_overhead=self.filesystem_overhead,
            preallocate=self.preallocate,
        )
        checkpoint = None
        # A sparse clone's wire offsets are not the image's: it cannot resume from one.
        framed = content_type == ContentType.BLOCKDEVICE_CLONE_SPARSE
        if self.checkpoint_path and not tree and not framed:
            source = f"upload:{self.owner_uid}"
            checkpoint = CheckpointPlan(self.checkpoint_path, source, self.checkpoint_interval)
        labels = {"ownerUID": self.owner_uid} if self.owner_uid else {}
        return ProcessPlan(
            target=target,
            content_type=content_type,
            scratch_dir=self.scratch_dir,
            checkpoint=checkpoint,
            labels=labels,
            verify=self.verify,
        )


def parse_size(text: str) -> int:
    try:
        return Quantity.parse(text.strip()).value()
    except QuantityError as exc:
        raise InvalidConfig(f"UPLOAD_IMAGE_SIZE {text!r} is not a size: {exc}") from exc


def parse_deadline(text: str) -> dt.datetime:
    try:
        when = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidConfig(f"DEADLINE {text!r} is not an RFC 3339 time") from exc
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def content_type(text: str | None) -> ContentType:
    return parse_content_type(text, "an upload")


def _is_block(path: str) -> bool:
    try:
        return stat.S_ISBLK(os.stat(path).st_mode)
    except OSError:
        return False


def _checkpoint_path(env: Mapping[str, str], destination: str, block: bool, scratch: str) -> str:
    """Beside a file target; for a block target on the scratch volume (if mounted)."""
    if env.get("UPLOAD_CHECKPOINT_PATH"):
        return env["UPLOAD_CHECKPOINT_PATH"]
    folder = scratch if block else os.path.dirname(destination)
    return os.path.join(folder, CHECKPOINT_NAME)


def _number(env: Mapping[str, str], name: str, default: float) -> float:
    try:
        return float(env.get(name) or default)
    except ValueError as exc:
        raise InvalidConfig(f"{name} {env.get(name)!r} is not a number") from exc


def from_env(env: Mapping[str, str]) -> UploadConfig:
    """The pod's configuration from CDI's environment variable names (docs/upload.md)."""
    destination = env.get("DESTINATION") or DEFAULT_DESTINATION
    block = _is_block(destination)
    scratch = env.get("UPLOAD_SCRATCH_DIR", SCRATCH_DIR)
    checkpoint = _checkpoint_path(env, destination, block, scratch)
    if block and not os.path.isdir(scratch) and not env.get("UPLOAD_CHECKPOINT_PATH"):
        checkpoint = ""  # nowhere durable to keep it: a restarted block upload starts over
    size, deadline = env.get("UPLOAD_IMAGE_SIZE"), env.get("DEADLINE")
    return UploadConfig(
        tls=TlsFiles(
            cert=env.get("TLS_CERT_FILE", f"{CERT_DIR}/tls.crt"),
            key=env.get("TLS_KEY_FILE", f"{CERT_DIR}/tls.key"),
            client_ca=env.get("CLIENT_CERT_FILE", f"{CERT_DIR}/ca.crt"),
            client_name=env.get("CLIENT_NAME", "client.upload-server.cdi.kubevirt.io"),
            profile=tls_profile_from_env(env),
        ),
        destination=destination,
        block=block,
        size=parse_size(size) if size else None,
        filesystem_overhead=_number(env, "FILESYSTEM_OVERHEAD", 0.0),
        preallocate=env.get("PREALLOCATION", "false").lower() == "true",
        content_type=content_type(env.get("CONTENT_TYPE")),
        owner_uid=env.get("OWNER_UID", ""),
        deadline=parse_deadline(deadline) if deadline else None,
        address=env.get("UPLOAD_SERVER_ADDRESS", "0.0.0.0"),
        port=int(_number(env, "UPLOAD_SERVER_PORT", 8443)),
        scratch_dir=scratch,
        termination_path=env.get("UPLOAD_TERMINATION_PATH", TERMINATION_PATH) or None,
        checkpoint_path=checkpoint or None,
        checkpoint_interval=int(_number(env, "UPLOAD_CHECKPOINT_INTERVAL", CHECKPOINT_INTERVAL)),
        idle_timeout=_number(env, "UPLOAD_IDLE_TIMEOUT", IDLE_TIMEOUT),
        handshake_timeout=_number(env, "UPLOAD_HANDSHAKE_TIMEOUT", HANDSHAKE_TIMEOUT),
        head_timeout=_number(env, "UPLOAD_HEAD_TIMEOUT", HEAD_TIMEOUT),
        verify=env.get("UPLOAD_VERIFY", "").lower() == "true",
    )
