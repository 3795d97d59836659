"""A network namespace for one real-node cluster, and a TCP forwarder into it (issue 24).

A kubelet, containerd or CNI plugin must never run on the host network: one kubelet there once
sent a DNS query off the machine, and they all write iptables chains. So a real-node cluster
first creates its own network namespace (``ip netns add``): a loopback that also holds the
node's address, later the CNI bridge and the kubelet's and kube-proxy's iptables
rules. It has no route off the machine, so nothing started in it can send a packet elsewhere,
and deleting it removes every interface and rule it held.

Processes join it with ``nsenter --net`` (only the network namespace: the kubelet, containerd
and the provisioner must share the host's mount namespace). The harness itself reaches into it
in two ways: :meth:`NetNamespace.call` runs a function in a thread that has joined it (sockets
keep the namespace they were made in), and ``python -m testkit.netns forward`` listens on the
host's loopback and forwards each connection to a port inside (the API server, for the tests);
:func:`expose` does the reverse in-process, so pods reach a test's loopback server.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import queue
import socket
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
T = TypeVar("T")


class NetnsError(RuntimeError):
    """A network namespace could not be created, configured or joined."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def setns(path: Path) -> None:
    """Move the calling thread into the network namespace at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns {path}: {os.strerror(err)}")
    finally:
        os.close(fd)


class NetNamespace:
    """One named network namespace: ``/run/netns/<name>``."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = NETNS_DIR / name
        self._calls: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] | None = None

    def create(self, node_ip: str, service_cidr: str) -> None:
        """Create it (removing a stale one of the same name), bring up its loopback, give
        it ``node_ip`` too (the node's address, reached from pods through the CNI bridge; this
        kernel has no dummy interfaces), route ``service_cidr`` locally, enable
        forwarding (pods to Services) and
        bridge netfilter (Services between pods on one bridge), all inside it."""
        if self.path.exists():
            self.delete()
        _ip("netns", "add", self.name)
        _ip("-n", self.name, "link", "set", "lo", "up")
        _ip("-n", self.name, "addr", "add", f"{node_ip}/32", "dev", "lo")
        # A route for ClusterIPs, else a connect() from the namespace itself (the API server to
        # a webhook or an aggregated API) fails before kube-proxy's DNAT: no default route here.
        _ip("-n", self.name, "route", "add", service_cidr, "dev", "lo", "src", node_ip)
        for key in (
            "net/ipv4/ip_forward",
            "net/bridge/bridge-nf-call-iptables",
            "net/ipv4/conf/all/route_localnet",
        ):
            self.call(lambda k=key: Path("/proc/sys", k).write_text("1"))

    def add_address(self, ip: str) -> None:
        """One more local address (another node's) on the namespace's loopback."""
        _ip("-n", self.name, "addr", "add", f"{ip}/32", "dev", "lo")

    def argv(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this namespace (network only; mounts stay the host's)."""
        return ["nsenter", f"--net={self.path}", "--", *argv]

    def call(self, fn: Callable[[], T], timeout: float | None = 60) -> T:
        """Run ``fn`` in a thread that has joined this namespace and return its result."""
        if self._calls is None:
            self._calls = queue.Queue()
            ready: Future[None] = Future()
            threading.Thread(
                target=self._serve,
                args=(self._calls, ready),
                name=f"netns-{self.name}",
                daemon=True,
            ).start()
            ready.result(timeout=10)
        done: Future[T] = Future()
        self._calls.put((fn, done))
        return done.result(timeout=timeout)

    def _serve(
        self, calls: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None], ready: Future[None]
    ) -> None:
        try:
            setns(self.path)
        except BaseException as e:
            ready.set_exception(e)
            return
        ready.set_result(None)
        while (item := calls.get()) is not None:
            fn, done = item
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

    def delete(self) -> None:
        """Delete it: its interfaces and iptables rules go with it."""
        if self._calls is not None:
            self._calls.put(None)
            self._calls = None
        if self.path.exists():
            _ip("netns", "del", self.name)


# -- forwarder: host loopback -> a port inside the namespace ----------------------------------
def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s, how in ((dst, socket.SHUT_WR), (src, socket.SHUT_RD)):
            try:
                s.shutdown(how)
            except OSError:
                pass


def forward(listen: tuple[str, int], netns: Path, target: tuple[str, int]) -> None:
    """Listen on ``listen`` in the current namespace, then join ``netns`` and connect each
    accepted connection to ``target`` there. Runs until killed."""
    server = socket.create_server(listen, reuse_port=False)
    setns(netns)  # the process is single-threaded here: every later socket is made inside
    _accept_and_relay(server, target)


def _accept_and_relay(server: socket.socket, target: tuple[str, int]) -> None:
    """Connect each connection ``server`` accepts to ``target`` (in the calling thread's
    namespace) and pump both ways; returns when ``server`` is closed."""
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return
        try:
            upstream = socket.create_connection(target, timeout=10)
        except OSError:
            conn.close()
            continue
        upstream.settimeout(None)
        for a, b in ((conn, upstream), (upstream, conn)):
            threading.Thread(target=_pump, args=(a, b), daemon=True).start()


# -- the other way: a port inside the namespace -> a server on the host's loopback -------------
@dataclass
class Exposed:
    """A listening socket inside a namespace whose connections are relayed to a server on the
    host; pods reach ``address:port``. ``close()`` stops accepting (open relays finish)."""

    address: str
    port: int
    target: tuple[str, int]
    _server: socket.socket

    def close(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._server.close()


def expose(ns: NetNamespace, address: str, target: tuple[str, int]) -> Exposed:
    """Listen on ``address`` (a free port) inside ``ns`` and relay every connection to
    ``target`` here, in this process: a test's loopback server (an image server, a registry)
    becomes reachable by the pods and nodes of a real-node cluster without moving it. The
    listening socket is made in a thread that joined ``ns`` (a socket keeps the namespace it
    was made in); the relay threads connect from the caller's namespace, the host's."""
    server = ns.call(lambda: socket.create_server((address, 0)))
    exposed = Exposed(address, int(server.getsockname()[1]), target, server)
    threading.Thread(
        target=_accept_and_relay, args=(server, target), name=f"expose-{exposed.port}", daemon=True
    ).start()
    return exposed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testkit.netns")
    sub = parser.add_subparsers(dest="cmd", required=True)
    fwd = sub.add_parser("forward", help="forward a host port into a network namespace")
    fwd.add_argument("--listen", required=True, help="HOST:PORT here")
    fwd.add_argument("--netns", required=True, type=Path, help="/run/netns/NAME")
    fwd.add_argument("--connect", required=True, help="HOST:PORT inside")
    args = parser.parse_args(argv)
    lhost, lport = args.listen.rsplit(":", 1)
    chost, cport = args.connect.rsplit(":", 1)
    forward((lhost, int(lport)), args.netns, (chost, int(cport)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
