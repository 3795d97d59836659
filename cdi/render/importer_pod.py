"""Render the importer Pod that fills a DataVolume's PVC (CDI ``makeImporterPodSpec``, §2.12).

Shape, and why:

- Named ``importer-<pvc>`` (``importer-<pvc>-retry-<n>`` for a retry; ``cdi.render.naming``),
  owned by the DataVolume, labelled as CDI labels it (``app``, ``cdi.kubevirt.io: importer``,
  ``prometheus.cdi.kubevirt.io``) plus the attempt and the controller's extra labels. The
  renderer returns the final pod: attempt, labels and metrics settings are its inputs
  (``cdi.render.worker_pod.WorkerPod``), shared with the other workers' pods.
- ``restartPolicy: Never``: a failed attempt ends the pod and the controller decides whether to
  retry (bounded, with backoff), instead of CDI's endless kubelet CrashLoopBackOff.
- Restricted security: non-root uid/gid 107 (qemu; ``disk.img`` ends up group 107), fsGroup 107,
  no privilege escalation, all capabilities dropped, RuntimeDefault seccomp, read-only root
  filesystem with an emptyDir at ``/tmp``, no service-account token, no service links. (Block
  targets need the runtime's ``device_ownership_from_security_context``, as in CDI.)
- The target: a Filesystem PVC mounted at ``/data`` (image written to ``/data/disk.img``), a
  Block PVC as the device ``/dev/cdi-block-volume``. ``/scratch`` only once the importer
  asked for it (``scratchSpaceRequired``, ``cdi.render.scratch``): CDI's ``<pvc>-scratch``
  claim, or, when no storage class can be found for one, an emptyDir sized to the largest
  image the claim can need. A first pod has none: a streamable image never needs it, and a
  filesystem target stages beside ``disk.img`` on its own volume.
- The termination message at ``/dev/termination-log`` (policy FallbackToLogsOnError); metrics on
  port 8443 named ``metrics``; resources from CDIConfig (CDI's defaults otherwise).
- Registry ``pullMethod: node`` (CDI's shape, with a holder instead of CDI's HTTP server): the
  kubelet pulls the containerDisk and runs it as the container ``server``, listed first so the
  kubelet pulls and starts it before the importer; its command is the static ``cdi-holder``,
  which the init container ``holder-init`` (the importer image, ``install-holder``) copied into
  the emptyDir ``/shared``. ``shareProcessNamespace`` lets the importer read the holder's root,
  ``/proc/<pid>/root/disk/`` (``importer.sources.containerdisk``). ``platform.architecture``
  becomes the nodeSelector ``kubernetes.io/arch``. ``deploy/15-admission-policy.yaml`` admits
  the arbitrary image only in that exact container.
- Placement (``cdi.render.placement``): the CDI resource's ``workload``, narrowed by the
  DataVolume's ``cdi.kubevirt.io/storage.pod.nodeSelector`` and pinned to a placed claim's
  node; the node-pull architecture is added to the nodeSelector after it.

The importer runs as ``python -m importer`` and reads its configuration once, at start, from
these environment variables (CDI's names, ``cdi.api.constants.ImporterEnv``):

=================================  =================================================
``IMPORTER_SOURCE``                http | s3 | gcs | registry | imageio | vddk | none (blank)
``IMPORTER_ENDPOINT``              source URL (registry: URL or image stream)
``IMPORTER_CONTENTTYPE``           kubevirt | archive
``IMPORTER_IMAGE_SIZE``            the PVC's requested size, a Quantity string
``OWNER_UID``                      DataVolume UID (label of the progress metric)
``FILESYSTEM_OVERHEAD``            fraction for the PVC's class ("0" for Block)
``PREALLOCATION``                  "true" | "false"
``INSECURE_TLS``                   "true" to skip TLS verification
``IMPORTER_CHECKSUM``              "algorithm:hex" (http only)
``IMPORTER_CERT_DIR``              ``/certs``: the certConfigMap's files, each a CA bundle
``IMPORTER_PROXY_CERT_DIR``        ``/proxycerts/``: trusted CA of the import proxy
``http_proxy`` ``https_proxy``     from CDIConfig importProxy, without credentials
``no_proxy``
``IMPORTER_PROXY_AUTH_DIR``        the proxies' credentials, a mounted Secret (not CDI)
``IMPORTER_PULL_METHOD``           registry: pod | node
``IMPORTER_READY_FILE``            node pull: ``/shared/ready``, the holder's pid
``IMPORTER_DONE_FILE``             node pull: ``/shared/done``, created when the import ends
``IMPORTER_REGISTRY_IMAGE_ARCHITECTURE``  registry platform architecture
``IMPORTER_EXTRA_HEADER_<i>``      "Name: value", from http.extraHeaders
``IMPORTER_DISK_ID``               imageio disk id
``IMPORTER_UUID`` ``IMPORTER_BACKING_FILE`` ``IMPORTER_THUMBPRINT``  vddk
``CACHE_MODE``                     "TRYNONE": try O_DIRECT (set after an OOM kill)
``IMPORTER_METRICS_ADDR``          metrics bind address: the pod IP (downward API), when asked
``IMPORTER_METRICS_PORT``          metrics port, when not 8443
``IMPORTER_CHECKPOINT_ATTESTED``   "<offset>:<blake3>": the resume prefix the controller scraped
                                   from the previous attempt (not CDI; datapath.checkpoint)
``IMPORTER_GCS_ENDPOINT``          gcs: where gs:// URLs are read, CDIConfig spec.gcsEndpoint
                                   (not CDI; cdi.api.gcs); unset: Google's
=================================  =================================================

Two deliberate differences from CDI: basic-auth credentials are not env vars (CDI's
``IMPORTER_ACCESS_KEY_ID``/``IMPORTER_SECRET_KEY``); the Secret is mounted read-only at
``/var/run/cdi/auth`` and ``IMPORTER_ACCESS_KEY_ID_FILE`` / ``IMPORTER_SECRET_KEY_FILE`` name the
files. Secret extra headers are mounted at ``/extraheaders/<i>/`` as in CDI; each file's content
is one ``Name: value`` header. Likewise importProxy credentials never reach the env: the proxy
URLs lose their userinfo and ``cdi.render.proxy_auth`` renders it as a Secret mounted at
``/var/run/cdi/proxy-auth``. A GCS ``secretRef`` is mounted as CDI mounts it: its
``credentials.json`` (a service-account key) at ``/google``, ``GOOGLE_APPLICATION_CREDENTIALS``
naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cdi.api.config import CDIConfig, verification_requested
from cdi.api.constants import (
    ANN_BANDWIDTH_LIMIT,
    ANN_VERIFY,
    AUTH_SECRET_DIR,
    BLOCK_DEVICE_PATH,
    CACHE_MODE_TRY_NONE,
    CERT_DIR,
    DATA_MOUNT_PATH,
    EXTRA_HEADERS_DIR,
    GOOGLE_CREDENTIALS_DIR,
    GOOGLE_CREDENTIALS_KEY,
    IMPORT_SLOTS_RESOURCE,
    IMPORT_SOURCE_GCS,
    IMPORTER_CONTAINER_NAME,
    IMPORTER_EXTRA_HEADER_PREFIX,
    NODE_PULL_CONTAINER_NAME,
    NODE_PULL_HOLDER,
    NODE_PULL_SHARED_DIR,
    PROXY_AUTH_DIR,
    PROXY_CERT_DIR,
    SCRATCH_MOUNT_PATH,
    SECRET_KEY_ACCESS_KEY_ID,
    SECRET_KEY_SECRET_KEY,
    TERMINATION_LOG_PATH,
    TMP_DIR,
    ImporterEnv,
    VolumeMode,
)
from cdi.api.gcs import BadGcsEndpoint, parse_gcs_endpoint
from cdi.api.quantity import QuantityError, parse_rate
from cdi.api.types import DataVolume, resolve_volume_mode
from cdi.render import RenderError
from cdi.render.importer_env import SourceSettings, source_settings
from cdi.render.placement import pod_placement, requested_selector, selected_node
from cdi.render.proxy_auth import without_userinfo
from cdi.render.worker_pod import (
    WorkerPod,
    admission_fields,
    block_scratch_empty_dir,
    container_security_context,
    image_fields,
    metrics_env,
    metrics_ports,
    pod_security_context,
    worker_metadata,
    worker_resources,
)

DATA_VOLUME = "cdi-data-vol"
SCRATCH_VOLUME = "cdi-scratch-vol"
CERT_VOLUME = "cdi-cert-vol"
PROXY_CERT_VOLUME = "cdi-proxy-cert-vol"
AUTH_VOLUME = "cdi-auth-secret-vol"
GCS_AUTH_VOLUME = "cdi-gcs-secret-vol"  # the GCS secretRef: credentials.json only
PROXY_AUTH_VOLUME = "cdi-proxy-auth-vol"
TMP_VOLUME = "tmp"
SHARED_VOLUME = "cdi-shared-vol"  # node pull: the holder binary and the handshake files
HOLDER_INIT_NAME = "holder-init"
ARCH_LABEL = "kubernetes.io/arch"
# The holder needs nothing (a static loop of sleeps); keep the pod's footprint as CDI's.
HOLDER_RESOURCES = {
    "requests": {"cpu": "10m", "memory": "8Mi"},
    "limits": {"cpu": "100m", "memory": "32Mi"},
}
IMPORTER_COMPONENT = "importer"  # the pods' cdi.kubevirt.io label and name prefix


@dataclass(frozen=True)
class ImporterPodConfig(WorkerPod):
    """What the controller knows beyond the DataVolume: image, attempt, labels, metrics
    (``WorkerPod``), cluster config, scratch and retry state."""

    command: tuple[str, ...] = ("python", "-m", "importer")
    cdi_config: CDIConfig = field(default_factory=CDIConfig)
    scratch_pvc_name: str | None = None  # set once the importer asked for scratch space
    scratch_empty_dir: bool = False  # ... and no class for a scratch claim: the fallback
    proxy_ca_config_map: str | None = None  # the per-import copy of importProxy.trustedCAProxy
    proxy_auth_secret: str | None = None  # the per-import Secret of importProxy credentials
    direct_io: bool = False  # retry after an OOM kill with O_DIRECT
    checkpoint_attested: tuple[int, str] | None = None  # scraped from the previous attempt
    # CDIConfig maxConcurrentImportsPerNode is set: the importer requests one of the node's
    # import slots (``IMPORT_SLOTS_RESOURCE``), which the scheduler counts; a cron's poller not
    import_slot: bool = False


def render_importer_pod(
    dv: DataVolume, pvc: Mapping[str, Any], config: ImporterPodConfig
) -> dict[str, Any]:
    """The final importer pod for attempt ``config.attempt`` of ``dv`` writing into ``pvc``
    (the rendered or live claim): nothing is added to it after this returns."""
    settings = source_settings(dv, config.cdi_config)
    meta = pvc.get("metadata") or {}
    claim = str(meta.get("name") or dv.name)
    pvc_spec = pvc.get("spec") or {}
    block = resolve_volume_mode(pvc_spec.get("volumeMode")) == VolumeMode.BLOCK
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": worker_metadata(dv, pvc, IMPORTER_COMPONENT, config),
        "spec": _pod_spec(dv, claim, pvc_spec, block, settings, config, placement(dv, pvc, config)),
    }


def placement(dv: DataVolume, pvc: Mapping[str, Any], config: ImporterPodConfig) -> dict[str, Any]:
    """The workload placement, narrowed by the DataVolume's node selector annotation (on the
    DataVolume, or on the claim: a populator's prime carries its target's) and pinned to the
    claim's selected node (``cdi.render.placement``)."""
    claim_ann = (pvc.get("metadata") or {}).get("annotations") or {}
    labels = {**requested_selector(claim_ann), **requested_selector(dv.annotations)}
    return pod_placement(config.cdi_config.workload, labels, selected_node(pvc))


def _pod_spec(
    dv: DataVolume,
    claim: str,
    pvc_spec: Mapping[str, Any],
    block: bool,
    settings: SourceSettings,
    config: ImporterPodConfig,
    placed: Mapping[str, Any],
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [_container(dv, pvc_spec, block, settings, config)],
        "volumes": _volumes(claim, pvc_spec, block, settings, config),
    }
    spec.update(
        admission_fields(
            config.cdi_config, dv.spec.priority_class_name, dv.spec.service_account_name
        )
    )
    spec.update(placed)
    if settings.node_pull_image:
        _add_node_pull(spec, settings, config)
    return spec


def _add_node_pull(
    spec: dict[str, Any], settings: SourceSettings, config: ImporterPodConfig
) -> None:
    """The containerDisk beside the importer (see the module docstring)."""
    mount = {"name": SHARED_VOLUME, "mountPath": NODE_PULL_SHARED_DIR}
    spec["shareProcessNamespace"] = True
    spec["initContainers"] = [
        {
            "name": HOLDER_INIT_NAME,
            **image_fields(config),
            "args": ["install-holder", NODE_PULL_HOLDER],
            "resources": worker_resources(config.cdi_config),  # a Python process
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": container_security_context(),
            "volumeMounts": [mount],
        }
    ]
    server = {
        "name": NODE_PULL_CONTAINER_NAME,
        "image": settings.node_pull_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [NODE_PULL_HOLDER],
        "resources": HOLDER_RESOURCES,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": [mount],
    }
    spec["containers"] = [server, *spec["containers"]]
    spec["containers"][1]["volumeMounts"].append(dict(mount))
    spec["volumes"].append({"name": SHARED_VOLUME, "emptyDir": {}})
    if settings.node_arch:
        spec["nodeSelector"] = {**spec.get("nodeSelector", {}), ARCH_LABEL: settings.node_arch}


def _container(
    dv: DataVolume,
    pvc_spec: Mapping[str, Any],
    block: bool,
    settings: SourceSettings,
    config: ImporterPodConfig,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": IMPORTER_CONTAINER_NAME,
        **image_fields(config),
        "env": _env(dv, pvc_spec, block, settings, config),
        "ports": metrics_ports(config),
        "resources": _resources(config),
        "terminationMessagePath": TERMINATION_LOG_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": container_security_context(),
        "volumeMounts": _mounts(block, settings, config),
    }
    if block:
        container["volumeDevices"] = [{"name": DATA_VOLUME, "devicePath": BLOCK_DEVICE_PATH}]
    return container


def _resources(config: ImporterPodConfig) -> dict[str, Any]:
    """CDIConfig's worker resources, and with a per-node limit one import slot: an extended
    resource is never overcommitted, so its request and limit are the same."""
    resources = worker_resources(config.cdi_config)
    if config.import_slot:
        for kind in ("requests", "limits"):
            resources[kind] = {**(resources.get(kind) or {}), IMPORT_SLOTS_RESOURCE: "1"}
    return resources


def _env(
    dv: DataVolume,
    pvc_spec: Mapping[str, Any],
    block: bool,
    settings: SourceSettings,
    config: ImporterPodConfig,
) -> list[dict[str, Any]]:
    cdi = config.cdi_config
    size = ((pvc_spec.get("resources") or {}).get("requests") or {}).get("storage")
    if size is None:
        raise RenderError("target PVC has no storage request")
    preallocation = (
        dv.spec.preallocation if dv.spec.preallocation is not None else (cdi.preallocation)
    )
    overhead = "0" if block else cdi.filesystem_overhead(pvc_spec.get("storageClassName"))
    pairs: list[tuple[str, str | None]] = [
        (ImporterEnv.SOURCE, settings.source),
        (ImporterEnv.ENDPOINT, settings.endpoint),
        (ImporterEnv.CONTENT_TYPE, str(dv.spec.effective_content_type)),
        (ImporterEnv.IMAGE_SIZE, str(size)),
        (ImporterEnv.OWNER_UID, dv.uid),
        (ImporterEnv.FILESYSTEM_OVERHEAD, overhead),
        (ImporterEnv.PREALLOCATION, str(preallocation).lower()),
        (ImporterEnv.INSECURE_TLS, str(settings.insecure_tls).lower()),
        *settings.extra_env,
        *[(f"{IMPORTER_EXTRA_HEADER_PREFIX}{i}", h) for i, h in enumerate(settings.headers)],
        *_proxy_env(cdi, config),
        (ImporterEnv.CACHE_MODE, CACHE_MODE_TRY_NONE if config.direct_io else None),
        (ImporterEnv.CHECKPOINT_ATTESTED, _attested(config.checkpoint_attested)),
        (ImporterEnv.BANDWIDTH_LIMIT, _text(bandwidth_limit(dv, cdi))),
        (ImporterEnv.VERIFY, _verify(dv.annotations.get(ANN_VERIFY), cdi)),
    ]
    if settings.source == IMPORT_SOURCE_GCS:
        pairs.append((ImporterEnv.GCS_ENDPOINT, gcs_endpoint(cdi)))
    if settings.cert_config_map:
        pairs.append((ImporterEnv.CERT_DIR, CERT_DIR))
    if settings.secret_ref and settings.source == IMPORT_SOURCE_GCS:
        credentials = f"{GOOGLE_CREDENTIALS_DIR}/{GOOGLE_CREDENTIALS_KEY}"
        pairs.append((ImporterEnv.GOOGLE_APPLICATION_CREDENTIALS, credentials))
    elif settings.secret_ref:
        pairs += [
            (ImporterEnv.ACCESS_KEY_ID_FILE, f"{AUTH_SECRET_DIR}/{SECRET_KEY_ACCESS_KEY_ID}"),
            (ImporterEnv.SECRET_KEY_FILE, f"{AUTH_SECRET_DIR}/{SECRET_KEY_SECRET_KEY}"),
        ]
    env: list[dict[str, Any]] = [{"name": str(k), "value": v} for k, v in pairs if v is not None]
    return env + metrics_env(config, ImporterEnv.METRICS_ADDR, ImporterEnv.METRICS_PORT)


def _rate(text: str | None, where: str) -> int | None:
    try:
        return parse_rate(text)
    except QuantityError as exc:
        raise RenderError(f"{where} {exc}") from exc


def gcs_endpoint(cdi: CDIConfig) -> str | None:
    """CDIConfig ``spec.gcsEndpoint`` (not CDI): where this import reads ``gs://`` URLs, the
    operator's choice only (``cdi.api.gcs``); None: Google's. A bad value is a render error
    naming the field, so no importer starts with it."""
    text = cdi.spec.gcs_endpoint
    if not text:
        return None
    try:
        return parse_gcs_endpoint(text)
    except BadGcsEndpoint as exc:
        raise RenderError(f"CDIConfig spec.gcsEndpoint {exc}") from None


def bandwidth_limit(dv: DataVolume, cdi: CDIConfig) -> int | None:
    """The bytes per second this import's network source may read: CDIConfig's
    ``importBandwidthLimit``, lowered (never raised: a tenant cannot take more than its share)
    by the DataVolume's ``storage.import.bandwidthLimit`` annotation; None for no cap."""
    cluster = _rate(cdi.spec.import_bandwidth_limit, "CDIConfig spec.importBandwidthLimit")
    own = _rate(dv.annotations.get(ANN_BANDWIDTH_LIMIT), f"annotation {ANN_BANDWIDTH_LIMIT}")
    limits = [rate for rate in (cluster, own) if rate is not None]
    return min(limits) if limits else None


def _verify(annotation: str | None, cdi: CDIConfig) -> str | None:
    """IMPORTER_VERIFY: "true" for a verified volume (``verification_requested``), else unset."""
    return "true" if verification_requested(annotation, cdi.spec.verify_volumes) else None


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def _attested(pair: tuple[int, str] | None) -> str | None:
    return f"{pair[0]}:{pair[1]}" if pair else None


def _proxy_env(cdi: CDIConfig, config: ImporterPodConfig) -> list[tuple[str, str | None]]:
    proxy = cdi.import_proxy
    pairs: list[tuple[str, str | None]] = []
    if proxy is not None:
        pairs += [
            (ImporterEnv.HTTP_PROXY, without_userinfo(proxy.http_proxy)),
            (ImporterEnv.HTTPS_PROXY, without_userinfo(proxy.https_proxy)),
            (ImporterEnv.NO_PROXY, proxy.no_proxy or None),
        ]
    if config.proxy_ca_config_map:
        pairs.append((ImporterEnv.PROXY_CERT_DIR, PROXY_CERT_DIR))
    if config.proxy_auth_secret:
        pairs.append((ImporterEnv.PROXY_AUTH_DIR, PROXY_AUTH_DIR))
    return pairs


def _mounts(
    block: bool, settings: SourceSettings, config: ImporterPodConfig
) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [{"name": TMP_VOLUME, "mountPath": TMP_DIR}]
    if not block:
        mounts.append({"name": DATA_VOLUME, "mountPath": DATA_MOUNT_PATH})
    if config.scratch_pvc_name or config.scratch_empty_dir:
        mounts.append({"name": SCRATCH_VOLUME, "mountPath": SCRATCH_MOUNT_PATH})
    if settings.cert_config_map:
        mounts.append({"name": CERT_VOLUME, "mountPath": CERT_DIR, "readOnly": True})
    if config.proxy_ca_config_map:
        mounts.append({"name": PROXY_CERT_VOLUME, "mountPath": PROXY_CERT_DIR, "readOnly": True})
    if settings.secret_ref:
        gcs = settings.source == IMPORT_SOURCE_GCS
        name, where = (
            (GCS_AUTH_VOLUME, GOOGLE_CREDENTIALS_DIR) if gcs else (AUTH_VOLUME, AUTH_SECRET_DIR)
        )
        mounts.append({"name": name, "mountPath": where, "readOnly": True})
    if config.proxy_auth_secret:
        mounts.append({"name": PROXY_AUTH_VOLUME, "mountPath": PROXY_AUTH_DIR, "readOnly": True})
    for i, _ in enumerate(settings.secret_headers):
        mounts.append(
            {
                "name": f"cdi-secret-extra-headers-vol-{i}",
                "mountPath": f"{EXTRA_HEADERS_DIR}/{i}",
                "readOnly": True,
            }
        )
    return mounts


def _volumes(
    claim: str,
    pvc_spec: Mapping[str, Any],
    block: bool,
    settings: SourceSettings,
    config: ImporterPodConfig,
) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": DATA_VOLUME, "persistentVolumeClaim": {"claimName": claim}},
        {"name": TMP_VOLUME, "emptyDir": {}},
    ]
    if config.scratch_pvc_name:
        scratch = {"claimName": config.scratch_pvc_name}
        volumes.append({"name": SCRATCH_VOLUME, "persistentVolumeClaim": scratch})
    elif config.scratch_empty_dir:  # asked for, and no class for a claim (cdi.render.scratch)
        volumes.append(block_scratch_empty_dir(SCRATCH_VOLUME, pvc_spec))
    if settings.cert_config_map:
        volumes.append({"name": CERT_VOLUME, "configMap": {"name": settings.cert_config_map}})
    if config.proxy_ca_config_map:
        proxy_ca = {"name": config.proxy_ca_config_map}
        volumes.append({"name": PROXY_CERT_VOLUME, "configMap": proxy_ca})
    if config.proxy_auth_secret:
        proxy_auth = {"secretName": config.proxy_auth_secret, "defaultMode": 0o440}
        volumes.append({"name": PROXY_AUTH_VOLUME, "secret": proxy_auth})
    return volumes + _secret_volumes(settings)


def _secret_volumes(settings: SourceSettings) -> list[dict[str, Any]]:
    """Credentials and secret headers as read-only files, never as environment variables."""
    volumes: list[dict[str, Any]] = []
    if settings.secret_ref:
        keys: tuple[str, ...]
        name, keys = AUTH_VOLUME, (SECRET_KEY_ACCESS_KEY_ID, SECRET_KEY_SECRET_KEY)
        if settings.source == IMPORT_SOURCE_GCS:  # CDI: the service-account key at /google
            name, keys = GCS_AUTH_VOLUME, (GOOGLE_CREDENTIALS_KEY,)
        auth = {
            "secretName": settings.secret_ref,
            "defaultMode": 0o440,
            "items": [{"key": k, "path": k} for k in keys],
        }
        volumes.append({"name": name, "secret": auth})
    for i, name in enumerate(settings.secret_headers):
        header = {"secretName": name, "defaultMode": 0o440}
        volumes.append({"name": f"cdi-secret-extra-headers-vol-{i}", "secret": header})
    return volumes
