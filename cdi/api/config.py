"""Cluster-scoped configuration kinds: ``StorageProfile`` (one per StorageClass) and ``CDIConfig``.

The renderers read these to complete a ``spec.storage`` claim (access and volume modes from the
profile, filesystem overhead from the config) and to size and configure worker pods. Shapes are
CDI's; the helpers answer the questions the renderers ask, in CDI's precedence order, so the
rule lives in one place: status (what the controller computed) over spec (what a user asked),
per-StorageClass over global, and CDI's defaults when neither says anything.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cdi.api.codec import ApiObject, api_field
from cdi.api.constants import (
    ANN_MINIMUM_SUPPORTED_PVC_SIZE,
    DEFAULT_FILESYSTEM_OVERHEAD,
)
from cdi.api.quantity import Quantity, QuantityError
from cdi.api.tlsprofile import TLSProfile
from cdi.api.tlsprofile import select as select_tls_profile
from cdi.api.types import Condition, ObjectMeta, ResourceRequirements

# --- StorageProfile --------------------------------------------------------------------------


@dataclass(frozen=True)
class ClaimPropertySet(ApiObject):
    access_modes: tuple[str, ...] = ()
    volume_mode: str | None = None


@dataclass(frozen=True)
class StorageProfileSpec(ApiObject):
    clone_strategy: str | None = None  # copy | snapshot | csi-clone
    claim_property_sets: tuple[ClaimPropertySet, ...] = ()
    data_import_cron_source_format: str | None = None  # pvc | snapshot
    snapshot_class: str | None = None


@dataclass(frozen=True)
class StorageProfileStatus(ApiObject):
    storage_class: str | None = None
    provisioner: str | None = None
    clone_strategy: str | None = None
    claim_property_sets: tuple[ClaimPropertySet, ...] = ()
    data_import_cron_source_format: str | None = None
    snapshot_class: str | None = None
    conditions: tuple[Condition, ...] = ()  # Recognized: is the provisioner in the known table


@dataclass(frozen=True)
class StorageProfile(ApiObject):
    """Named after its StorageClass; status holds the effective (computed) values."""

    metadata: ObjectMeta = dataclasses.field(default_factory=ObjectMeta)
    spec: StorageProfileSpec = dataclasses.field(default_factory=StorageProfileSpec)
    status: StorageProfileStatus | None = None

    @property
    def storage_class(self) -> str:
        if self.status and self.status.storage_class:
            return self.status.storage_class
        return self.metadata.name

    @property
    def claim_property_sets(self) -> tuple[ClaimPropertySet, ...]:
        if self.status and self.status.claim_property_sets:
            return self.status.claim_property_sets
        return self.spec.claim_property_sets

    @property
    def minimum_supported_pvc_size(self) -> Quantity | None:
        raw = self.metadata.annotations.get(ANN_MINIMUM_SUPPORTED_PVC_SIZE)
        if not raw:
            return None
        try:
            return Quantity.parse(raw)
        except QuantityError:
            return None  # a bad annotation must not block every import on the class


# --- CDIConfig -------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilesystemOverhead(ApiObject):
    """Fractions in ``[0, 1)`` as strings (``"0.06"``), global and per StorageClass."""

    global_: str | None = api_field(json="global")
    storage_class: dict[str, str] = dataclasses.field(default_factory=dict)

    def for_storage_class(self, name: str | None) -> str | None:
        if name and name in self.storage_class:
            return self.storage_class[name]
        return self.global_


@dataclass(frozen=True)
class ImportProxy(ApiObject):
    http_proxy: str | None = api_field(json="HTTPProxy")
    https_proxy: str | None = api_field(json="HTTPSProxy")
    no_proxy: str | None = None
    # ConfigMap name in the CDI namespace (CDI spells it trustedCAProxy)
    trusted_ca_proxy: str | None = api_field(json="trustedCAProxy")


@dataclass(frozen=True)
class ImportPolicy(ApiObject):
    """Not in CDI (upstream has only a proposal, ``allowedSourceURLs``): which restricted
    network ranges imports may reach. Addresses, not URLs, because a name may resolve anywhere;
    the importer checks every address it connects to (``cdi.api.netpolicy``). Loopback,
    private, CGNAT, ULA, multicast and the cluster's own ranges are refused unless listed here;
    metadata and link-local addresses are refused whatever is listed."""

    allowed_source_cidrs: tuple[str, ...] = api_field(json="allowedSourceCIDRs", default=())
    # The cluster's pod, service and node ranges: refused even when public, unless allowed.
    # The controller's ``--cluster-cidr`` flags add to these.
    cluster_cidrs: tuple[str, ...] = api_field(json="clusterCIDRs", default=())


@dataclass(frozen=True)
class LocalObjectReference(ApiObject):
    name: str = ""


@dataclass(frozen=True)
class CustomTLSProfile(ApiObject):
    ciphers: tuple[str, ...] = ()
    min_tls_version: str | None = api_field(json="minTLSVersion")


@dataclass(frozen=True)
class TLSSecurityProfile(ApiObject):
    """OpenShift's shape, as CDI takes it; ``cdi.api.tlsprofile.select`` decides."""

    type: str | None = None
    custom: CustomTLSProfile | None = None


@dataclass(frozen=True)
class CDIConfigSpec(ApiObject):
    upload_proxy_url_override: str | None = api_field(json="uploadProxyURLOverride")
    import_proxy: ImportProxy | None = None
    scratch_space_storage_class: str | None = None
    pod_resource_requirements: ResourceRequirements | None = None
    feature_gates: tuple[str, ...] = ()
    filesystem_overhead: FilesystemOverhead | None = None
    preallocation: bool | None = None
    insecure_registries: tuple[str, ...] = ()
    data_volume_ttl_seconds: int | None = api_field(json="dataVolumeTTLSeconds")
    image_pull_secrets: tuple[LocalObjectReference, ...] = ()
    log_verbosity: int | None = None
    webhook_pvc_rendering: str | None = None
    import_policy: ImportPolicy | None = None
    tls_security_profile: TLSSecurityProfile | None = None
    # Not CDI (issue 28): bytes per second every import's network source may read at most
    import_bandwidth_limit: str | None = None
    # Not CDI (issue 28): importer pods alive at once, cluster-wide; None or 0: no limit
    max_concurrent_imports: int | None = None
    # Not CDI (issue 28): every import, upload and clone reads its volume back and compares
    verify_volumes: bool | None = None
    # Not CDI (issue 27): the GCS endpoint gs:// URLs are read from (http(s)://host[:port]);
    # None: Google's. The operator's: a tenant's URL never chooses it
    gcs_endpoint: str | None = None
    # Not CDI (issue 28): importer pods on one node at once, kept by the scheduler through the
    # extended resource cdi.kubevirt.io/import-slots; None or 0: no limit
    max_concurrent_imports_per_node: int | None = None


@dataclass(frozen=True)
class NodePlacement(ApiObject):
    """CDI's ``NodePlacement`` (the CDI resource's ``workload``, and ``infra``'s inline part):
    what the scheduler sees of a pod. ``affinity`` and each toleration are Kubernetes' own
    shapes, kept as the API server validated them (the CRD checks their structure)."""

    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    affinity: Any = None
    tolerations: tuple[Any, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.node_selector or self.affinity or self.tolerations)


@dataclass(frozen=True)
class CertConfig(ApiObject):
    """One certificate kind's ``duration`` and ``renewBefore`` (Go durations: ``48h``,
    ``1h30m0s``), as the CDI resource's ``certConfig.ca`` / ``.server`` / ``.client``."""

    duration: str | None = None
    renew_before: str | None = None


@dataclass(frozen=True)
class CDICertConfig(ApiObject):
    ca: CertConfig | None = None
    server: CertConfig | None = None
    client: CertConfig | None = None


@dataclass(frozen=True)
class CDIConfigStatus(ApiObject):
    upload_proxy_url: str | None = api_field(json="uploadProxyURL")
    upload_proxy_ca: str | None = api_field(json="uploadProxyCA")
    import_proxy: ImportProxy | None = None
    scratch_space_storage_class: str | None = None
    default_pod_resource_requirements: ResourceRequirements | None = None
    filesystem_overhead: FilesystemOverhead | None = None
    preallocation: bool | None = None
    image_pull_secrets: tuple[LocalObjectReference, ...] = ()
    # Not in CDI's CDIConfig: what the CDI resource (cdi.api.cdiresource) sets for the whole
    # product, copied here by the CDIConfig reconciler so every renderer reads one object
    workload: NodePlacement | None = None
    clone_strategy_override: str | None = None
    cert_config: CDICertConfig | None = None


def parse_go_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``, with unparsable text meaning False (as CDI ignores the error)."""
    return text in ("1", "t", "T", "TRUE", "true", "True")


def claim_adoption_allowed(annotation: str | None, gate: Callable[[], bool]) -> bool:
    """CDI's ``AllowClaimAdoption``: a DataVolume may take over an existing claim of its name
    when its ``allowClaimAdoption`` annotation says so (present, it decides), else when the
    ``DataVolumeClaimAdoption`` gate is on (``gate``, asked only then). The webhook admits and
    the controller adopts by this one rule, so nothing admitted stalls."""
    if annotation is not None:
        return parse_go_bool(annotation)
    return gate()


def verification_requested(annotation: str | None, cluster: bool | None) -> bool:
    """Whether a volume is read back and compared after it is filled (``datapath.verify``):
    CDIConfig ``spec.verifyVolumes`` asks for every volume (a DataVolume cannot opt out of the
    administrator's choice), else the DataVolume's ``cdi.kubevirt.io/storage.verify``
    annotation (Go's boolean spellings, as CDI reads its annotations)."""
    return bool(cluster) or (annotation is not None and parse_go_bool(annotation))


def log_level_for(verbosity: int) -> int:
    """CDI's ``logVerbosity`` (klog's ``-v``) as a ``logging`` level.

    CDI's components run at 1 and log their routine progress at V(1), details at V(3) and
    above. Our INFO lines are that routine progress, so: 0 (and below) keeps only warnings and
    errors, 1 and 2 show INFO too, 3 and up add DEBUG.
    """
    if verbosity <= 0:
        return logging.WARNING
    if verbosity < 3:
        return logging.INFO
    return logging.DEBUG


DEFAULT_POD_RESOURCES = ResourceRequirements(
    requests={"cpu": Quantity.parse("100m"), "memory": Quantity.parse("60M")},
    limits={"cpu": Quantity.parse("750m"), "memory": Quantity.parse("600M")},
)
"""CDI's defaults for worker pods (``config-controller.go``)."""


@dataclass(frozen=True)
class CDIConfig(ApiObject):
    """The cluster singleton ``config``. An absent object behaves like ``CDIConfig()``."""

    metadata: ObjectMeta = dataclasses.field(default_factory=ObjectMeta)
    spec: CDIConfigSpec = dataclasses.field(default_factory=CDIConfigSpec)
    status: CDIConfigStatus | None = None

    def filesystem_overhead(self, storage_class: str | None) -> str:
        """Overhead fraction for a class: status, then spec, per class then global, then 0.06."""
        for source in (
            self.status.filesystem_overhead if self.status else None,
            self.spec.filesystem_overhead,
        ):
            value = source.for_storage_class(storage_class) if source else None
            if value:
                return value
        return DEFAULT_FILESYSTEM_OVERHEAD

    @property
    def pod_resources(self) -> ResourceRequirements:
        if self.status and self.status.default_pod_resource_requirements:
            return self.status.default_pod_resource_requirements
        return self.spec.pod_resource_requirements or DEFAULT_POD_RESOURCES

    @property
    def import_proxy(self) -> ImportProxy | None:
        if self.status and self.status.import_proxy:
            return self.status.import_proxy
        return self.spec.import_proxy

    @property
    def preallocation(self) -> bool:
        if self.status and self.status.preallocation is not None:
            return self.status.preallocation
        return bool(self.spec.preallocation)

    @property
    def image_pull_secrets(self) -> tuple[str, ...]:
        refs = (self.status.image_pull_secrets if self.status else ()) or (
            self.spec.image_pull_secrets
        )
        return tuple(ref.name for ref in refs if ref.name)

    @property
    def import_policy(self) -> ImportPolicy:
        return self.spec.import_policy or ImportPolicy()

    def with_cluster_cidrs(self, cidrs: tuple[str, ...]) -> CDIConfig:
        """This config with the cluster ranges the controller knows added to its policy."""
        if not cidrs:
            return self
        policy = self.import_policy
        merged = dataclasses.replace(
            policy, cluster_cidrs=tuple(dict.fromkeys((*policy.cluster_cidrs, *cidrs)))
        )
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, import_policy=merged))

    def gate(self, name: str) -> bool:
        """CDI feature gate ``name`` is on: ``spec.featureGates``, the one place a gate is set
        (the webhook and the controller both ask here)."""
        return name in self.spec.feature_gates

    @property
    def log_level(self) -> int | None:
        """The ``logging`` level ``spec.logVerbosity`` asks for; None: unset (the flag's)."""
        verbosity = self.spec.log_verbosity
        return None if verbosity is None else log_level_for(verbosity)

    @property
    def tls_profile(self) -> TLSProfile:
        """What every TLS server applies (CDI's rule: none is Intermediate)."""
        given = self.spec.tls_security_profile
        if given is None:
            return select_tls_profile(None)
        custom = given.custom
        return select_tls_profile(
            {
                "type": given.type,
                "custom": None
                if custom is None
                else {"ciphers": list(custom.ciphers), "minTLSVersion": custom.min_tls_version},
            }
        )

    @property
    def workload(self) -> NodePlacement:
        """Where worker pods may run: the CDI resource's ``spec.workload`` (none: anywhere)."""
        return (self.status.workload if self.status else None) or NodePlacement()

    @property
    def clone_strategy_override(self) -> str | None:
        """The CDI resource's ``cloneStrategyOverride``: beats every StorageProfile's."""
        return self.status.clone_strategy_override if self.status else None

    @property
    def cert_config(self) -> CDICertConfig:
        return (self.status.cert_config if self.status else None) or CDICertConfig()

    @property
    def scratch_space_storage_class(self) -> str | None:
        if self.status and self.status.scratch_space_storage_class:
            return self.status.scratch_space_storage_class
        return self.spec.scratch_space_storage_class
