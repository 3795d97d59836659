"""The one module that talks to the ``kubernetes`` client: JSON in, JSON out, typed errors.

Objects stay plain dicts in the API's own camelCase: the renderers produce dicts, the API types
parse dicts (``DataVolume.from_dict``), and nothing gains from the generated model classes.
Requests go through ``kubernetes.client.ApiClient`` so TLS, bearer tokens, kubeconfig and
in-cluster configuration are the official client's. Every failure leaves here as one of
``cdi.kube.errors`` (mapped once, in ``_call``), never as ``ApiException`` or a urllib3 error.

The official client is synchronous. ``AsyncKube`` runs each call on a bounded thread pool so
the controller's event loop never blocks on the network: its verbs are ``Kube``'s, lifted by one
typed descriptor rather than forwarded by hand. The pool and urllib3's connection pool are
sized together (``API_CONCURRENCY``): the client's own default (``5 * cpu_count``, 10 on a
2-core node) would otherwise make the threads beyond it open and drop a TLS connection per
request ("Connection pool is full, discarding connection") under a burst of reconciles.
Watches get a thread of their own (``cdi.kube.informer``) because they block for minutes.

A ``Kube`` may be *fenced* (``Kube.fenced``) by its leader election: every request that is not
a GET first asks the fence how long this process may still act as leader, is refused
(``NotLeading``) when that is nothing, and otherwise carries that time as its timeout, so no
write of an old leader can land after a successor may have taken over (``cdi.kube.leader``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar
from urllib.parse import quote

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from cdi.kube.errors import (
    Conflict,
    Gone,
    KubeError,
    NotFound,
    NotLeading,
    Unavailable,
    from_status,
)

JSON = dict[str, Any]
T = TypeVar("T")
P = ParamSpec("P")

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY_PATCH = "application/apply-patch+yaml"
# Requests in flight at once: AsyncKube's threads and urllib3's kept-alive connections. 24, not
# 16: under a 200-DataVolume burst, 16 left new DataVolumes waiting for a worker; 24 cut the
# burst's latency (relative to the API server's own) by ~16 % in five alternating pairs, and 32
# was worse (docs/controller.md, "Where a first reconcile's time goes").
API_CONCURRENCY = 24


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the REST API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str = "", sub: str = "") -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name:
            base += f"/{quote(name)}"
        if sub:
            base += f"/{sub}"
        return base


PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PVCS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
EVENTS = Resource("", "v1", "events", "Event")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICES = Resource("", "v1", "services", "Service")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
STORAGE_CLASSES = Resource("storage.k8s.io", "v1", "storageclasses", "StorageClass", False)
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
DATAVOLUMES = Resource("cdi.kubevirt.io", "v1beta1", "datavolumes", "DataVolume")
STORAGE_PROFILES = Resource(
    "cdi.kubevirt.io", "v1beta1", "storageprofiles", "StorageProfile", False
)
CDI_CONFIGS = Resource("cdi.kubevirt.io", "v1beta1", "cdiconfigs", "CDIConfig", False)
CDIS = Resource("cdi.kubevirt.io", "v1beta1", "cdis", "CDI", False)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
DATA_SOURCES = Resource("cdi.kubevirt.io", "v1beta1", "datasources", "DataSource")
PVS = Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
CSI_DRIVERS = Resource("storage.k8s.io", "v1", "csidrivers", "CSIDriver", namespaced=False)
VOLUME_IMPORT_SOURCES = Resource(
    "cdi.kubevirt.io", "v1beta1", "volumeimportsources", "VolumeImportSource"
)
VOLUME_UPLOAD_SOURCES = Resource(
    "cdi.kubevirt.io", "v1beta1", "volumeuploadsources", "VolumeUploadSource"
)
VOLUME_CLONE_SOURCES = Resource(
    "cdi.kubevirt.io", "v1beta1", "volumeclonesources", "VolumeCloneSource"
)
# The CSI snapshot API (CRDs, served only where a snapshot controller is installed).
VOLUME_SNAPSHOTS = Resource("snapshot.storage.k8s.io", "v1", "volumesnapshots", "VolumeSnapshot")
VOLUME_SNAPSHOT_CLASSES = Resource(
    "snapshot.storage.k8s.io", "v1", "volumesnapshotclasses", "VolumeSnapshotClass", False
)
VALIDATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    False,
)
MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    False,
)
SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", False
)
TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", False)


def load_api_client(kubeconfig: Path | None = None) -> client.ApiClient:
    """From a kubeconfig file, else the pod's service account (in-cluster)."""
    cfg = client.Configuration()
    if kubeconfig is not None:
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    else:
        config.load_incluster_config(client_configuration=cfg)
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, API_CONCURRENCY)
    return client.ApiClient(cfg)


def load_user_client(kubeconfig: str, context: str | None = None) -> tuple[client.ApiClient, str]:
    """A user's kubeconfig (``kubeconfig`` may list several files, ``:``-separated, as
    ``KUBECONFIG`` does) and the namespace of its context (``default`` when it names none), as
    ``kubectl`` and ``virtctl`` resolve them."""
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
    except (config.ConfigException, OSError, ValueError, KeyError) as exc:
        raise KubeError(f"kubeconfig {kubeconfig}: {exc}", reason="InvalidKubeconfig") from exc
    chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
    namespace = ((chosen or {}).get("context") or {}).get("namespace") or "default"
    return client.ApiClient(cfg), str(namespace)


class Kube:
    """Synchronous JSON requests with one identity. Thread-safe (urllib3 pools are)."""

    def __init__(
        self,
        api: client.ApiClient,
        timeout: float = 30.0,
        fence: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        self.timeout = timeout
        self.fence = fence

    def fenced(self, fence: Callable[[], float]) -> Kube:
        """This client, with writes bounded by ``fence``: the seconds a write may still take
        (0: none may be sent). The same connections; reads are not fenced."""
        return Kube(self.api, self.timeout, fence)

    def _write_timeout(self, method: str, path: str, timeout: float) -> float:
        if self.fence is None or method == "GET":
            return timeout
        left = self.fence()
        if left <= 0:
            raise NotLeading(f"{method} {path}: not sent, this process is not the leader")
        return min(timeout, left)

    # -- the one place requests are made and errors mapped -----------------------------------
    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        stream: bool = False,
    ) -> Any:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        params = [(k, v) for k, v in (query or {}).items() if v is not None]
        timeout = self._write_timeout(method, path, timeout or self.timeout)
        try:
            method_, url, hdrs, body_, post = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=params or None,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api.call_api(
                method_,
                url,
                header_params=hdrs,
                body=body_,
                post_params=post,
                _request_timeout=timeout,
            )
            if resp.status >= 400:
                raise from_status(resp.status, resp.read())
            if stream:
                return resp.response
            raw = resp.read() or b"{}"
        except ApiException as exc:
            raise from_status(exc.status or 0, exc.body or str(exc.reason)) from exc
        except (TimeoutError, urllib3.exceptions.HTTPError, OSError) as exc:
            raise Unavailable(f"{method} {path}: {exc}") from exc
        return json.loads(raw)

    # -- verbs -----------------------------------------------------------------------------
    def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        return dict(self._call("GET", res.path(namespace, name)))

    def get_or_none(self, res: Resource, name: str, namespace: str | None = None) -> JSON | None:
        try:
            return self.get(res, name, namespace)
        except NotFound:
            return None

    def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        limit: int | None = None,
        continue_: str | None = None,
    ) -> JSON:
        query = {
            "labelSelector": label_selector,
            "fieldSelector": field_selector,
            "limit": limit,
            "continue": continue_,
        }
        return dict(self._call("GET", res.path(namespace), query=query))

    def create(
        self, res: Resource, obj: JSON, namespace: str | None = None, *, dry_run: bool = False
    ) -> JSON:
        ns = namespace or (obj.get("metadata") or {}).get("namespace")
        query = {"dryRun": "All" if dry_run else None}
        return dict(self._call("POST", res.path(ns), obj, query=query))

    def create_if_absent(
        self, res: Resource, obj: JSON, namespace: str | None = None
    ) -> JSON | None:
        """``create`` for an object that may exist already (a deterministic name, made by an
        earlier step, another replica or someone else): the created object, or None when the
        name is taken (409). Never adoption: what holds the name is the caller's to judge."""
        try:
            return self.create(res, obj, namespace)
        except Conflict:
            return None

    def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        sub: str = "",
        content_type: str = MERGE_PATCH,
        field_manager: str | None = None,
        force: bool | None = None,
        dry_run: bool = False,
    ) -> JSON:
        query: dict[str, Any] = {
            "fieldManager": field_manager,
            "force": None if force is None else str(force).lower(),
            "dryRun": "All" if dry_run else None,
        }
        if content_type == APPLY_PATCH and not isinstance(patch, str):
            patch = json.dumps(patch)  # JSON is YAML
        path = res.path(namespace, name, sub)
        return dict(self._call("PATCH", path, patch, query=query, content_type=content_type))

    def replace(self, res: Resource, obj: JSON, *, sub: str = "") -> JSON:
        meta = obj.get("metadata") or {}
        return dict(self._call("PUT", res.path(meta.get("namespace"), meta["name"], sub), obj))

    def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str | None = "Background",
        uid: str | None = None,
    ) -> None:
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if propagation:
            body["propagationPolicy"] = propagation
        if uid:
            body["preconditions"] = {"uid": uid}
        self._call("DELETE", res.path(namespace, name), body)

    def delete_if_present(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        propagation: str | None = "Background",
        uid: str | None = None,
    ) -> bool:
        """``delete`` for a clean-up that only wants the object gone: already gone (404) is
        done, and so is a 409 (with ``uid``: another object holds the name now, which is not
        this call's to delete). True when this call deleted it."""
        try:
            self.delete(res, name, namespace, propagation=propagation, uid=uid)
        except (NotFound, Conflict):
            return False
        return True

    def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str,
        label_selector: str | None = None,
        timeout_seconds: int = 60,
    ) -> Iterator[tuple[str, JSON]]:
        """Yield ``(type, object)`` until the server ends the watch; raise ``Gone`` when the
        resourceVersion is too old (whether as HTTP 410 or as an ERROR event)."""
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "labelSelector": label_selector,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": timeout_seconds,
        }
        resp = self._call(
            "GET", res.path(namespace), query=query, timeout=timeout_seconds + 15, stream=True
        )
        try:
            buf = b""
            try:
                for chunk in resp.stream(amt=None, decode_content=True):
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield _watch_event(json.loads(line))
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise Unavailable(f"watch {res.plural}: {exc}") from exc
        finally:
            resp.release_conn()


def _watch_event(event: JSON) -> tuple[str, JSON]:
    kind, obj = str(event.get("type", "")), dict(event.get("object") or {})
    if kind == "ERROR":
        err = from_status(int(obj.get("code") or 0), obj)
        if isinstance(err, Gone):
            raise err
        raise err if err.status else KubeError(str(obj.get("message")), body=obj)
    return kind, obj


class _OnThreads(Generic[P, T]):
    """A ``Kube`` verb as a coroutine method of ``AsyncKube``, with the verb's own signature.

    One descriptor instead of a hand-written wrapper per verb: the parameters and return type
    come from the ``Kube`` method itself (``ParamSpec``), so mypy checks every async call
    against the sync signature and a new verb is written once, in ``Kube``. Errors are not
    touched here: they were already mapped, once, in ``Kube._call``.
    """

    def __init__(self, verb: Callable[Concatenate[Kube, P], T]) -> None:
        self.verb = verb

    def __get__(self, obj: AsyncKube, owner: type | None = None) -> Callable[P, Awaitable[T]]:
        verb = self.verb

        async def call(*args: P.args, **kwargs: P.kwargs) -> T:
            return await obj.call(verb, obj.sync, *args, **kwargs)

        return call


class AsyncKube:
    """``Kube`` for asyncio code: each call runs on a bounded pool of threads."""

    get = _OnThreads(Kube.get)
    get_or_none = _OnThreads(Kube.get_or_none)
    list = _OnThreads(Kube.list)
    create = _OnThreads(Kube.create)
    patch = _OnThreads(Kube.patch)
    replace = _OnThreads(Kube.replace)
    delete = _OnThreads(Kube.delete)
    delete_if_present = _OnThreads(Kube.delete_if_present)
    create_if_absent = _OnThreads(Kube.create_if_absent)

    def __init__(self, kube: Kube, max_threads: int = API_CONCURRENCY) -> None:
        self.sync = kube
        self._pool = ThreadPoolExecutor(max_threads, thread_name_prefix="kube")

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run any blocking ``fn`` (a ``Kube`` verb or a composition of them) on the pool."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def object_key(obj: JSON) -> str:
    """``namespace/name`` (or ``name`` for cluster-scoped objects), as the work queue keys."""
    meta = obj.get("metadata") or {}
    ns, name = meta.get("namespace"), meta.get("name", "")
    return f"{ns}/{name}" if ns else str(name)


def split_key(key: str) -> tuple[str | None, str]:
    ns, _, name = key.rpartition("/")
    return (ns or None), name
