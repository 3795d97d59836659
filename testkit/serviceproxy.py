"""A tiny kube-proxy for the testkit node: Service ClusterIPs on loopback, forwarded to pods.

Pod IPs here are loopback addresses, which Kubernetes refuses in EndpointSlices, so the usual
path (endpoint controllers, then kube-proxy) cannot work. Instead the cluster allocates
ClusterIPs from a loopback range (127.2.0.0/16) and this proxy listens on each ClusterIP:port
and forwards every TCP connection to a ready pod chosen by the Service's selector, exactly what
kube-proxy does with endpoints. The API server reaches Service-referenced webhooks and
aggregated APIs through ClusterIPs, so they work too.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

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


class ServiceProxy:
    def __init__(self) -> None:
        self.listeners: dict[tuple[str, int], Listener] = {}

    def sync(self, services: list[JSON], pods: list[JSON]) -> None:
        desired: dict[tuple[str, int], Target] = {}
        for svc in services:
            spec = svc.get("spec") or {}
            ip = spec.get("clusterIP") or ""
            if not ip.startswith("127.") or not spec.get("selector"):
                continue
            selector = tuple(sorted(spec["selector"].items()))
            for p in spec.get("ports") or []:
                if p.get("protocol", "TCP") == "TCP":
                    target = p.get("targetPort", p["port"])
                    desired[(ip, int(p["port"]))] = Target(
                        svc["metadata"]["namespace"], selector, target
                    )
        for addr in list(self.listeners):
            if addr not in desired or self.listeners[addr].target != desired[addr]:
                self.listeners.pop(addr).close()
        for addr, target in desired.items():
            if addr not in self.listeners:
                self._listen(addr, target)
            if addr in self.listeners:
                self.listeners[addr].backends = backends(target, pods)

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
