"""Names shared by every layer: API group, phases, conditions, annotations, labels, paths, env.

These strings are CDI's wire contract. A user who knows CDI reads the same phases in
``kubectl get dv``, sets the same annotations on a DataVolume, and finds the same files in the
importer pod. Keeping them in one stdlib-only module lets the workers (importer, uploader,
cloner), the renderers, the webhooks and the reconcilers agree without importing each other.

Where we deliberately differ from CDI the constant says so in a comment.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

# --- API group -------------------------------------------------------------------------------

GROUP: Final = "cdi.kubevirt.io"
VERSION: Final = "v1beta1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND_DATAVOLUME: Final = "DataVolume"
KIND_STORAGEPROFILE: Final = "StorageProfile"
KIND_CDICONFIG: Final = "CDIConfig"
KIND_DATASOURCE: Final = "DataSource"
CDICONFIG_NAME: Final = "config"  # the cluster singleton


class Phase(StrEnum):
    """Every DataVolume phase CDI defines (``API/types.go``), in CDI's spelling.

    This project sets Pending, WaitForFirstConsumer, PVCBound, ImportScheduled,
    ImportInProgress, Succeeded and Failed; the others exist so status written by CDI (or by a
    later upload/clone controller) parses.
    """

    UNSET = ""
    PENDING = "Pending"
    PVC_BOUND = "PVCBound"
    IMPORT_SCHEDULED = "ImportScheduled"
    IMPORT_IN_PROGRESS = "ImportInProgress"
    CLONE_SCHEDULED = "CloneScheduled"
    CLONE_IN_PROGRESS = "CloneInProgress"
    SNAPSHOT_FOR_SMART_CLONE_IN_PROGRESS = "SnapshotForSmartCloneInProgress"
    CLONE_FROM_SNAPSHOT_SOURCE_IN_PROGRESS = "CloneFromSnapshotSourceInProgress"
    SMART_CLONE_PVC_IN_PROGRESS = "SmartClonePVCInProgress"
    CSI_CLONE_IN_PROGRESS = "CSICloneInProgress"
    EXPANSION_IN_PROGRESS = "ExpansionInProgress"
    NAMESPACE_TRANSFER_IN_PROGRESS = "NamespaceTransferInProgress"
    UPLOAD_SCHEDULED = "UploadScheduled"
    UPLOAD_READY = "UploadReady"
    WAIT_FOR_FIRST_CONSUMER = "WaitForFirstConsumer"
    PENDING_POPULATION = "PendingPopulation"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"
    PAUSED = "Paused"
    PREP_CLAIM_IN_PROGRESS = "PrepClaimInProgress"
    REBIND_IN_PROGRESS = "RebindInProgress"


class ConditionType(StrEnum):
    READY = "Ready"
    BOUND = "Bound"
    RUNNING = "Running"
    VERIFIED = "Verified"  # not CDI (issue 28): only on a DataVolume that asked for it


class ConditionStatus(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionReason(StrEnum):
    """Condition and event reasons CDI uses (``conditions.go``, ``doc/metrics.md``)."""

    BOUND = "Bound"
    PENDING = "Pending"
    CLAIM_LOST = "ClaimLost"
    NOT_FOUND = "NotFound"
    TRANSFER_RUNNING = "TransferRunning"
    COMPLETED = "Completed"
    ERROR = "Error"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    SCRATCH_SPACE_REQUIRED = "Scratch space required"
    CHECKSUM_ERROR = "ChecksumError"
    UNSCHEDULABLE = "Unschedulable"
    CREATING_SCRATCH_SPACE = "CreatingScratchSpace"
    ERR_CLAIM_NOT_VALID = "ErrClaimNotValid"
    ERR_CLAIM_LOST = "ErrClaimLost"
    ERR_RESOURCE_EXISTS = "ErrResourceExists"
    ERR_EXCEEDED_QUOTA = "ErrExceededQuota"
    ERR_STARTING_POD = "ErrStartingPod"
    ERR_IMPORT_FAILED = "ErrImportFailed"
    IMPORT_SCHEDULED = "ImportScheduled"
    IMPORT_IN_PROGRESS = "ImportInProgress"
    IMPORT_SUCCEEDED = "ImportSucceeded"
    IMPORT_FAILED = "ImportFailed"
    IMPORT_TARGET_IN_USE = "ImportTargetInUse"


PROGRESS_NOT_AVAILABLE: Final = "N/A"
PROGRESS_COMPLETE: Final = "100.0%"


class ContentType(StrEnum):
    """What the bytes a worker receives are, and so how the data path treats them.

    The one definition for the control plane and the workers. A DataVolume may ask only for
    ``kubevirt`` or ``archive`` (``DATAVOLUME_CONTENT_TYPES``); the clone envelopes are what a
    clone source pod sends its target: ``blockdevice-clone`` is a block volume's bytes as they
    are (never sniffed or decoded), ``filesystem-clone`` a tar of a filesystem volume, and
    ``blockdevice-clone-sparse`` (ours) the same bytes as data extents only
    (``datapath.decode.sparseraw``), what our cloner sends so zero runs never travel.
    """

    KUBEVIRT = "kubevirt"
    ARCHIVE = "archive"
    BLOCKDEVICE_CLONE = "blockdevice-clone"
    FILESYSTEM_CLONE = "filesystem-clone"
    BLOCKDEVICE_CLONE_SPARSE = "blockdevice-clone-sparse"


# The content types a DataVolume's spec.contentType accepts (CDI's API); the others are the
# workers' own.
DATAVOLUME_CONTENT_TYPES: Final = (ContentType.KUBEVIRT, ContentType.ARCHIVE)


class VolumeMode(StrEnum):
    FILESYSTEM = "Filesystem"
    BLOCK = "Block"
    # Only valid in ``spec.storage.volumeMode``: "ask the StorageProfile".
    FROM_STORAGE_PROFILE = "FromStorageProfile"


class AccessMode(StrEnum):
    READ_WRITE_ONCE = "ReadWriteOnce"
    READ_ONLY_MANY = "ReadOnlyMany"
    READ_WRITE_MANY = "ReadWriteMany"
    READ_WRITE_ONCE_POD = "ReadWriteOncePod"


class SourceKind(StrEnum):
    """Members of ``spec.source``, in CDI's JSON spelling."""

    HTTP = "http"
    S3 = "s3"
    GCS = "gcs"
    REGISTRY = "registry"
    PVC = "pvc"
    UPLOAD = "upload"
    BLANK = "blank"
    IMAGEIO = "imageio"
    VDDK = "vddk"
    SNAPSHOT = "snapshot"


class RegistryPullMethod(StrEnum):
    POD = "pod"
    NODE = "node"


REGISTRY_SCHEMES: Final = ("docker", "oci-archive")
SOURCE_REF_KIND_DATASOURCE: Final = KIND_DATASOURCE
CHECKSUM_ALGORITHMS: Final = {"md5": 32, "sha1": 40, "sha256": 64, "sha512": 128}

# --- Sizes -----------------------------------------------------------------------------------

MIB: Final = 1024 * 1024
MIN_VOLUME_SIZE: Final = MIB  # KubeVirt cannot use disks under 1 MiB; CDI rejects them.
DEFAULT_FILESYSTEM_OVERHEAD: Final = "0.06"  # CDI pkg/common DefaultGlobalOverhead
MAX_NAME_LENGTH: Final = 253  # DNS-1123 subdomain
MAX_LABEL_LENGTH: Final = 63  # DNS-1035/1123 label

# --- Annotations (all cdi.kubevirt.io/...) ------------------------------------------------------

_A = "cdi.kubevirt.io/"
# CDIConfig spec.featureGates the product reads (CDI's pkg/feature-gates).
GATE_CLAIM_ADOPTION: Final = "DataVolumeClaimAdoption"
# User-facing, set on the DataVolume.
ANN_IMMEDIATE_BINDING: Final = _A + "storage.bind.immediate.requested"
ANN_USE_POPULATOR: Final = _A + "storage.usePopulator"
ANN_RETAIN_AFTER_COMPLETION: Final = _A + "storage.pod.retainAfterCompletion"
ANN_PRE_POPULATED: Final = _A + "storage.prePopulated"
ANN_POPULATED_FOR: Final = _A + "storage.populatedFor"
ANN_CHECK_STATIC_VOLUME: Final = _A + "storage.checkStaticVolume"
# On the claim of a checkStaticVolume DataVolume: the pre-bound volumes it may bind (JSON list)
ANN_PERSISTENT_VOLUME_LIST: Final = _A + "storage.persistentVolumeList"
ANN_ALLOW_CLAIM_ADOPTION: Final = _A + "allowClaimAdoption"
ANN_DELETE_AFTER_COMPLETION: Final = _A + "storage.deleteAfterCompletion"
ANN_PERMISSIVE_CLONE: Final = _A + "permissiveClone"
ANN_CLONE_TOKEN: Final = _A + "storage.clone.token"
ANN_EXTENDED_CLONE_TOKEN: Final = _A + "storage.extended.clone.token"
# Not CDI: CDI authorizes clones at admission and keeps only a signed token. We also record who
# asked, so the controller can re-run the SubjectAccessReview later (reference §4.5). The
# mutating webhook owns these keys: users cannot set or change them.
ANN_REQUESTER_USERNAME: Final = _A + "storage.requester.username"
ANN_REQUESTER_GROUPS: Final = _A + "storage.requester.groups"

# Internal, written on the PVC by the DataVolume controller.
ANN_CREATED_FOR_DATAVOLUME: Final = _A + "createdForDataVolume"
ANN_CONTENT_TYPE: Final = _A + "storage.contentType"
ANN_POD_RESTARTS: Final = _A + "storage.pod.restarts"
ANN_POD_PHASE: Final = _A + "storage.pod.phase"
ANN_POD_READY: Final = _A + "storage.pod.ready"
ANN_PRIORITY_CLASS: Final = _A + "storage.pod.priorityclassname"
ANN_SERVICE_ACCOUNT: Final = _A + "storage.pod.serviceAccountName"
ANN_PREALLOCATION_REQUESTED: Final = _A + "storage.preallocation.requested"
ANN_PREALLOCATION_APPLIED: Final = _A + "storage.preallocation"
ANN_SOURCE: Final = _A + "storage.import.source"
ANN_ENDPOINT: Final = _A + "storage.import.endpoint"
ANN_SECRET: Final = _A + "storage.import.secretName"
ANN_CERT_CONFIG_MAP: Final = _A + "storage.import.certConfigMap"
ANN_CHECKSUM: Final = _A + "storage.import.checksum"
ANN_INSECURE_SKIP_VERIFY: Final = _A + "storage.import.insecureSkipVerify"
ANN_REGISTRY_IMPORT_METHOD: Final = _A + "storage.import.registryImportMethod"
ANN_REGISTRY_ARCHITECTURE: Final = _A + "storage.import.registryImageArchitecture"
ANN_IMPORT_POD_NAME: Final = _A + "storage.import.importPodName"
ANN_REQUIRES_SCRATCH: Final = _A + "storage.import.requiresScratch"
ANN_REQUIRES_DIRECT_IO: Final = _A + "storage.import.requiresDirectIo"
ANN_FATAL_ERROR: Final = _A + "storage.import.fatalError"
# Not CDI (issue 28): the DataVolume's own bandwidth cap, a quantity of bytes per second; it
# lowers CDIConfig's spec.importBandwidthLimit for this import, never raises it.
ANN_BANDWIDTH_LIMIT: Final = _A + "storage.import.bandwidthLimit"
# Not CDI (issue 28): "true" asks the worker to read the volume back after it is filled and
# compare it with what it wrote (datapath.verify); CDIConfig spec.verifyVolumes asks for every
# volume. The result is the claim record's ANN_VERIFICATION and the DataVolume's Verified
# condition.
ANN_VERIFY: Final = _A + "storage.verify"
ANN_VERIFICATION: Final = _A + "storage.verification"
ANN_MINIMUM_SUPPORTED_PVC_SIZE: Final = _A + "minimumSupportedPvcSize"  # on StorageProfile
# Upload: on the PVC (the upload proxy reads them; the upload flavour writes them).
ANN_UPLOAD_REQUEST: Final = _A + "storage.upload.target"
ANN_PVC_PRIME_NAME: Final = _A + "storage.populator.pvcPrime"
# Volume populators (VolumeImportSource ...): on the target PVC and on its prime PVC.
ANN_POPULATOR_PROGRESS: Final = _A + "storage.populator.progress"
ANN_POPULATOR_KIND: Final = _A + "storage.populator.kind"
# Not CDI: the populator source's spec, copied onto the prime when it is created, so deleting
# the source object mid-population changes nothing.
ANN_POPULATOR_SOURCE: Final = _A + "storage.populator.source"
KIND_VOLUME_IMPORT_SOURCE: Final = "VolumeImportSource"
ANN_SELECTED_NODE: Final = "volume.kubernetes.io/selected-node"
KIND_VOLUME_UPLOAD_SOURCE: Final = "VolumeUploadSource"
KIND_VOLUME_CLONE_SOURCE: Final = "VolumeCloneSource"

# Source values of ANN_SOURCE (and of the importer's IMPORTER_SOURCE).
IMPORT_SOURCE_HTTP: Final = "http"
IMPORT_SOURCE_S3: Final = "s3"
IMPORT_SOURCE_GCS: Final = "gcs"
IMPORT_SOURCE_REGISTRY: Final = "registry"
IMPORT_SOURCE_IMAGEIO: Final = "imageio"
IMPORT_SOURCE_VDDK: Final = "vddk"
IMPORT_SOURCE_NONE: Final = "none"  # blank

# Annotations copied from the DataVolume to worker pods (CDI's allow-list), with defaults.
POD_ANNOTATION_DEFAULTS: Final = {
    "sidecar.istio.io/inject": "false",
    "linkerd.io/inject": "disabled",
}
POD_ANNOTATION_ALLOW_LIST: Final = (
    "k8s.v1.cni.cncf.io/networks",
    "v1.multus-cni.io/default-network",
    "sidecar.istio.io/inject",
    "linkerd.io/inject",
)

# --- Labels ----------------------------------------------------------------------------------

LABEL_APP: Final = "app"
LABEL_APP_VALUE: Final = "containerized-data-importer"
LABEL_COMPONENT: Final = GROUP  # "cdi.kubevirt.io": "importer"
LABEL_PROMETHEUS: Final = "prometheus.cdi.kubevirt.io"
LABEL_KUBE_PV_FILLING_UP: Final = "alerts.k8s.io/KubePersistentVolumeFillingUp"
LABEL_EXCLUDE_FROM_BACKUP: Final = "velero.io/exclude-from-backup"

# --- Worker pod contract: paths, ports, identity ------------------------------------------------

DATA_MOUNT_PATH: Final = "/data"
DISK_IMAGE_PATH: Final = "/data/disk.img"
BLOCK_DEVICE_PATH: Final = "/dev/cdi-block-volume"
SCRATCH_MOUNT_PATH: Final = "/scratch"
CERT_DIR: Final = "/certs"
PROXY_CERT_DIR: Final = "/proxycerts/"
EXTRA_HEADERS_DIR: Final = "/extraheaders"
# Not CDI (CDI passes basic-auth credentials as secretKeyRef env vars): we mount the Secret.
AUTH_SECRET_DIR: Final = "/var/run/cdi/auth"
GOOGLE_CREDENTIALS_DIR: Final = "/google"  # CDI: the GCS secretRef mounted here
GOOGLE_CREDENTIALS_KEY: Final = "credentials.json"  # its key: a service-account key file
# Not CDI (CDI puts importProxy URLs, credentials included, into env): the proxies' userinfo
# comes from a per-import Secret mounted here, keys "http" and "https" ("user:password").
PROXY_AUTH_DIR: Final = "/var/run/cdi/proxy-auth"
SECRET_KEY_PROXY_HTTP: Final = "http"
SECRET_KEY_PROXY_HTTPS: Final = "https"
TMP_DIR: Final = "/tmp"
TERMINATION_LOG_PATH: Final = "/dev/termination-log"
METRICS_PORT: Final = 8443
METRICS_PORT_NAME: Final = "metrics"
IMPORTER_CONTAINER_NAME: Final = "importer"
# Node pull (registry pullMethod: node): the containerDisk runs as the pod's "server" container
# (CDI's name) with the static holder an init container copies into the shared emptyDir.
NODE_PULL_CONTAINER_NAME: Final = "server"
NODE_PULL_SHARED_DIR: Final = "/shared"
NODE_PULL_HOLDER: Final = "/shared/cdi-holder"
# Not CDI (issue 28, CDIConfig maxConcurrentImportsPerNode): the extended resource the controller
# advertises in each node's status and every importer pod requests one of, so the scheduler
# keeps at most that many importers on a node (cdi/controller/nodeslots.py).
IMPORT_SLOTS_RESOURCE: Final = "cdi.kubevirt.io/import-slots"
QEMU_UID: Final = 107  # qemu user/group in KubeVirt images; disk.img is 0660 group 107
SECRET_KEY_ACCESS_KEY_ID: Final = "accessKeyId"
SECRET_KEY_SECRET_KEY: Final = "secretKey"

# --- Importer environment (CDI's names, pkg/controller/import-controller.go makeImportEnv) ------


class ImporterEnv(StrEnum):
    SOURCE = "IMPORTER_SOURCE"
    ENDPOINT = "IMPORTER_ENDPOINT"
    CONTENT_TYPE = "IMPORTER_CONTENTTYPE"
    IMAGE_SIZE = "IMPORTER_IMAGE_SIZE"
    OWNER_UID = "OWNER_UID"
    FILESYSTEM_OVERHEAD = "FILESYSTEM_OVERHEAD"
    INSECURE_TLS = "INSECURE_TLS"
    DISK_ID = "IMPORTER_DISK_ID"
    UUID = "IMPORTER_UUID"
    PULL_METHOD = "IMPORTER_PULL_METHOD"
    READY_FILE = "IMPORTER_READY_FILE"
    METRICS_ADDR = "IMPORTER_METRICS_ADDR"  # not CDI: the metrics bind address (pod IP)
    METRICS_PORT = "IMPORTER_METRICS_PORT"  # not CDI: when not 8443
    DONE_FILE = "IMPORTER_DONE_FILE"
    BACKING_FILE = "IMPORTER_BACKING_FILE"
    THUMBPRINT = "IMPORTER_THUMBPRINT"
    HTTP_PROXY = "http_proxy"
    HTTPS_PROXY = "https_proxy"
    NO_PROXY = "no_proxy"
    CURRENT_CHECKPOINT = "IMPORTER_CURRENT_CHECKPOINT"
    PREVIOUS_CHECKPOINT = "IMPORTER_PREVIOUS_CHECKPOINT"
    FINAL_CHECKPOINT = "IMPORTER_FINAL_CHECKPOINT"
    PREALLOCATION = "PREALLOCATION"
    CACHE_MODE = "CACHE_MODE"
    REGISTRY_IMAGE_ARCHITECTURE = "IMPORTER_REGISTRY_IMAGE_ARCHITECTURE"
    CHECKSUM = "IMPORTER_CHECKSUM"
    CERT_DIR = "IMPORTER_CERT_DIR"
    PROXY_CERT_DIR = "IMPORTER_PROXY_CERT_DIR"
    GOOGLE_APPLICATION_CREDENTIALS = "GOOGLE_APPLICATION_CREDENTIALS"
    # Not CDI: CDI sets IMPORTER_ACCESS_KEY_ID / IMPORTER_SECRET_KEY from a secretKeyRef. We mount
    # the Secret and pass the file paths, so credentials never sit in the process environment.
    ACCESS_KEY_ID_FILE = "IMPORTER_ACCESS_KEY_ID_FILE"
    SECRET_KEY_FILE = "IMPORTER_SECRET_KEY_FILE"
    # Not CDI: the import network policy (cdi.api.netpolicy), comma-separated CIDRs. Restricted
    # ranges the operator allows (CDIConfig spec.importPolicy.allowedSourceCIDRs), and the
    # cluster's pod/service/node ranges (controller flag --cluster-cidr), refused unless allowed.
    PROXY_AUTH_DIR = "IMPORTER_PROXY_AUTH_DIR"
    ALLOWED_SOURCE_CIDRS = "IMPORTER_ALLOWED_SOURCE_CIDRS"
    CLUSTER_CIDRS = "IMPORTER_CLUSTER_CIDRS"
    # Not CDI: "<offset>:<blake3 hex>", the resume prefix the controller attests (checkpoint.py)
    CHECKPOINT_ATTESTED = "IMPORTER_CHECKPOINT_ATTESTED"
    # Not CDI: bytes per second a network source may read at most (issue 28, throttle.py)
    BANDWIDTH_LIMIT = "IMPORTER_BANDWIDTH_LIMIT"
    # Not CDI: "true" reads the target back after the import and compares (issue 28, verify.py)
    VERIFY = "IMPORTER_VERIFY"
    # Not CDI (issue 27): where gs:// URLs are read, CDIConfig spec.gcsEndpoint
    # (http(s)://host[:port]); unset: https://storage.googleapis.com. Google's libraries read
    # STORAGE_EMULATOR_HOST, which the importer also takes (a CLI user's); this one wins.
    GCS_ENDPOINT = "IMPORTER_GCS_ENDPOINT"
    # Not CDI: a DataImportCron poller of an HTTP image or a release stream (importer/poll.py):
    # "http" or "stream"; the checksum file beside the image; the stream's architecture and
    # artifact (cdi.api.releasestream).
    POLL = "IMPORTER_POLL"
    POLL_CHECKSUM_FILE = "IMPORTER_POLL_CHECKSUM_FILE"
    POLL_STREAM_ARCHITECTURE = "IMPORTER_POLL_STREAM_ARCHITECTURE"
    POLL_STREAM_ARTIFACT = "IMPORTER_POLL_STREAM_ARTIFACT"
    # Not CDI's variable (CDI runs /usr/bin/cdi-image-size-detection -image-path ...): the
    # importer measures this image's virtual size instead of importing (clone size detection,
    # importer/size_detection.py); args are not the controller's to set (admission policy N9).
    SIZE_DETECTION_PATH = "IMPORTER_SIZE_DETECTION_PATH"


IMPORTER_EXTRA_HEADER_PREFIX: Final = "IMPORTER_EXTRA_HEADER_"  # + index: "Name: value"
CACHE_MODE_TRY_NONE: Final = "TRYNONE"
