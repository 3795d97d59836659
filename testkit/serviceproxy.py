"""A tiny kube-proxy for the testkit node: Service ClusterIPs on loopback, forwarded to pods.

Pod IPs here are loopback addresses, which Kubernetes refuses in EndpointSlices, so the usual
path (endpoint controllers, then kube-proxy) cannot work. Instead the cluster allocates
ClusterIPs from a loopback range (127.2.0.0/16) and this proxy listens on each ClusterIP:port
and forwards every TCP connection to a ready pod chosen by the Service's selector, exactly what
kube-proxy does with endpoints. The API server reaches Service-referenced webhooks and
aggregated APIs through ClusterIPs, so they work too.

Some clients want an EndpointSlice before they dial a ClusterIP at all: the kube-apiserver's
aggregator marks an APIService Available only when its Service has a ready endpoint. So for
every Service it serves, the proxy writes one EndpointSlice (managed-by
``testkit.serviceproxy``, owned by the Service) with one ready endpoint per ready backend.
Their addresses are placeholders from TEST-NET-1 (192.0.2.0/24, never routed): loopback pod
IPs are refused in slices, and nothing dials them, since the aggregator routes to the
ClusterIP. A slice is written only when it changes.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

from testkit.kubeclient import ApiError, Kube

JSON = dict[str, Any]
log = logging.getLogger("testkit.serviceproxy")


@dataclass(frozen=True)
class Target:
    namespace: str
    selector: tuple[tuple[str, str], ...]
    target_port: int | str


def _matches(pod: JSON, target: Target) -> bool:
    if pod["metadata"]["namespace"] != target.namespace or not target.selector:
        return False
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in target.selector)


def _ready(pod: JSON) -> bool:
    status = pod.get("status") or {}
    if pod["metadata"].get("deletionTimestamp") or not status.get("podIP"):
        return False
    conds = status.get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


def _resolve_port(pod: JSON, port: int | str) -> int | None:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for c in pod["spec"].get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
    return None


def backends(target: Target, pods: list[JSON]) -> list[tuple[str, int]]:
    """Ready pods of a Service as (pod IP, port), in a stable order."""
    out = []
    for pod in pods:
        if _matches(pod, target) and _ready(pod):
            port = _resolve_port(pod, target.target_port)
            if port is not None:
                out.append((str(pod["status"]["podIP"]), port))
    return sorted(out)


@dataclass
class Listener:
    address: tuple[str, int]
    target: Target
    sock: socket.socket
    backends: list[tuple[str, int]] = field(default_factory=list)
    counter: itertools.count[int] = field(default_factory=itertools.count)
    closed: threading.Event = field(default_factory=threading.Event)

    def serve(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        choices = list(self.backends)
        if not choices:
            conn.close()  # no ready endpoint: refuse, as kube-proxy's REJECT does
            return
        backend = choices[next(self.counter) % len(choices)]
        try:
            upstream = socket.create_connection(backend, timeout=5)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=_pump, args=(upstream, conn), daemon=True).start()
        _pump(conn, upstream)

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            src.close()


SLICE_MANAGER = "testkit.serviceproxy"
PLACEHOLDER_NET = "192.0.2."  # TEST-NET-1: documentation addresses, never dialled


def endpoint_slice(svc: JSON, ready: int, ports: list[JSON]) -> JSON:
    """The slice for ``svc`` with ``ready`` placeholder endpoints."""
    meta = svc["metadata"]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{meta['name']}-testkit",
            "namespace": meta["namespace"],
            "labels": {
                "kubernetes.io/service-name": meta["name"],
                "endpointslice.kubernetes.io/managed-by": SLICE_MANAGER,
            },
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "Service", "name": meta["name"], "uid": meta["uid"]}
            ],
        },
        "addressType": "IPv4",
        "ports": ports,
        "endpoints": [
            {"addresses": [f"{PLACEHOLDER_NET}{i + 1}"], "conditions": {"ready": True}}
            for i in range(min(ready, 250))
        ],
    }


class SliceWriter:
    """Applies each Service's slice when it differs from what was last written."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.written: dict[tuple[str, str], JSON] = {}

    def write(self, slices: list[JSON]) -> None:
        for body in slices:
            meta = body["metadata"]
            key = (meta["namespace"], meta["name"])
            if self.written.get(key) == body:
                continue
            path = f"/apis/discovery.k8s.io/v1/namespaces/{key[0]}/endpointslices/{key[1]}"
            try:
                self.kube.request(
                    "PATCH",
                    path,
                    body,
                    content_type="application/apply-patch+yaml",
                    query={"fieldManager": SLICE_MANAGER, "force": "true"},
                )
            except (ApiError, OSError) as e:  # a namespace going away: retried next sync
                log.warning("endpoint slice %s/%s: %s", key[0], key[1], e)
                continue
            self.written[key] = body


class ServiceProxy:
    def __init__(self, kube: Kube | None = None) -> None:
        self.listeners: dict[tuple[str, int], Listener] = {}
        self.slices = SliceWriter(kube) if kube is not None else None

    def sync(self, services: list[JSON], pods: list[JSON]) -> None:
        desired: dict[tuple[str, int], Target] = {}
        slices: list[JSON] = []
        for svc in services:
            spec = svc.get("spec") or {}
            ip = spec.get("clusterIP") or ""
            if not ip.startswith("127.") or not spec.get("selector"):
                continue
            selector = tuple(sorted(spec["selector"].items()))
            slice_ports: list[JSON] = []
            ready = 0
            for p in spec.get("ports") or []:
                if p.get("protocol", "TCP") == "TCP":
                    target = p.get("targetPort", p["port"])
                    t = Target(svc["metadata"]["namespace"], selector, target)
                    desired[(ip, int(p["port"]))] = t
                    found = backends(t, pods)
                    ready = max(ready, len(found))
                    port: JSON = {"name": p.get("name", ""), "protocol": "TCP"}
                    if found:
                        port["port"] = found[0][1]
                    slice_ports.append(port)
            slices.append(endpoint_slice(svc, ready, slice_ports))
        for addr in list(self.listeners):
            if addr not in desired or self.listeners[addr].target != desired[addr]:
                self.listeners.pop(addr).close()
        for addr, target in desired.items():
            if addr not in self.listeners:
                self._listen(addr, target)
            if addr in self.listeners:
                self.listeners[addr].backends = backends(target, pods)
        if self.slices is not None:
            self.slices.write(slices)

    def _listen(self, addr: tuple[str, int], target: Target) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
            sock.listen(64)
        except OSError as e:
            sock.close()
            log.warning("cannot listen on %s:%d: %s", addr[0], addr[1], e)
            return
        listener = Listener(addr, target, sock)
        self.listeners[addr] = listener
        threading.Thread(target=listener.serve, daemon=True).start()

    def close(self) -> None:
        for listener in self.listeners.values():
            listener.close()
        self.listeners.clear()
