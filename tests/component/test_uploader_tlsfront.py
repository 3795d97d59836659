"""The upload server's TLS door (``uploader/tlsfront.py``) through the real server (``serve``,
in-process, or ``python -m uploader``), real TLS on 127.0.0.1 with certificates from our own
certs code: who may upload (a client certificate is required in the handshake; the CN of the
certificate verified for the connection, never a header), a connection cut mid-body
reaching the app as a cut (and the tus PATCH then finishing the upload), a half-close that
ends, connections of every kind leaving no task, thread or file descriptor behind, and
SIGTERM with connections still open."""

from __future__ import annotations

import asyncio
import http.client
import os
import random
import signal
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.component.conftest import same_content
from tests.component.uploader_harness import (
    CLIENT_NAME,
    Child,
    Pki,
    data_target,
    free_port,
    make_pki,
    running_server,
    server_env,
)
from wire.tlsstream import TlsStream

MiB = 1024 * 1024
FORGED = {
    "X-Client-CN": CLIENT_NAME,
    "X-SSL-Client-S-DN": f"CN={CLIENT_NAME}",
    "X-Forwarded-Client-Cert": f'Subject="CN={CLIENT_NAME}"',
    "X-Remote-User": CLIENT_NAME,
    "Ssl-Client-Subject-Dn": f"CN={CLIENT_NAME}",
}


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def env(pki: Pki, tmp_path: Path) -> dict[str, str]:
    return server_env(pki, data_target(tmp_path), "64Mi", free_port())


def anonymous(pki: Pki) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=pki.server_ca.cert_pem.decode())


def ask(
    conn: http.client.HTTPSConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str]]:
    conn.request(method, path, body=body, headers=headers or {})
    response = conn.getresponse()
    response.read()
    return response.status, dict(response.headers)


def connection(port: int, ctx: ssl.SSLContext) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=20)


def once(
    port: int, ctx: ssl.SSLContext, method: str, path: str, **kw: object
) -> tuple[int, dict[str, str]]:
    conn = connection(port, ctx)
    try:
        return ask(conn, method, path, **kw)  # type: ignore[arg-type]
    finally:
        conn.close()


def _anonymous_post(port: int, pki: Pki) -> BaseException | bytes:
    """A POST from a client without a certificate: the error that ended it, or what the
    server answered (``b""``: the connection was closed without a byte)."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        tls = anonymous(pki).wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(b"POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        return tls.recv(4096)
    except (OSError, ssl.SSLError) as exc:
        return exc
    finally:
        raw.close()


async def test_a_client_without_a_certificate_is_refused_at_the_handshake(
    pki: Pki, env: dict[str, str]
) -> None:
    async with running_server(env) as srv:
        refused = await asyncio.to_thread(_anonymous_post, srv.config.port, pki)
    # No answer at all, not even the app's 401: the handshake failed on the server (TLS 1.3
    # lets the client finish its side first, so it sees the connection end; asyncio does not
    # send the certificate_required alert before closing), and the app never saw it (N4).
    assert refused == b"" or isinstance(refused, (ssl.SSLError, ConnectionError)), refused
    assert not Path(env["DESTINATION"]).exists()


async def test_a_client_certificate_with_another_cn_is_401(pki: Pki, env: dict[str, str]) -> None:
    async with running_server(env) as srv:
        ctx = pki.client_context(pki.stranger)
        status, _ = await asyncio.to_thread(
            once, srv.config.port, ctx, "POST", "/v1beta1/upload-async", body=b"x" * 4096
        )
    assert status == 401
    assert not Path(env["DESTINATION"]).exists()


def _forgery_round(port: int, pki: Pki) -> list[int]:
    """The right client's connection stays open while others try headers that name it."""
    right = connection(port, pki.client_context())
    try:
        statuses = [ask(right, "HEAD", "/v1beta1/upload-async")[0]]
        ctx = pki.client_context(pki.stranger)  # no certificate at all: refused at handshake
        for name, value in FORGED.items():
            statuses.append(
                once(port, ctx, "HEAD", "/v1beta1/upload-async", headers={name: value})[0]
            )
        statuses.append(ask(right, "HEAD", "/v1beta1/upload-async")[0])
    finally:
        right.close()
    return statuses


async def test_the_cn_comes_from_the_connection_and_no_header_can_forge_it(
    pki: Pki, env: dict[str, str]
) -> None:
    async with running_server(env) as srv:
        statuses = await asyncio.to_thread(_forgery_round, srv.config.port, pki)
    assert statuses[0] == statuses[-1] == 200
    assert statuses[1:-1] == [401] * len(FORGED)


def _cut(sock: socket.socket, how: str) -> None:
    if how == "reset":  # RST instead of FIN
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # no close_notify either way: the TLS stream just stops


def _post_half_and_cut(port: int, pki: Pki, image: bytes, how: str) -> None:
    raw = socket.create_connection(("127.0.0.1", port), timeout=20)
    tls = TlsStream.connect(raw, pki.client_context(), "127.0.0.1")
    head = (
        f"POST /v1beta1/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(image)}\r\n\r\n"
    ).encode()
    tls.sendall(head + image[: len(image) // 2])
    _cut(raw, how)


def _settled_offset(port: int, pki: Pki) -> int:
    """The offset the server reports once it stopped moving (the cut was noticed)."""
    last, still = -1, 0
    for _ in range(200):
        _, headers = once(port, pki.client_context(), "HEAD", "/v1beta1/upload")
        offset = int(headers["Upload-Offset"])
        still = still + 1 if offset == last else 0
        if still >= 3:
            return offset
        last = offset
        time.sleep(0.1)
    raise AssertionError("the upload's offset never settled after the cut")


def _resume(port: int, pki: Pki, image: bytes) -> tuple[int, int]:
    offset = _settled_offset(port, pki)
    headers = {
        "Upload-Offset": str(offset),
        "Tus-Resumable": "1.0.0",
        "Content-Type": "application/offset+octet-stream",
    }
    status, _ = once(
        port, pki.client_context(), "PATCH", "/v1beta1/upload", body=image[offset:],
        headers=headers,
    )  # fmt: skip
    return offset, status


@pytest.mark.parametrize("how", ["fin", "reset"])
async def test_a_cut_mid_body_reaches_the_app_as_a_cut_and_the_upload_resumes(
    pki: Pki, tmp_path: Path, how: str
) -> None:
    rng = random.Random(13)
    image = bytes(2 * MiB) + rng.randbytes(6 * MiB)  # a raw image: zeros, then data
    (tmp_path / "image.raw").write_bytes(image)
    target = data_target(tmp_path)
    env = server_env(pki, target, "32Mi", free_port())
    async with running_server(env) as srv:
        port = srv.config.port
        await asyncio.to_thread(_post_half_and_cut, port, pki, image, how)
        offset, status = await asyncio.to_thread(_resume, port, pki, image)
        outcome = await asyncio.wait_for(srv.task, 60)
    assert 0 < offset <= len(image) // 2
    assert status == 204
    assert outcome.succeeded, outcome.message
    assert same_content(target, tmp_path / "image.raw", len(image))


def _half_close(port: int, pki: Pki, notify: bool) -> float:
    """A request, then the client's end of the stream; seconds until the server's end."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    tls = TlsStream.connect(raw, pki.client_context(), "127.0.0.1")
    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    if notify:
        tls.close_notify()
    raw.shutdown(socket.SHUT_WR)
    started = time.monotonic()
    buf = memoryview(bytearray(4096))
    try:
        while tls.recv_into(buf):
            pass
    except ConnectionResetError:
        pass  # an end too: the server closed with our close_notify unread
    finally:
        raw.close()
    return time.monotonic() - started


@pytest.mark.parametrize("notify", [True, False], ids=["close_notify", "fin"])
async def test_a_half_closed_connection_ends_instead_of_hanging(
    pki: Pki, env: dict[str, str], notify: bool
) -> None:
    async with running_server(env) as srv:
        seconds = await asyncio.to_thread(_half_close, srv.config.port, pki, notify)
    assert seconds < 5  # a hang would raise TimeoutError after 10 s


def _leftovers() -> int:
    """Threads besides the test's own, and the front's handshake tasks still alive."""
    names = ("_handshake", "_wait_for_slot")
    tasks = [t for t in asyncio.all_tasks() if any(n in repr(t.get_coro()) for n in names)]
    return len(tasks) + sum(t.name.startswith("tlsfront") for t in threading.enumerate())


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _kinds(port: int, pki: Pki) -> list[Callable[[], object]]:
    def healthz() -> object:
        return once(port, pki.client_context(), "GET", "/healthz")

    def tcp_only() -> object:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        return None

    def handshake_then_cut() -> object:
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        TlsStream.connect(raw, pki.client_context(), "127.0.0.1")
        _cut(raw, "reset")
        return None

    def refused_handshake() -> object:  # a client that does not trust the server
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        try:
            ssl.create_default_context().wrap_socket(raw, server_hostname="127.0.0.1")
        except ssl.SSLError:
            pass
        raw.close()
        return None

    return [healthz, tcp_only, handshake_then_cut, refused_handshake]


def _many_connections(port: int, pki: Pki) -> None:
    kinds = _kinds(port, pki)
    for i in range(40):
        kinds[i % len(kinds)]()
    held = [connection(port, pki.client_context()) for _ in range(10)]  # open at once
    for conn in held:
        assert ask(conn, "GET", "/healthz")[0] == 200
    for conn in held:
        conn.close()


async def _settles(check: Callable[[], bool], seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


async def test_many_connections_of_every_kind_leave_no_threads_or_fds_behind(
    pki: Pki, env: dict[str, str]
) -> None:
    async with running_server(env) as srv:
        await asyncio.to_thread(once, srv.config.port, pki.client_context(), "GET", "/healthz")
        assert await _settles(lambda: _leftovers() == 0)
        fds = _fds()
        await asyncio.to_thread(_many_connections, srv.config.port, pki)
        assert await _settles(lambda: _leftovers() == 0), _leftovers()
        assert await _settles(lambda: _fds() <= fds), (_fds(), fds)


async def test_sigterm_stops_the_server_with_connections_still_open(
    pki: Pki, env: dict[str, str]
) -> None:
    child = Child(env)
    await child.start()
    assert child.proc is not None
    port = int(env["UPLOAD_SERVER_PORT"])
    idle = connection(port, pki.client_context())  # a keep-alive connection, idle
    assert (await asyncio.to_thread(ask, idle, "GET", "/healthz"))[0] == 200
    silent = socket.create_connection(("127.0.0.1", port))  # never says hello
    try:
        started = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(child.wait, 30)
        seconds = time.monotonic() - started
    finally:
        idle.close()
        silent.close()
    assert seconds < 5, child.logs
    assert child.proc.returncode == 1, child.logs  # stopped: no termination message, exit 1
