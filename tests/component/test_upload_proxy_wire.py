"""The upload proxy's HTTP on the wire, against real TLS peers on 127.0.0.1: ``Expect:
100-continue``, chunked and concurrent bodies, an idle Content-Length body, an upload server
that answers before taking the body, malformed requests, unknown routes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tests.component import test_upload_proxy as base
from tests.component.test_upload_proxy import Env, post, pvc

env, pki = base.env, base.pki  # the same fixtures: a real proxy in front of a real TLS peer

MiB = 1 << 20


async def _raw(env: Env) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = env.url.removeprefix("https://").split(":")
    return await asyncio.open_connection(host, int(port), ssl=env.pki.client_trusting_proxy())


async def _status_line(reader: asyncio.StreamReader) -> bytes:
    return await asyncio.wait_for(reader.readline(), 10)


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


def _upload_head(length: int, authorization: str, *extra: str) -> bytes:
    lines = ["POST /v1beta1/upload HTTP/1.1", "Host: p", f"Content-Length: {length}"]
    lines += [f"Authorization: {authorization}", *extra]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_expect_100_continue_is_answered_once_the_upload_is_admitted(env: Env) -> None:
    env.targets.add(pvc("disk"))
    reader, writer = await _raw(env)
    writer.write(_upload_head(3, f"Bearer {env.token()}", "Expect: 100-continue"))
    assert await _status_line(reader) == b"HTTP/1.1 100 Continue\r\n"
    assert await reader.readline() == b"\r\n"
    writer.write(b"abc")
    head, _ = await _answer(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert (env.peer.seen[0].received, env.peer.seen[0].complete) == (3, True)
    assert "Expect" not in env.peer.seen[0].headers


async def test_a_refused_upload_never_says_continue(env: Env) -> None:
    reader, writer = await _raw(env)
    writer.write(_upload_head(3_000_000, "Bearer nonsense", "Expect: 100-continue"))
    head, _ = await _answer(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 401 ") and b"Connection: close" in head
    assert env.peer.seen == []


async def test_a_chunked_body_reaches_the_upload_server_whole(env: Env) -> None:
    env.targets.add(pvc("disk"))

    async def pieces() -> AsyncIterator[bytes]:
        for size in (1, MiB, 17, 3 * MiB):
            yield b"q" * size

    status, _, _ = await post(env, data=pieces())  # type: ignore[arg-type]
    seen = env.peer.seen[0]
    assert (status, seen.received, seen.complete) == (200, 4 * MiB + 18, True)
    assert seen.headers["Transfer-Encoding"] == "chunked"


async def test_uploads_at_once_each_get_their_own_relay(env: Env) -> None:
    env.targets.add(pvc("disk"))
    results = await asyncio.gather(*(post(env, data=bytes([n]) * 3 * MiB) for n in range(4)))
    assert [status for status, _, _ in results] == [200] * 4
    assert sorted(s.received for s in env.peer.seen) == [3 * MiB] * 4
    assert all(s.complete for s in env.peer.seen)


async def test_a_content_length_body_that_stalls_is_408(env: Env) -> None:
    env.targets.add(pvc("disk"))
    reader, writer = await _raw(env)
    writer.write(_upload_head(1000, f"Bearer {env.token()}") + b"s" * 10)
    head, body = await _answer(reader)  # the proxy's idle timeout is 1 s
    writer.close()
    assert head.startswith(b"HTTP/1.1 408 ") and body == b"no upload data for 1 seconds"
    for _ in range(100):
        if env.peer.seen and env.peer.seen[0].ended:
            break
        await asyncio.sleep(0.05)
    assert (env.peer.seen[0].received, env.peer.seen[0].complete) == (10, False)


async def test_an_upload_server_that_answers_before_the_body_is_passed_through(
    env: Env,
) -> None:
    """The upload server refuses at once (busy: 503) and closes: the uploader gets its
    answer, not a 502."""

    async def busy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 32\r\n"
            b"Connection: close\r\n\r\nan upload is already in progress"
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(busy, "127.0.0.1", 0, ssl=env.pki.peer_serving())
    env.targets.add(pvc("disk"))
    env.targets.ports["disk"] = server.sockets[0].getsockname()[1]
    try:
        status, body, _ = await post(env, data=b"b" * 8 * MiB)
    finally:
        server.close()
    assert (status, body) == (503, "an upload is already in progress")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1beta1/upload", 405), ("POST", "/v1beta1/nothing", 404), ("POST", "/", 404)],
)
async def test_other_routes_and_methods_are_404_and_405(
    env: Env, method: str, path: str, status: int
) -> None:
    async with env.session() as s, s.request(method, env.url + path) as r:
        assert r.status == status
    assert env.peer.seen == []


async def test_a_request_with_both_length_and_chunked_is_400_and_goes_nowhere(env: Env) -> None:
    env.targets.add(pvc("disk"))
    reader, writer = await _raw(env)
    writer.write(
        b"POST /v1beta1/upload HTTP/1.1\r\nHost: p\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n"
        + f"Authorization: Bearer {env.token()}\r\n\r\n0\r\n\r\n".encode()
    )
    head, _ = await _answer(reader)
    writer.close()
    assert head.startswith(b"HTTP/1.1 400 ") and env.peer.seen == []


async def test_a_client_without_tls_is_dropped_and_the_proxy_keeps_serving(env: Env) -> None:
    host, port = env.url.removeprefix("https://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET /healthz HTTP/1.1\r\n\r\n")
    assert b"HTTP" not in await asyncio.wait_for(reader.read(), 10)  # closed, no answer
    writer.close()
    async with env.session() as s, s.get(env.url + "/healthz") as r:
        assert r.status == 200


async def test_the_connection_is_kept_alive_between_requests(env: Env) -> None:
    reader, writer = await _raw(env)
    for _ in range(3):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: p\r\n\r\n")
        head, body = await _answer(reader)
        assert head.startswith(b"HTTP/1.1 200 ") and body == b"OK"
    writer.write(b"HEAD /healthz HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert b"Content-Length: 2" in head and await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
