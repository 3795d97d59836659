"""A small bounded HTTP server for a worker's Prometheus page.

prometheus_client's ``start_http_server`` starts a thread per connection with no limit and no
timeout, so anything that can reach the pod IP (every pod in the cluster, by default) could
hold thousands of idle or one-byte-a-minute connections open and exhaust the worker's threads
and memory while it writes a disk. This server keeps the same page (``generate_latest`` of the
worker's registry, so CDI's metric names are unchanged) but:

- serves at most ``max_connections`` connections at once, and at most ``per_address`` of
  them for one client address; one more is closed at accept. Without the per-address cap
  one pod holding all the slots starved the controller's scrape: no progress shown and no
  resume attestation recorded (security review 3, M1). Many pods at once are for the
  NetworkPolicy in docs/security.md to keep out;
- gives each connection ``io_timeout`` seconds per read or write and ``deadline`` seconds in
  total (a watchdog, ``wire.connlimit.Deadlines``, shuts the socket, which ends a slow
  drip of header bytes), then closes it (HTTP/1.0, one request per connection);
- answers only ``GET /metrics`` (and ``/``), with a small bounded request (the standard
  library's request line and header limits).

TLS is not offered: the controller would need a per-pod certificate it can verify (issued by
its own CA into each pod), which is future work; the page carries progress numbers only.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from wire.connlimit import AddressSlots, Deadlines


@dataclass(frozen=True)
class ServerLimits:
    max_connections: int = 16
    per_address: int = 2  # the controller scrapes one page at a time
    io_timeout: float = 5.0  # per read/write on the socket
    deadline: float = 10.0  # per connection, in total


class _MetricsHandler(BaseHTTPRequestHandler):
    server: BoundedMetricsServer

    def setup(self) -> None:
        self.request.settimeout(self.server.limits.io_timeout)  # every read and write
        super().setup()

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = generate_latest(self.server.registry)
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE_LATEST)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # one line per scrape every 2 s would drown the worker's log


class BoundedMetricsServer(ThreadingHTTPServer):
    """``ThreadingHTTPServer`` with a connection cap and per-connection timeouts."""

    daemon_threads = True
    request_queue_size = 16

    def __init__(
        self, address: tuple[str, int], registry: CollectorRegistry, limits: ServerLimits
    ) -> None:
        self.registry = registry
        self.limits = limits
        self.slots = AddressSlots(limits.max_connections, limits.per_address)
        self.deadlines = Deadlines("metrics-deadlines")
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.address_family = family
        super().__init__(address, _MetricsHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.take(str(client_address[0])):
            self.shutdown_request(request)  # over a cap: close at once, spend no thread
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.give(str(client_address[0]))
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = self.deadlines.arm(request, self.limits.deadline)
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self.slots.give(str(client_address[0]))


def start_metrics_server(
    registry: CollectorRegistry, addr: str, port: int, limits: ServerLimits | None = None
) -> BoundedMetricsServer:
    """Serve ``registry`` on ``addr:port`` from a daemon thread; returns the running server."""
    server = BoundedMetricsServer((addr, port), registry, limits or ServerLimits())
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server
