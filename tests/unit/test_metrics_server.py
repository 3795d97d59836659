"""The importer's metrics endpoint is bounded: capped connections, per-read and total timeouts,
and CDI's metric names on the page. Real sockets on 127.0.0.1."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Iterator

import pytest

from datapath.metrics import serve_metrics
from datapath.metrics_server import BoundedMetricsServer, ServerLimits
from datapath.taps import Progress

LIMITS = ServerLimits(max_connections=2, io_timeout=0.5, deadline=1.5)


@pytest.fixture
def server() -> Iterator[BoundedMetricsServer]:
    srv = serve_metrics(Progress(), "uid-1", 0, "127.0.0.1", LIMITS)
    yield srv
    srv.shutdown()
    srv.server_close()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed ``sock`` (read returns EOF or reset), or None."""
    sock.settimeout(seconds)
    start = time.monotonic()
    try:
        data = sock.recv(65536)
        while data:
            data = sock.recv(65536)
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def test_the_page_keeps_cdis_metric_names(server: BoundedMetricsServer) -> None:
    page = scrape(server.port)
    assert 'kubevirt_cdi_import_progress_total{ownerUID="uid-1"} 0.0' in page
    assert 'cdi_import_bytes_done{ownerUID="uid-1"}' in page


def test_connections_over_the_cap_are_closed_at_once(server: BoundedMetricsServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    time.sleep(0.1)  # let the server accept both
    extra = socket.create_connection(("127.0.0.1", server.port))
    try:
        took = closed_within(extra, 0.4)  # before the idle ones time out
        assert took is not None and took < 0.4
    finally:
        for s in (*idle, extra):
            s.close()


def test_idle_connections_time_out_and_free_their_slot(server: BoundedMetricsServer) -> None:
    idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        for s in idle:
            took = closed_within(s, 3.0)
            assert took is not None and took < 1.5
        assert "kubevirt_cdi_import_progress_total" in scrape(server.port)
    finally:
        for s in idle:
            s.close()


def test_a_slow_drip_of_header_bytes_is_cut_at_the_deadline(
    server: BoundedMetricsServer,
) -> None:
    sock = socket.create_connection(("127.0.0.1", server.port))
    start = time.monotonic()
    try:
        sock.sendall(b"GET /metrics HTTP/1.0\r\n")
        cut = False
        while time.monotonic() - start < 5:
            time.sleep(0.2)  # each byte inside io_timeout, so only the deadline can end it
            try:
                sock.sendall(b"X")
            except OSError:
                cut = True
                break
            if closed_within(sock, 0.01) is not None:
                cut = True
                break
        assert cut
        assert time.monotonic() - start < LIMITS.deadline + 1.0
    finally:
        sock.close()


def _scrape_from(source: str, port: int) -> bytes:
    """One scrape with the client socket bound to ``source`` (another loopback address)."""
    with socket.create_connection(
        ("127.0.0.1", port), timeout=5, source_address=(source, 0)
    ) as sock:
        sock.sendall(b"GET /metrics HTTP/1.0\r\nHost: importer\r\n\r\n")
        answer = b""
        while piece := sock.recv(65536):
            answer += piece
    return answer


def test_one_peer_holding_many_connections_cannot_starve_a_scrape_from_another_address() -> None:
    srv = serve_metrics(Progress(), "uid-1", 0, "127.0.0.1", ServerLimits())  # the pod's limits
    held = []
    try:
        for _ in range(3 * ServerLimits().max_connections):  # idle, one pod, all it can open
            sock = socket.create_connection(
                ("127.0.0.1", srv.port), source_address=("127.0.0.2", 0)
            )
            held.append(sock)
        time.sleep(0.3)  # let the server accept them all
        answer = _scrape_from("127.0.0.3", srv.port)  # the controller, long before any deadline
        assert answer.startswith(b"HTTP/1.0 200 "), answer[:200]
        assert b"kubevirt_cdi_import_progress_total" in answer
        assert srv.slots.held_by("127.0.0.2") == ServerLimits().per_address
    finally:
        for sock in held:
            sock.close()
        srv.shutdown()
        srv.server_close()
