"""A pod's volumes, materialized on the node so containers can bind-mount them.

Each volume becomes a host path: a PVC resolves through its bound PersistentVolume (local,
hostPath, or one of the provisioner's CSI volumes) to the provisioner's mount point
(filesystem) or loop device (block); Secret, ConfigMap, downward API
and projected volumes (including service-account tokens from the TokenRequest API) are written
as files under the pod's directory; emptyDir is a directory there. A volume that cannot be
built yet (claim not bound, Secret missing) raises ``NotReady`` and the pod keeps waiting, as
with a kubelet.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testkit.kubeclient import JSON, ApiError, Kube, ns_path
from testkit.podenv import NotReady, PodFacts, configmap_data, field_value, secret_data
from testkit.provisioner import volume_path

DEFAULT_MODE = 0o644
TOKEN_SECONDS = 3607


@dataclass(frozen=True)
class Volume:
    path: Path
    block: bool = False
    read_only: bool = False


@dataclass(frozen=True)
class Bind:
    """One bind mount of a container: host ``src`` at ``dst``."""

    src: Path
    dst: str
    read_only: bool = False
    device: bool = False


class KubeLookup:
    """Secrets and ConfigMaps straight from the API (the node keeps no cache)."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def secret(self, namespace: str, name: str) -> JSON | None:
        return self.kube.get_or_none(ns_path(namespace, "secrets", name))

    def configmap(self, namespace: str, name: str) -> JSON | None:
        return self.kube.get_or_none(ns_path(namespace, "configmaps", name))


def _write_files(target: Path, files: dict[str, tuple[bytes, int]]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for rel, (data, mode) in files.items():
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(data)
        os.chmod(tmp, mode)
        tmp.replace(path)


def _keyed_files(
    data: dict[str, bytes], items: list[JSON] | None, mode: int, what: str
) -> dict[str, tuple[bytes, int]]:
    if not items:
        return {k: (v, mode) for k, v in data.items()}
    out = {}
    for item in items:
        if item["key"] not in data:
            raise NotReady("ContainerCreating", f'{what} has no key "{item["key"]}"')
        out[item["path"]] = (data[item["key"]], item.get("mode", mode))
    return out


class VolumeBuilder:
    def __init__(self, kube: Kube, lookup: KubeLookup, facts: PodFacts, pod_dir: Path) -> None:
        self.kube = kube
        self.lookup = lookup
        self.facts = facts
        self.pod = facts.pod
        self.ns = facts.pod["metadata"]["namespace"]
        self.root = pod_dir / "volumes"

    def build_all(self) -> dict[str, Volume]:
        return {v["name"]: self.build(v) for v in self.pod["spec"].get("volumes") or []}

    def build(self, vol: JSON) -> Volume:
        name = vol["name"]
        target = self.root / name
        if "persistentVolumeClaim" in vol:
            return self._pvc(vol["persistentVolumeClaim"])
        if "emptyDir" in vol:
            target.mkdir(parents=True, exist_ok=True)
            os.chmod(target, 0o777)
            return Volume(target)
        if "hostPath" in vol:
            path = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") == "DirectoryOrCreate":
                path.mkdir(parents=True, exist_ok=True)
            return Volume(path)
        files: dict[str, tuple[bytes, int]]
        if "secret" in vol:
            files = self._secret(vol["secret"], vol["secret"].get("defaultMode", DEFAULT_MODE))
        elif "configMap" in vol:
            files = self._configmap(
                vol["configMap"], vol["configMap"].get("defaultMode", DEFAULT_MODE)
            )
        elif "downwardAPI" in vol:
            files = self._downward(
                vol["downwardAPI"], vol["downwardAPI"].get("defaultMode", DEFAULT_MODE)
            )
        elif "projected" in vol:
            files = self._projected(vol["projected"])
        else:
            kinds = sorted(set(vol) - {"name"})
            raise NotReady("ContainerCreating", f"volume {name}: unsupported kind {kinds}")
        _write_files(target, files)
        return Volume(target, read_only=True)

    # -- sources ----------------------------------------------------------------------------
    def _pvc(self, src: JSON) -> Volume:
        claim = self.kube.get_or_none(ns_path(self.ns, "persistentvolumeclaims", src["claimName"]))
        if claim is None:
            raise NotReady(
                "ContainerCreating", f'persistentvolumeclaim "{src["claimName"]}" not found'
            )
        pv_name = claim["spec"].get("volumeName")
        if not pv_name or claim.get("status", {}).get("phase") != "Bound":
            raise NotReady("ContainerCreating", f'claim "{src["claimName"]}" is not bound')
        pv = self.kube.get(f"/api/v1/persistentvolumes/{pv_name}")
        spec = pv["spec"]
        path = volume_path(pv)
        if not path:
            raise NotReady("ContainerCreating", f"volume {pv_name} has no local path")
        return Volume(
            Path(path), block=spec.get("volumeMode") == "Block", read_only=bool(src.get("readOnly"))
        )

    def _secret(self, src: JSON, mode: int) -> dict[str, tuple[bytes, int]]:
        obj = self.lookup.secret(self.ns, src.get("secretName") or src.get("name", ""))
        if obj is None:
            if src.get("optional"):
                return {}
            raise NotReady("ContainerCreating", f'secret "{src.get("secretName")}" not found')
        return _keyed_files(secret_data(obj), src.get("items"), mode, "secret")

    def _configmap(self, src: JSON, mode: int) -> dict[str, tuple[bytes, int]]:
        obj = self.lookup.configmap(self.ns, src["name"])
        if obj is None:
            if src.get("optional"):
                return {}
            raise NotReady("ContainerCreating", f'configmap "{src["name"]}" not found')
        return _keyed_files(configmap_data(obj), src.get("items"), mode, "configmap")

    def _downward(self, src: JSON, mode: int) -> dict[str, tuple[bytes, int]]:
        out = {}
        for item in src.get("items") or []:
            if "fieldRef" not in item:
                continue  # resourceFieldRef in volumes: not needed by our pods
            value = field_value(self.facts, item["fieldRef"]["fieldPath"])
            out[item["path"]] = (value.encode(), item.get("mode", mode))
        return out

    def _token(self, src: JSON) -> bytes:
        sa = self.pod["spec"].get("serviceAccountName") or "default"
        meta = self.pod["metadata"]
        body: dict[str, Any] = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {
                "expirationSeconds": src.get("expirationSeconds", TOKEN_SECONDS),
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                },
            },
        }
        if src.get("audience"):
            body["spec"]["audiences"] = [src["audience"]]
        try:
            resp = self.kube.create(ns_path(self.ns, "serviceaccounts", sa, "token"), body)
        except ApiError as e:
            raise NotReady("ContainerCreating", f"service account token: {e}") from e
        return str(resp["status"]["token"]).encode()

    def _projected(self, src: JSON) -> dict[str, tuple[bytes, int]]:
        mode = src.get("defaultMode", DEFAULT_MODE)
        out: dict[str, tuple[bytes, int]] = {}
        for s in src.get("sources") or []:
            if "secret" in s:
                out.update(self._secret(s["secret"], mode))
            elif "configMap" in s:
                out.update(self._configmap(s["configMap"], mode))
            elif "downwardAPI" in s:
                out.update(self._downward(s["downwardAPI"], mode))
            elif "serviceAccountToken" in s:
                out[s["serviceAccountToken"]["path"]] = (
                    self._token(s["serviceAccountToken"]),
                    mode,
                )
        return out


def container_binds(container: JSON, volumes: dict[str, Volume]) -> list[Bind]:
    """The bind mounts of one container, parents before children."""
    binds: list[Bind] = []
    for m in container.get("volumeMounts") or []:
        vol = volumes.get(m["name"])
        if vol is None:
            raise NotReady("CreateContainerConfigError", f'volume "{m["name"]}" not found')
        if vol.block:
            raise NotReady(
                "CreateContainerConfigError",
                f'volume "{m["name"]}" is a block volume: use volumeDevices',
            )
        src = vol.path / m["subPath"] if m.get("subPath") else vol.path
        if m.get("subPath") and not src.exists():
            src.mkdir(parents=True, exist_ok=True)
        binds.append(Bind(src, m["mountPath"], read_only=bool(m.get("readOnly")) or vol.read_only))
    for d in container.get("volumeDevices") or []:
        vol = volumes.get(d["name"])
        if vol is None or not vol.block:
            raise NotReady(
                "CreateContainerConfigError", f'volume "{d["name"]}" is not a block volume'
            )
        binds.append(Bind(vol.path, d["devicePath"], device=True))
    return sorted(binds, key=lambda b: b.dst.rstrip("/").count("/"))
