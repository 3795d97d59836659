"""``TlsStream``: real TLS through memory BIOs over real socket pairs (our own test PKI): the
handshake both ways with mutual certificates, bytes intact, many records per receive, the end
of the stream, and a certificate that does not match refused."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import pytest

from tests.component.upload_peers import Pki, make_pki
from wire.tlsstream import RECEIVE, SMALL, TlsStream


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


def _in_thread(fn: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    out: list[object] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # handed to the test to assert on
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.fixture
def streams(pki: Pki) -> Iterator[tuple[TlsStream, TlsStream]]:
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    thread, out = _in_thread(lambda: TlsStream.accept(b, pki.peer_serving()))
    client = TlsStream.connect(a, pki.upstream(), "127.0.0.1")
    thread.join(10)
    server = out[0]
    assert isinstance(server, TlsStream)
    try:
        yield client, server
    finally:
        client.close()
        server.close()


def _read(stream: TlsStream, size: int) -> tuple[bytes, int]:
    """``size`` bytes, and how many receives it took."""
    buf, got, calls = memoryview(bytearray(size)), 0, 0
    while got < size:
        n = stream.recv_into(buf[got:])
        assert n, "the stream ended early"
        got, calls = got + n, calls + 1
    return buf.tobytes(), calls


def test_bytes_cross_intact_and_a_receive_takes_many_records(
    streams: tuple[TlsStream, TlsStream],
) -> None:
    client, server = streams
    server.widen()  # what its owner does for a trusted peer
    data = bytes(range(256)) * 16 * 1024  # 4 MiB: 256 records of 16 KiB
    sender, _ = _in_thread(lambda: client.sendall(data))
    got, calls = _read(server, len(data))
    sender.join(10)
    assert got == data
    assert calls < 128  # at least two records per receive on average


def test_a_stream_holds_one_record_of_buffer_until_it_is_widened(
    streams: tuple[TlsStream, TlsStream],
) -> None:
    client, server = streams
    assert len(server.buffer) == len(client.buffer) == SMALL  # a handshake costs little (N3)
    server.widen()
    assert len(server.buffer) == RECEIVE
    client.sendall(b"x" * 100_000)
    got, _ = _read(server, 100_000)
    assert got == b"x" * 100_000


def test_the_peer_presents_its_client_certificate(streams: tuple[TlsStream, TlsStream]) -> None:
    _, server = streams
    cert = server.tls.getpeercert()
    assert cert is not None
    subject = dict(x[0] for x in cert["subject"])  # type: ignore[misc]
    assert subject["commonName"] == "client.upload-server.cdi.kubevirt.io"


def test_a_closed_peer_reads_as_the_end_of_the_stream(
    streams: tuple[TlsStream, TlsStream],
) -> None:
    client, server = streams
    client.sendall(b"last words")
    client.raw.shutdown(socket.SHUT_WR)  # (a close could reset: the tickets it never read)
    assert _read(server, 10)[0] == b"last words"
    assert server.recv_into(memoryview(bytearray(10))) == 0


def test_a_server_certificate_for_another_name_is_refused(pki: Pki) -> None:
    a, b = socket.socketpair()
    a.settimeout(10)
    b.settimeout(10)
    with a, b:
        thread, _ = _in_thread(lambda: TlsStream.accept(b, pki.peer_serving()))
        with pytest.raises(ssl.SSLCertVerificationError):
            TlsStream.connect(a, pki.upstream(), "cdi-upload-other.tenant.svc")
        thread.join(10)
