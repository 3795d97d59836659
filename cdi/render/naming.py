"""Deterministic names of the objects a DataVolume owns, shortened the way CDI shortens them.

A reconciler that crashes and restarts must find, not duplicate, what it created, so every child
name is a function of the parent's name. CDI uses OpenShift's ``naming.GetName``: ``base-suffix``
when it fits, else a truncated base plus an 8-hex-digit FNV-1a hash; we reproduce it exactly, so
the names match CDI's (``importer-<pvc>``, ``<pvc>-scratch``, ``import-proxy-cm-<pvc>``).
"""

from __future__ import annotations

from cdi.api.constants import MAX_LABEL_LENGTH, MAX_NAME_LENGTH

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193


def fnv32a(text: str) -> str:
    value = _FNV_OFFSET
    for byte in text.encode():
        value = ((value ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return f"{value:08x}"


def get_name(base: str, suffix: str, max_length: int) -> str:
    """OpenShift ``naming.GetName``."""
    if max_length <= 0:
        return ""
    name = f"{base}-{suffix}"
    if len(name) <= max_length:
        return name
    base_length = max_length - 10 - len(suffix)
    if base_length < 0:
        prefix = base[: min(len(base), max(0, max_length - 9))]
        short = f"{prefix}-{fnv32a(name)}"
        return short[:max_length]
    return f"{base[:base_length]}-{fnv32a(base)}-{suffix}"


def resource_name(base: str, suffix: str) -> str:
    return get_name(base, suffix, MAX_NAME_LENGTH)


def label_value_name(resource: str) -> str:
    """A name usable where only a DNS label fits (Services, label values)."""
    base = resource.replace(".", "-")
    return base if len(base) <= MAX_LABEL_LENGTH else get_name(base, "cdi", MAX_LABEL_LENGTH)


def pvc_name(datavolume: str) -> str:
    return datavolume  # the claim has the DataVolume's name, as in CDI


def worker_pod_name(worker: str, pvc: str, attempt: int = 0) -> str:
    """``<worker>-<pvc>`` for the first attempt (CDI's name), ``<worker>-<pvc>-retry-<n>`` after.

    The attempt count lives on the PVC, so a restarted controller finds the pod it created."""
    if attempt == 0:
        return resource_name(worker, pvc)
    return resource_name(worker, f"{pvc}-retry-{attempt}")


def importer_pod_name(pvc: str, attempt: int = 0) -> str:
    return worker_pod_name("importer", pvc, attempt)


def scratch_pvc_name(pvc: str) -> str:
    return resource_name(pvc, "scratch")


def proxy_ca_config_map_name(pvc: str) -> str:
    return resource_name("import-proxy-cm", pvc)


def proxy_auth_secret_name(pvc: str, digest: str) -> str:
    """Named after its content's digest: a changed importProxy gets a new Secret, and one a
    tenant created in advance under the name never holds the operator's credentials."""
    return resource_name("import-proxy-auth", f"{pvc}-{digest}")


def upload_service_name(pvc: str) -> str:
    """The upload server's Service (and pod) name, a DNS label: CDI's ``cdi-upload-<pvc>``."""
    return label_value_name(resource_name("cdi-upload", pvc))
