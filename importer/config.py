"""Importer configuration, read once at the process edge into frozen dataclasses.

Two edges build it: ``from_env`` for the import pod (CDI's environment variable names, so pods
rendered the way CDI renders them work) and the ``cdi import`` command line. Either way the
result is three parts: the data path's frozen ``ProcessPlan`` (``build_plan``), the options of
the one source to read (HTTP, S3, GCS, a registry, a local file, or none for a blank disk) and the
process edges (termination message, metrics). Nothing below this module reads the environment.

Extra headers are validated here, at configuration time, so a bad one is a typed
``InvalidConfig`` before any connection: a name must be an HTTP token and not ``Host``, a
hop-by-hop header or one the importer manages itself (``Range``, ``Content-Length``); a value may
not hold CR, LF or NUL (header injection). Error messages name the header's origin, never its
value, which may be a secret.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit, urlunsplit

from cdi.api.checksum import Checksum
from cdi.api.constants import (
    DATAVOLUME_CONTENT_TYPES,
    EXTRA_HEADERS_DIR,
    IMPORTER_EXTRA_HEADER_PREFIX,
    QEMU_UID,
    SECRET_KEY_PROXY_HTTP,
    SECRET_KEY_PROXY_HTTPS,
    ContentType,
    ImporterEnv,
)
from cdi.api.content import parse_content_type
from cdi.api.errors import InvalidConfig
from cdi.api.netpolicy import NetPolicy
from cdi.api.quantity import Quantity, QuantityError, parse_rate
from datapath import CheckpointPlan, ProcessPlan, TargetSpec, parse_checksum
from datapath.checkpoint import INTERVAL as CHECKPOINT_INTERVAL
from datapath.plan import SPILL_MEMORY_LIMIT
from importer.poll import POLL_ENV, PollPlan, poll_plan
from importer.registry.credentials import registry_credentials
from importer.sources.gcs import GcsOptions, emulator_endpoint, gcs_options, service_account
from importer.sources.http import HttpOptions, ProxyConfig
from importer.sources.registry_options import NodePullOptions, RegistryOptions
from importer.sources.s3 import S3Options, s3_options
from importer.sources.sigv4 import Credentials

BLOCK_DEVICE_PATH = "/dev/cdi-block-volume"
DATA_DIR = "/data"
SCRATCH_DIR = "/scratch"
TERMINATION_PATH = "/dev/termination-log"
CHECKPOINT_NAME = ".cdi-import-checkpoint"  # beside disk.img; removed when the import ends
CHECKPOINT_SUFFIX = ".cdi-checkpoint"  # the CLI's: <target>.cdi-checkpoint
REGISTRY_POLL_ENV = "IMPORTER_REGISTRY_POLL"  # not CDI: "true" in DataImportCron poller pods
READY_TIMEOUT_ENV = "IMPORTER_READY_TIMEOUT"  # not CDI: node pull, seconds to wait for the holder
SHARED_DIR = "/shared"  # node pull: the emptyDir shared with the containerDisk's holder
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class FileOptions:
    """A local file (the CLI's ``cdi import ./disk.qcow2``)."""

    path: str


@dataclass(frozen=True)
class BlankOptions:
    """No source: an empty disk of the requested size."""


SourceOptions = (
    HttpOptions
    | S3Options
    | GcsOptions
    | RegistryOptions
    | NodePullOptions
    | FileOptions
    | BlankOptions
)


@dataclass(frozen=True)
class WorkerEdges:
    """What the import process does around the data path: where it reports, what it serves."""

    termination_path: str | None = None
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    owner_uid: str = ""


@dataclass(frozen=True)
class ImportConfig:
    """The importer's whole configuration: the data path's plan, where the bytes come from,
    and the process edges."""

    plan: ProcessPlan
    source: SourceOptions
    edges: WorkerEdges = field(default_factory=WorkerEdges)
    # Registry only: resolve the reference to its digest and report it; import nothing
    # (the DataImportCron poller pod, IMPORTER_REGISTRY_POLL=true).
    poll_only: bool = False
    # Bytes per second a network source may read at most (IMPORTER_BANDWIDTH_LIMIT); None: no cap
    bandwidth_limit: int | None = None
    # HTTP only: poll the image or the release stream at the URL; import nothing (the
    # DataImportCron poller pod of an HTTP or stream cron, IMPORTER_POLL; ``importer.poll``).
    http_poll: PollPlan | None = None


class TargetExists(InvalidConfig):
    """The CLI would overwrite a file the user did not ask it to replace."""


def attested_checkpoint(text: str | None) -> tuple[int, str] | None:
    """``IMPORTER_CHECKPOINT_ATTESTED`` (``<offset>:<blake3 hex>``, what the controller scraped
    from the previous attempt) as a pair; anything malformed is no attestation (restart)."""
    offset, _, digest = (text or "").partition(":")
    if not (offset.isdigit() and len(digest) == 64 and all(c in _HEX for c in digest)):
        return None
    return int(offset), digest


def source_id(source: SourceOptions) -> str:
    """The identity a checkpoint records for this source (a changed source restarts)."""
    if isinstance(source, HttpOptions | S3Options | GcsOptions | RegistryOptions | NodePullOptions):
        return source.url
    if isinstance(source, FileOptions):
        return source.path
    return ""


def build_plan(
    source: SourceOptions,
    target: TargetSpec,
    *,
    content_type: ContentType = ContentType.KUBEVIRT,
    checksum: Checksum | None = None,
    scratch_dir: str | None = SCRATCH_DIR,
    checkpoint_path: str | None = None,
    checkpoint_interval: int = CHECKPOINT_INTERVAL,
    checkpoint_attested: tuple[int, str] | None = None,
    require_attested: bool = False,
    spill_limit: int = SPILL_MEMORY_LIMIT,
    labels: Mapping[str, str] | None = None,
    verify: bool = False,
) -> ProcessPlan:
    """The data path's plan for an import from ``source`` into ``target``."""
    if content_type not in DATAVOLUME_CONTENT_TYPES:
        raise InvalidConfig(f"content type {content_type} is not one an import can take")
    checkpoint = None
    if checkpoint_path and not isinstance(source, BlankOptions):
        checkpoint = CheckpointPlan(
            checkpoint_path,
            source_id(source),
            checkpoint_interval,
            attested=checkpoint_attested,
            require_attested=require_attested,
        )
    return ProcessPlan(
        target=target,
        content_type=content_type,
        checksum=checksum,
        blank=isinstance(source, BlankOptions),
        scratch_dir=scratch_dir,
        spill_limit=spill_limit,
        checkpoint=checkpoint,
        labels=dict(labels or {}),
        verify=verify,
    )


def content_type(text: str | None) -> ContentType:
    """A DataVolume content type (kubevirt when unset); anything else is a typed error."""
    return parse_content_type(text, "an import")


def parse_size(text: str) -> int:
    """A Kubernetes quantity ("10Gi", "500M", "1073741824") in bytes."""
    try:
        return Quantity.parse(text.strip()).value()
    except QuantityError as exc:
        raise InvalidConfig(f"{text!r} is not a size (e.g. 10Gi, 512Mi): {exc}") from exc


def parse_bandwidth(text: str | None) -> int | None:
    """A bandwidth cap in bytes per second, as a Kubernetes quantity ("50Mi" is 50 MiB/s);
    unset or empty is no cap, anything else that is not a positive quantity a typed error."""
    try:
        return parse_rate(text)
    except QuantityError as exc:
        raise InvalidConfig(f"bandwidth limit {exc}") from exc


def mounted_files(folder: str | None) -> tuple[str, ...]:
    """The files of a mounted Secret or ConfigMap (dot-files are Kubernetes' bookkeeping)."""
    if not folder or not os.path.isdir(folder):
        return ()
    return tuple(
        os.path.join(folder, n)
        for n in sorted(os.listdir(folder))
        if not n.startswith(".") and os.path.isfile(os.path.join(folder, n))
    )


def _read_dir(path: str | None) -> dict[str, str]:
    """Name -> stripped content of each file of a mounted Secret or ConfigMap."""
    return {os.path.basename(f): read_file(f) or "" for f in mounted_files(path)}


def _headers(env: Mapping[str, str]) -> list[tuple[str, str]]:
    keys = sorted(k for k in env if k.startswith(IMPORTER_EXTRA_HEADER_PREFIX))
    return [split_header(env[key], key) for key in keys]


def _secret_headers(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """One mounted Secret per folder /extraheaders/<i>/, each file one header."""
    out = []
    root = env.get("IMPORTER_SECRET_EXTRA_HEADERS_DIR", EXTRA_HEADERS_DIR)
    if os.path.isdir(root):
        for sub in sorted(os.listdir(root)):
            for path in mounted_files(os.path.join(root, sub)):
                origin = f"secret header {sub}/{os.path.basename(path)}"
                out.append(split_header(read_file(path) or "", origin, secret=True))
    return out


def read_file(path: str | None) -> str | None:
    """A secret or setting kept in a file (a mounted Secret key), without its newline."""
    if not path:
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read().strip()


_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # RFC 9110 field-name
# Hop-by-hop (RFC 9110 7.6.1) and the headers the importer sets itself.
FORBIDDEN_HEADERS = frozenset(
    {
        "host",
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "range",
    }
)


def split_header(text: str, origin: str = "header", *, secret: bool = False) -> tuple[str, str]:
    """``Name: value`` checked for injection; ``origin`` names it in errors, never the value.

    A ``secret`` header (a file of a mounted Secret) is not even named: its messages become
    the DataVolume's condition and events, which ``view`` reads, and in a malformed file the
    "name" may well be the secret itself (``Bearer s3cret:x``), so they say only which file
    and what is wrong (N10, ``docs/security.md``)."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise InvalidConfig(f"{origin} is not 'Name: value' (no header name)")
    if not _TOKEN.fullmatch(name):
        if secret:
            raise InvalidConfig(f"{origin} has no valid header name")
        raise InvalidConfig(f"{origin}: {name[:40]!r} is not a valid header name")
    if name.lower() in FORBIDDEN_HEADERS:
        raise InvalidConfig(f"{origin}: {'its' if secret else f'the {name}'} header may not be set")
    if any(c in value for c in "\r\n\0"):
        value_of = "its header's value" if secret else f"the value of {name}"
        raise InvalidConfig(f"{origin}: {value_of} holds CR, LF or NUL")
    return name, value


def _proxy_url(url: str | None, creds: Mapping[str, str], key: str) -> str | None:
    """A proxy URL from the env with the userinfo from the mounted proxy-auth Secret put back
    (the address always comes from the env, which the pod spec fixes)."""
    if not url or not creds.get(key):
        return url or None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    netloc = f"{creds[key]}@{parts.netloc.rpartition('@')[2]}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def net_policy(env: Mapping[str, str]) -> NetPolicy:
    """The import network policy from the pod's env; none set: only public addresses."""
    try:
        return NetPolicy.parse(
            env.get(ImporterEnv.ALLOWED_SOURCE_CIDRS, "").split(","),
            env.get(ImporterEnv.CLUSTER_CIDRS, "").split(","),
        )
    except ValueError as exc:
        raise InvalidConfig(f"import policy: {exc}") from exc


def _target_from_env(env: Mapping[str, str], kind: ContentType) -> TargetSpec:
    block_path = env.get("IMPORTER_BLOCK_PATH", BLOCK_DEVICE_PATH)
    data_dir = env.get("IMPORTER_DATA_DIR", DATA_DIR)
    # A block target is a block device at the block path; anything else there (a leftover
    # placeholder on a node that shares /dev between pods) means a filesystem target.
    block = os.path.exists(block_path) and stat.S_ISBLK(os.stat(block_path).st_mode)
    size = env.get(ImporterEnv.IMAGE_SIZE)
    fs_path = data_dir if kind is ContentType.ARCHIVE else os.path.join(data_dir, "disk.img")
    return TargetSpec(
        path=block_path if block else fs_path,
        block=block,
        size=parse_size(size) if size else None,
        filesystem_overhead=float(env.get(ImporterEnv.FILESYSTEM_OVERHEAD, "0") or 0),
        preallocate=env.get(ImporterEnv.PREALLOCATION, "false").lower() == "true",
        owner=(QEMU_UID, QEMU_UID),
    )


def _http_from_env(env: Mapping[str, str]) -> HttpOptions:
    auth = _read_dir(env.get("IMPORTER_AUTH_DIR"))
    proxy_auth = _read_dir(env.get(ImporterEnv.PROXY_AUTH_DIR))
    proxy = ProxyConfig(
        http=_proxy_url(
            env.get("http_proxy") or env.get("HTTP_PROXY"), proxy_auth, SECRET_KEY_PROXY_HTTP
        ),
        https=_proxy_url(
            env.get("https_proxy") or env.get("HTTPS_PROXY"), proxy_auth, SECRET_KEY_PROXY_HTTPS
        ),
        no_proxy=tuple(filter(None, (env.get("no_proxy") or env.get("NO_PROXY") or "").split(","))),
    )
    return HttpOptions(
        url=env.get(ImporterEnv.ENDPOINT, ""),
        headers=tuple(_headers(env)),
        secret_headers=tuple(_secret_headers(env)),
        username=read_file(env.get(ImporterEnv.ACCESS_KEY_ID_FILE))
        or env.get("IMPORTER_ACCESS_KEY_ID")
        or auth.get("accessKeyId"),
        password=read_file(env.get(ImporterEnv.SECRET_KEY_FILE))
        or env.get("IMPORTER_SECRET_KEY")
        or auth.get("secretKey"),
        ca_files=mounted_files(env.get(ImporterEnv.CERT_DIR))
        + mounted_files(env.get(ImporterEnv.PROXY_CERT_DIR)),
        proxy_ca_files=mounted_files(env.get(ImporterEnv.PROXY_CERT_DIR)),
        insecure=env.get(ImporterEnv.INSECURE_TLS, "false").lower() == "true",
        proxy=proxy,
        policy=net_policy(env),
    )


def _s3_from_env(env: Mapping[str, str]) -> S3Options:
    """``source.s3``: the object's URL, the Secret's ``accessKeyId``/``secretKey`` (mounted
    files, as for http; CDI's env names also read) and the HTTP settings for trust, proxy,
    policy. No Secret: an anonymous request (a public object). Half a key pair is refused:
    signing with an empty half would only earn the endpoint's refusal later."""
    plain = {k: v for k, v in env.items() if "ACCESS_KEY" not in k and "SECRET_KEY" not in k}
    http = _http_from_env(plain)
    keys = _http_from_env(env)
    if (keys.username is None) != (keys.password is None) or keys.username == "":
        raise InvalidConfig("S3 secretRef: needs both accessKeyId and secretKey")
    credentials = (
        Credentials(keys.username, keys.password or "") if keys.username is not None else None
    )
    return s3_options(env.get(ImporterEnv.ENDPOINT, ""), credentials, http)


# Google's libraries' name, read when IMPORTER_GCS_ENDPOINT (CDIConfig spec.gcsEndpoint, what the
# controller renders) is not set; the controller never sets it
GCS_EMULATOR_ENV = "STORAGE_EMULATOR_HOST"


def _gcs_from_env(env: Mapping[str, str]) -> GcsOptions:
    """``source.gcs``: the object's URL, the service-account key the Secret's
    ``credentials.json`` holds (mounted at ``/google``, named by
    ``GOOGLE_APPLICATION_CREDENTIALS`` as CDI does; none: anonymous), the endpoint gs:// URLs
    are read from (``IMPORTER_GCS_ENDPOINT``, else ``STORAGE_EMULATOR_HOST``: only the pod
    spec sets them) and the HTTP
    settings for trust, proxy, policy. A key that does not parse is refused here, before any
    connection, without quoting it."""
    plain = {k: v for k, v in env.items() if "ACCESS_KEY" not in k and "SECRET_KEY" not in k}
    http = _http_from_env(plain)
    path = env.get(ImporterEnv.GOOGLE_APPLICATION_CREDENTIALS)
    account = None
    if path:
        try:
            text = read_file(path)
        except OSError as exc:
            raise InvalidConfig("GCS secretRef: credentials.json cannot be read") from exc
        if not text:
            raise InvalidConfig("GCS secretRef: the Secret has no credentials.json")
        account = service_account(text)
    endpoint = emulator_endpoint(env.get(ImporterEnv.GCS_ENDPOINT) or env.get(GCS_EMULATOR_ENV))
    return gcs_options(env.get(ImporterEnv.ENDPOINT, ""), account, http, endpoint)


def node_pull_dir(env: Mapping[str, str]) -> str | None:
    """The folder shared with the containerDisk's holder, for a node pull (else None)."""
    if env.get(ImporterEnv.PULL_METHOD) != "node" or env.get(ImporterEnv.SOURCE) != "registry":
        return None
    return os.path.dirname(env.get(ImporterEnv.DONE_FILE) or f"{SHARED_DIR}/done") or SHARED_DIR


def _node_pull_from_env(env: Mapping[str, str]) -> NodePullOptions:
    shared = node_pull_dir(env)
    assert shared is not None
    timeout = env.get(READY_TIMEOUT_ENV) or "600"
    try:
        seconds = float(timeout)
    except ValueError as exc:
        raise InvalidConfig(f"{READY_TIMEOUT_ENV} is not a number of seconds") from exc
    return NodePullOptions(env.get(ImporterEnv.ENDPOINT, ""), shared, seconds)


def _registry_from_env(env: Mapping[str, str]) -> RegistryOptions | NodePullOptions:
    """``source.registry``. Pod pull: the HTTP settings carry trust, proxy and policy; the
    credentials are the Secret's ``accessKeyId``/``secretKey`` or its ``.dockerconfigjson``.
    Node pull: the kubelet pulled with the node's settings; only the shared folder matters."""
    method = env.get(ImporterEnv.PULL_METHOD) or "pod"
    if method == "node":
        return _node_pull_from_env(env)
    if method != "pod":
        raise InvalidConfig(f"registry pull method {method!r} is not supported by this importer")
    plain = {k: v for k, v in env.items() if "ACCESS_KEY" not in k and "SECRET_KEY" not in k}
    http = _http_from_env(plain)
    http = replace(http, username=None, password=None, url="")
    url = env.get(ImporterEnv.ENDPOINT, "")
    username, password = registry_credentials(env, url)
    return RegistryOptions(
        url=url,
        http=http,
        username=username,
        password=password,
        insecure_registry=http.insecure,
        architecture=env.get(ImporterEnv.REGISTRY_IMAGE_ARCHITECTURE) or "",
    )


def _source_from_env(env: Mapping[str, str]) -> SourceOptions:
    kind = env.get(ImporterEnv.SOURCE, "http")
    if kind == "http":
        return _http_from_env(env)
    if kind == "s3":
        return _s3_from_env(env)
    if kind == "gcs":
        return _gcs_from_env(env)
    if kind == "registry":
        return _registry_from_env(env)
    if kind in ("none", "blank"):
        return BlankOptions()
    # imageio, vddk: rendered by the controller, not served by this importer.
    raise InvalidConfig(f"unknown source {kind!r}")


def from_env(env: Mapping[str, str]) -> ImportConfig:
    """Build the pod's configuration from CDI's environment variables."""
    kind = content_type(env.get(ImporterEnv.CONTENT_TYPE))
    target = _target_from_env(env, kind)
    source = _source_from_env(env)
    checksum = env.get(ImporterEnv.CHECKSUM)
    data_dir = env.get("IMPORTER_DATA_DIR", DATA_DIR)
    checkpoint = env.get("IMPORTER_CHECKPOINT_PATH") or (
        None if target.block else os.path.join(data_dir, CHECKPOINT_NAME)
    )
    plan = build_plan(
        source,
        target,
        content_type=kind,
        checksum=parse_checksum(checksum) if checksum else None,
        scratch_dir=env.get("IMPORTER_SCRATCH_DIR", SCRATCH_DIR),
        checkpoint_path=checkpoint,
        checkpoint_interval=int(env.get("IMPORTER_CHECKPOINT_INTERVAL", CHECKPOINT_INTERVAL)),
        # The pod writes a tenant's volume: only a prefix attested from outside it is resumed.
        checkpoint_attested=attested_checkpoint(env.get(ImporterEnv.CHECKPOINT_ATTESTED)),
        require_attested=True,
        verify=env.get(ImporterEnv.VERIFY, "").lower() == "true",
    )
    edges = WorkerEdges(
        termination_path=env.get("IMPORTER_TERMINATION_PATH", TERMINATION_PATH),
        metrics_port=int(env.get("IMPORTER_METRICS_PORT", "8443")),
        metrics_addr=env.get("IMPORTER_METRICS_ADDR", "0.0.0.0"),
        owner_uid=env.get(ImporterEnv.OWNER_UID, ""),
    )
    poll = env.get(REGISTRY_POLL_ENV, "").lower() == "true"
    if poll and not isinstance(source, RegistryOptions | NodePullOptions):
        raise InvalidConfig(f"{REGISTRY_POLL_ENV} applies to registry sources only")
    http_poll = poll_plan(env, env.get(ImporterEnv.ENDPOINT, ""))
    if http_poll is not None and type(source) is not HttpOptions:
        raise InvalidConfig(f"{POLL_ENV} applies to http sources only")
    bandwidth = parse_bandwidth(env.get(ImporterEnv.BANDWIDTH_LIMIT))
    return ImportConfig(
        plan=plan,
        source=source,
        edges=edges,
        poll_only=poll,
        http_poll=http_poll,
        bandwidth_limit=bandwidth,
    )
