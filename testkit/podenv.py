"""A container's environment and command line, resolved as the kubelet resolves them.

Order of precedence (later wins): the node's base variables, the image's ``env``, the Kubernetes
service variables, ``envFrom`` sources in order, then ``env`` entries in order, where each
``value`` may reference earlier variables as ``$(NAME)`` and ``valueFrom`` reads a Secret,
ConfigMap, pod field or resource field. ``command`` and ``args`` are expanded against the result.
Lookups of Secrets and ConfigMaps go through a :class:`Lookup` so this module stays free of I/O.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from typing import Any, Protocol

JSON = dict[str, Any]

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class NotReady(Exception):
    """A referenced object is missing (the kubelet keeps the container waiting)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Lookup(Protocol):
    def secret(self, namespace: str, name: str) -> JSON | None: ...

    def configmap(self, namespace: str, name: str) -> JSON | None: ...


@dataclass(frozen=True)
class PodFacts:
    """What the downward API can expose about a pod on this node."""

    pod: JSON
    pod_ip: str
    host_ip: str = "127.0.0.1"


def secret_data(secret: JSON) -> dict[str, bytes]:
    out = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    out.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
    return out


def configmap_data(cm: JSON) -> dict[str, bytes]:
    out = {k: v.encode() for k, v in (cm.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (cm.get("binaryData") or {}).items()})
    return out


_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: unknown references stay as written, ``$$`` escapes."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _REF.sub(sub, text)


def field_value(facts: PodFacts, path: str) -> str:
    meta = facts.pod["metadata"]
    spec = facts.pod["spec"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": facts.pod_ip,
        "status.podIPs": facts.pod_ip,
        "status.hostIP": facts.host_ip,
        "status.hostIPs": facts.host_ip,
    }
    if path in simple:
        return str(simple[path])
    if path in ("metadata.labels", "metadata.annotations"):
        items = sorted((meta.get(path.split(".")[1]) or {}).items())
        return "\n".join(f'{k}="{v}"' for k, v in items)
    raise NotReady("CreateContainerConfigError", f"unsupported fieldRef {path}")


def resource_value(container: JSON, ref: JSON) -> str:
    res = ref.get("resource", "")
    kind, _, name = res.partition(".")
    value = (container.get("resources", {}).get(kind) or {}).get(name)
    return str(value) if value is not None else "0"


def _value_from(
    src: JSON, namespace: str, facts: PodFacts, container: JSON, lookup: Lookup
) -> str | None:
    if "fieldRef" in src:
        return field_value(facts, src["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in src:
        return resource_value(container, src["resourceFieldRef"])
    for kind, getter, decode in (
        ("secretKeyRef", lookup.secret, secret_data),
        ("configMapKeyRef", lookup.configmap, configmap_data),
    ):
        if kind in src:
            ref = src[kind]
            obj = getter(namespace, ref["name"])
            data = decode(obj) if obj is not None else None
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    return None
                what = "secret" if kind == "secretKeyRef" else "configmap"
                raise NotReady(
                    "CreateContainerConfigError",
                    f'{what} "{ref["name"]}" key "{ref["key"]}" not found',
                )
            return data[ref["key"]].decode(errors="replace")
    raise NotReady("CreateContainerConfigError", f"unsupported valueFrom {sorted(src)}")


def container_env(
    container: JSON, facts: PodFacts, base: dict[str, str], lookup: Lookup
) -> dict[str, str]:
    env = dict(base)
    namespace = facts.pod["metadata"]["namespace"]
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        if "secretRef" in src:
            ref, obj = src["secretRef"], lookup.secret(namespace, src["secretRef"]["name"])
            data = secret_data(obj) if obj is not None else None
        else:
            ref = src["configMapRef"]
            obj = lookup.configmap(namespace, ref["name"])
            data = configmap_data(obj) if obj is not None else None
        if data is None:
            if ref.get("optional"):
                continue
            raise NotReady("CreateContainerConfigError", f'"{ref["name"]}" not found')
        env.update({prefix + k: v.decode(errors="replace") for k, v in data.items()})
    for item in container.get("env") or []:
        if "valueFrom" in item:
            value = _value_from(item["valueFrom"], namespace, facts, container, lookup)
            if value is None:
                continue
            env[item["name"]] = value
        else:
            env[item["name"]] = expand(item.get("value", ""), env)
    return env


def pod_hostname(pod: JSON) -> str:
    """The kubelet's rule: ``spec.hostname``, else the pod name cut to 63 characters (a DNS
    label) without a trailing ``-`` or ``.``."""
    explicit = pod["spec"].get("hostname")
    if explicit:
        return str(explicit)
    return str(pod["metadata"]["name"])[:63].rstrip("-.")


def base_env(pod: JSON, image_env: dict[str, str], api_port: int) -> dict[str, str]:
    env = {"PATH": BASE_PATH, "HOME": "/root", "HOSTNAME": pod_hostname(pod)}
    env.update(image_env)
    env.update(
        {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(api_port),
            "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
            "KUBERNETES_PORT": f"tcp://127.0.0.1:{api_port}",
        }
    )
    return env
