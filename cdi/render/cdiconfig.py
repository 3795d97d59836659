"""The status of the CDIConfig singleton ``config``, as a pure function of its spec and the cluster.

``status`` is what every other component reads (``CDIConfig`` in ``cdi.api.config`` prefers it
over ``spec``), so a change to the spec takes effect once the controller has written it here,
for the next PVC or pod rendered. Rules follow CDI's ``config-controller``:

- ``filesystemOverhead.global``: the spec's when it is a valid percent
  (``^(0(?:\\.\\d{1,3})?|1)$``), else ``0.06``; ``filesystemOverhead.storageClass`` has an entry
  for *every* StorageClass: the spec's value for it when valid, else the global one;
- ``scratchSpaceStorageClass``: the spec's class when it exists, else empty (scratch then uses
  the target's class);
- ``defaultPodResourceRequirements``: CDI's defaults (cpu 100m/750m, memory 60M/600M), each of
  cpu/memory request/limit replaced by the spec's when given;
- ``importProxy``, ``imagePullSecrets``, ``preallocation``: copied from the spec;
- ``workload``, ``cloneStrategyOverride``, ``certConfig`` (not CDI's CDIConfig fields): the CDI
  resource in force's (``from_cdi_resource``), where every renderer reads them;
- ``uploadProxyURL``: ``spec.uploadProxyURLOverride``, else the host of an Ingress in the CDI
  namespace that routes to the ``cdi-uploadproxy`` Service, else that Service's cluster DNS name
  when it exists, else unset.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api.config import DEFAULT_POD_RESOURCES, CDIConfig
from cdi.api.constants import CDICONFIG_NAME, DEFAULT_FILESYSTEM_OVERHEAD

UPLOAD_PROXY_SERVICE = "cdi-uploadproxy"
PERCENT = re.compile(r"^(0(?:\.\d{1,3})?|1)$")


def new_config() -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "CDIConfig",
        "metadata": {
            "name": CDICONFIG_NAME,
            "labels": {"app.kubernetes.io/managed-by": "cdi-controller"},
        },
        "spec": {},
    }


def valid_percent(value: str | None) -> bool:
    return value is not None and PERCENT.match(value) is not None


def filesystem_overhead(config: CDIConfig, storage_classes: Iterable[str]) -> dict[str, Any]:
    spec = config.spec.filesystem_overhead
    requested = spec.global_ if spec else None
    global_ = requested if requested and valid_percent(requested) else DEFAULT_FILESYSTEM_OVERHEAD
    per_class = spec.storage_class if spec else {}
    return {
        "global": global_,
        "storageClass": {
            name: per_class[name] if valid_percent(per_class.get(name)) else global_
            for name in sorted(storage_classes)
        },
    }


def pod_resources(config: CDIConfig) -> dict[str, Any]:
    wanted = config.spec.pod_resource_requirements
    out: dict[str, Any] = {}
    for part in ("requests", "limits"):
        defaults: dict[str, Any] = getattr(DEFAULT_POD_RESOURCES, part)
        given: dict[str, Any] = getattr(wanted, part) if wanted else {}
        out[part] = {res: str(given.get(res) or defaults[res]) for res in ("cpu", "memory")}
    return out


def upload_proxy_url(
    config: CDIConfig,
    ingresses: Iterable[Mapping[str, Any]],
    service: Mapping[str, Any] | None,
) -> str | None:
    if config.spec.upload_proxy_url_override:
        return config.spec.upload_proxy_url_override
    for ingress in ingresses:
        host = ingress_host(ingress, UPLOAD_PROXY_SERVICE)
        if host:
            return host
    if service is not None:
        meta = service.get("metadata") or {}
        return f"{meta.get('name')}.{meta.get('namespace')}.svc"
    return None


def ingress_host(ingress: Mapping[str, Any], service: str) -> str | None:
    """The host of the first rule with a path to ``service`` (CDI ``getURLFromIngress``)."""
    spec = ingress.get("spec") or {}
    default = ((spec.get("defaultBackend") or {}).get("service") or {}).get("name")
    for rule in spec.get("rules") or []:
        paths = (rule.get("http") or {}).get("paths") or []
        names = {((p.get("backend") or {}).get("service") or {}).get("name") for p in paths}
        if service in names or (not paths and default == service):
            return str(rule.get("host") or "") or None
    return None


def desired_status(
    config: CDIConfig,
    storage_classes: Iterable[str],
    proxy_url: str | None,
    proxy_ca: str | None = None,
) -> dict[str, Any]:
    """``proxy_ca``: the upload proxy's serving CA bundle (PEM) as it published it."""
    classes = list(storage_classes)
    spec = config.spec
    status: dict[str, Any] = {
        "filesystemOverhead": filesystem_overhead(config, classes),
        "defaultPodResourceRequirements": pod_resources(config),
        "preallocation": bool(spec.preallocation),
    }
    if spec.scratch_space_storage_class in classes:
        status["scratchSpaceStorageClass"] = spec.scratch_space_storage_class
    if proxy_url:
        status["uploadProxyURL"] = proxy_url
    if proxy_ca:
        status["uploadProxyCA"] = proxy_ca
    if spec.import_proxy is not None:
        status["importProxy"] = spec.import_proxy.to_dict()
    if spec.image_pull_secrets:
        status["imagePullSecrets"] = [ref.to_dict() for ref in spec.image_pull_secrets]
    return status


def from_cdi_resource(cdi: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the CDI resource in force sets for the whole product, as CDIConfig status fields
    (copied as the API server stored them; the CRD checked their shapes)."""
    spec = (cdi or {}).get("spec") or {}
    out: dict[str, Any] = {}
    workload = spec.get("workload") or {}
    placement = {
        k: workload[k] for k in ("nodeSelector", "affinity", "tolerations") if workload.get(k)
    }
    if placement:
        out["workload"] = placement
    if spec.get("cloneStrategyOverride") in ("copy", "snapshot", "csi-clone"):
        out["cloneStrategyOverride"] = spec["cloneStrategyOverride"]
    if spec.get("certConfig"):
        out["certConfig"] = spec["certConfig"]
    return out
