"""The proxy relay's HTTP/1.1 framing over real socket pairs: heads, lengths, chunked bodies
passed through byte for byte, and which side is blamed when a body stops."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from wire.http1 import (
    Framing,
    Head,
    HttpError,
    SinkFailed,
    SourceEnded,
    Wire,
    relay_body,
    request_framing,
    response_framing,
)


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair()
    a.settimeout(5)
    b.settimeout(5)
    try:
        yield a, b
    finally:
        a.close()
        b.close()


def _read_all(sock: socket.socket) -> bytes:
    got = bytearray()
    while piece := sock.recv(65536):
        got += piece
    return bytes(got)


def head(*headers: tuple[str, str]) -> Head:
    return Head(("POST", "/v1beta1/upload", "HTTP/1.1"), list(headers))


def test_a_content_length_frames_the_request() -> None:
    assert request_framing(head(("Content-Length", "42"))) == Framing("length", 42)
    assert request_framing(head(("content-length", "7"), ("Content-Length", "7"))).length == 7
    assert request_framing(head()).kind == "none"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ((("Content-Length", "1"), ("Transfer-Encoding", "chunked")), 400),  # smuggling
        ((("Content-Length", "1"), ("Content-Length", "2")), 400),
        ((("Content-Length", "-1"),), 400),
        ((("Content-Length", "0x10"),), 400),
        ((("Content-Length", "\u00b9"),), 400),  # "¹".isdigit(): found by tests/fuzz
        ((("Content-Length", "1\u00b2"),), 400),
        ((("Transfer-Encoding", "gzip, chunked"),), 501),
    ],
)
def test_ambiguous_or_unsupported_framing_is_refused(
    headers: tuple[tuple[str, str], ...], status: int
) -> None:
    with pytest.raises(HttpError) as err:
        request_framing(head(*headers))
    assert err.value.status == status


def test_a_response_to_head_or_204_has_no_body_and_one_without_length_ends_at_close() -> None:
    ok = Head(("HTTP/1.1", "200", "OK"), [("Content-Length", "9")])
    assert response_framing(ok, "HEAD").kind == "none"
    assert response_framing(Head(("HTTP/1.1", "204", "No Content")), "POST").kind == "none"
    assert response_framing(Head(("HTTP/1.1", "200", "OK")), "POST").kind == "close"
    assert response_framing(ok, "POST") == Framing("length", 9)


def test_a_head_split_across_receives_is_parsed_and_the_rest_is_the_body(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.sendall(b"POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nContent-Le")
    a.sendall(b"ngth: 5\r\nX-Empty:\r\n\r\nhello")
    wire = Wire(b)
    got = wire.read_head()
    assert got is not None
    assert got.start == ("POST", "/v1beta1/upload", "HTTP/1.1")
    assert (got.get("content-length"), got.get("X-Empty")) == ("5", "")
    buf = memoryview(bytearray(16))
    assert buf[: wire.recv_into(buf)].tobytes() == b"hello"


def test_a_closed_connection_before_a_head_is_none(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    a.close()
    assert Wire(b).read_head() is None


@pytest.mark.parametrize(
    "raw",
    [
        b"POST /x HTTP/1.1\r\nX-A: 1\nX-Smuggled: 2\r\n\r\n",  # a bare LF
        b"POST /x HTTP/1.1\r\n Folded: 1\r\n\r\n",
        b"POST /x HTTP/1.1\r\nNo colon\r\n\r\n",
        b"POST\r\n\r\n",
    ],
)
def test_malformed_heads_are_refused(pair: tuple[socket.socket, socket.socket], raw: bytes) -> None:
    a, b = pair
    a.sendall(raw)
    with pytest.raises(HttpError):
        Wire(b).read_head()


def test_a_head_larger_than_the_limit_is_431(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    sender = threading.Thread(
        target=lambda: a.sendall(b"POST /x HTTP/1.1\r\nX: " + b"y" * 70_000), daemon=True
    )
    sender.start()
    with pytest.raises(HttpError) as err:
        Wire(b).read_head()
    assert err.value.status == 431


def _relay(raw: bytes, framing: Framing) -> tuple[int, bytes]:
    src_a, src_b = socket.socketpair()
    dst_a, dst_b = socket.socketpair()
    with src_a, src_b, dst_a, dst_b:
        threading.Thread(target=src_a.sendall, args=(raw,), daemon=True).start()
        done = relay_body(Wire(src_b), dst_a, framing, memoryview(bytearray(1000)))
        dst_a.close()
        return done, _read_all(dst_b)


def test_a_chunked_body_passes_through_unchanged_with_its_trailers() -> None:
    body = b"5;ext=1\r\nhello\r\n" + b"7d0\r\n" + b"z" * 2000 + b"\r\n0\r\nX-Trailer: t\r\n\r\n"
    done, out = _relay(body + b"NEXT REQUEST", Framing("chunked"))
    assert (done, out) == (2005, body)


def test_a_length_body_is_copied_exactly_and_no_further() -> None:
    data = bytes(range(256)) * 40
    done, out = _relay(data + b"GET /next", Framing("length", len(data)))
    assert (done, out) == (len(data), data)


def test_a_body_that_ends_early_blames_the_source() -> None:
    src_a, src_b = socket.socketpair()
    dst_a, dst_b = socket.socketpair()
    with src_a, src_b, dst_a, dst_b:
        src_a.sendall(b"x" * 100)
        src_a.close()
        with pytest.raises(SourceEnded, match="after 100 of 1000"):
            relay_body(Wire(src_b), dst_a, Framing("length", 1000), memoryview(bytearray(64)))


def test_a_receiver_that_went_away_blames_the_sink() -> None:
    src_a, src_b = socket.socketpair()
    dst_a, dst_b = socket.socketpair()
    with src_a, src_b, dst_a, dst_b:
        dst_b.close()
        src_a.sendall(b"x" * 100)
        with pytest.raises(SinkFailed):
            relay_body(Wire(src_b), dst_a, Framing("length", 100), memoryview(bytearray(64)))


def test_a_chunk_longer_than_its_size_is_refused() -> None:
    with pytest.raises(HttpError):
        _relay(b"2\r\nabc\r\n0\r\n\r\n", Framing("chunked"))


@pytest.mark.parametrize("size", [b"0x5", b"+5", b"5_0", b"-1", b"", b"5 5", b"\xb9"])
def test_a_chunk_size_other_than_hex_digits_is_refused(size: bytes) -> None:
    """RFC 9112's 1*HEXDIG: the line is passed on unchanged, so the upload server must not
    be able to read it as another size than the proxy did."""
    src_a, src_b = socket.socketpair()
    dst_a, dst_b = socket.socketpair()
    with src_a, src_b, dst_a, dst_b:
        src_a.sendall(size + b"\r\nhello\r\n0\r\n\r\n")
        src_a.close()  # a size read as larger ends as SourceEnded, never a hang
        with pytest.raises(HttpError, match="malformed chunk size"):
            relay_body(Wire(src_b), dst_a, Framing("chunked"), memoryview(bytearray(64)))
