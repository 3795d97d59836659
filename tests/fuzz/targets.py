"""Fuzz targets: feed arbitrary bytes to one parser and accept only typed outcomes.

A target returns normally when the parser either decodes the input or refuses it with a
``WorkerError`` (the typed errors every worker turns into a termination message). Anything
else - an ``IndexError``, a ``struct.error``, a ``MemoryError``, an assertion - propagates and
libFuzzer records the input as a crash. Hangs and memory growth are caught by libFuzzer's
``-timeout`` and ``-rss_limit_mb`` (set in ``__main__``).

The first input byte chooses the chunk size the stream is cut into, so the decoders' chunk
boundary handling is fuzzed along with their tables. Decoded writes are counted, not kept, and
each decoder is told a virtual-size ceiling, as the importer tells it the volume's capacity.

The registry client's parsers (``importer.registry``) read what a registry, its token server or
a DataVolume's URL says, in the order the registry source reads them: a manifest or index
(the first byte picks the Content-Type it came with, or makes the body an image config), a
``WWW-Authenticate`` challenge and the token server's answer, an image reference. Besides
"typed errors only", each checks what its caller relies on: labels that are valid label keys,
a token realm that stays http(s), a reference that reads back the same.

The upload proxy's HTTP/1.1 parser (``wire.http1``) reads what a tenant sends, the way the
proxy reads a client (``http1_request``: heads, their framing and bodies, one request after
another on a kept-alive connection; ``http1_chunked``: a chunked body alone). The input comes
through an in-memory socket cut into receives of a chosen size, whose end is a clean close or
an idle timeout. Besides "``HttpError`` or ``SourceEnded`` only", a head the proxy accepts
must re-encode to the same head (the proxy forwards it: no header can be smuggled in), and a
chunked body must reach the upload server as an unchanged prefix of what was sent.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import types
from collections.abc import Callable, Iterable, Iterator
from urllib.parse import urlsplit

from cdi.api.errors import WorkerError

MAX_VIRTUAL = 64 << 20  # the "volume" each decoder is told it writes into
TAR_CAPACITY = 1 << 20
_CHUNKS = (1, 7, 512, 4096, 65536, 1 << 20)


def _chunks(data: bytes) -> Iterator[bytes]:
    if not data:
        return
    body = data[1:]
    # Tiny chunks for small inputs; never more than 512 of them (a 1 MiB VDI fed byte by byte
    # under instrumentation takes minutes: a harness artefact, not a hang).
    step = max(_CHUNKS[data[0] % len(_CHUNKS)], len(body) // 512)
    for pos in range(0, len(body), step):
        yield body[pos : pos + step]


def _drain(writes: Iterable[tuple[int, bytes | memoryview]]) -> None:
    for offset, piece in writes:
        if offset < 0 or offset + len(piece) > MAX_VIRTUAL:
            raise AssertionError(f"write outside the volume: {offset}+{len(piece)}")


def _decode(make: Callable[[], object], data: bytes) -> None:
    decoder = make()
    try:
        for chunk in _chunks(data):
            _drain(decoder.feed(chunk))  # type: ignore[attr-defined]
        _drain(decoder.finish())  # type: ignore[attr-defined]
    except WorkerError:
        pass


def qcow2(data: bytes) -> None:
    from datapath.decode.qcow2 import Qcow2StreamDecoder

    _decode(lambda: Qcow2StreamDecoder(max_virtual_size=MAX_VIRTUAL), data)


def vmdk(data: bytes) -> None:
    from datapath.decode.vmdk import VmdkStreamDecoder

    _decode(lambda: VmdkStreamDecoder(max_virtual_size=MAX_VIRTUAL), data)


def vdi(data: bytes) -> None:
    from datapath.decode.vdi import VdiStreamDecoder

    _decode(lambda: VdiStreamDecoder(max_virtual_size=MAX_VIRTUAL), data)


def tar(data: bytes) -> None:
    """Extract into a fresh folder, then check nothing escaped it (no link leads outside)."""
    from datapath.decode.archive import extract_tar

    root = tempfile.mkdtemp(prefix="fuzz-tar-", dir=_scratch())
    dest = os.path.join(root, "vol")
    os.mkdir(dest)
    try:
        try:
            extract_tar(_chunks(data), dest, TAR_CAPACITY)
        except WorkerError:
            pass
        _assert_contained(root, dest)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _scratch() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def _assert_contained(root: str, dest: str) -> None:
    if sorted(os.listdir(root)) != ["vol"]:
        raise AssertionError(f"extraction wrote beside the volume: {os.listdir(root)}")
    real_dest = os.path.realpath(dest)
    for folder, dirs, files in os.walk(dest):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if os.path.islink(path):
                resolved = os.path.realpath(path)
                if resolved != real_dest and not resolved.startswith(real_dest + os.sep):
                    raise AssertionError(f"link {path} resolves outside the volume: {resolved}")


_CONTENT_TYPES = (
    "",
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/json; charset=utf-8",
)
_LABEL_KEY = re.compile(r"[a-z0-9.-]{1,253}/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")


def registry_manifest(data: bytes) -> None:
    """A manifest or index as served (selector < 6: with that Content-Type), else a config."""
    from importer.registry import manifest as m

    if not data:
        return
    selector, body = data[0] % (len(_CONTENT_TYPES) + 1), data[1:]
    try:
        if selector == len(_CONTENT_TYPES):
            labels = m.config_labels(m.parse_json(body, "config"))
            for key, value in labels.items():
                if not _LABEL_KEY.fullmatch(key) or not isinstance(value, str):
                    raise AssertionError(f"invalid label {key!r}={value!r}")
            return
        found = m.parse_json(body, "manifest")
        if m.media_type(found, _CONTENT_TYPES[selector]) in m.INDEXES:
            entry = m.choose_platform(found, "amd64")
            assert entry.digest.startswith("sha256:") and entry.size >= 0
        else:
            manifest = m.parse_manifest(found)
            assert 0 < len(manifest.layers) <= m.MAX_LAYERS
    except WorkerError:
        pass


# Words a manifest, an index or an image config is made of: byte-level mutation almost never
# turns valid JSON into other valid JSON of another shape, so ``registry-manifest-tree`` builds
# documents out of these and of arbitrary values instead (structure-aware fuzzing).
_WORDS: tuple[object, ...] = (
    "mediaType", "schemaVersion", "manifests", "layers", "config", "digest", "size",
    "platform", "os", "architecture", "variant", "Env", "Labels", "containers.bootc",
    "ostree.bootable", "linux", "amd64", "1", 2, "sha256:" + "ab" * 32,
    "A_KUBEVIRT_IO_B=c", "KUBEVIRT_IO_=x", *_CONTENT_TYPES,
)  # fmt: skip


class _Bytes:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def next(self) -> int:
        self.pos += 1
        return self.data[self.pos - 1] if self.pos <= len(self.data) else 0

    def value(self, depth: int = 0) -> object:
        kind = self.next() % (9 if depth < 5 else 6)
        if kind == 0:
            return None
        if kind == 1:
            return bool(self.next() & 1)
        if kind == 2:
            return int.from_bytes(bytes(self.next() for _ in range(3)), "big", signed=True)
        if kind in (3, 4):
            return _WORDS[self.next() % len(_WORDS)]
        if kind == 5:
            n = self.next() % 16
            return bytes(self.next() for _ in range(n)).decode("latin-1")
        if kind == 6:
            return [self.value(depth + 1) for _ in range(self.next() % 4)]
        return self.mapping(depth)

    def mapping(self, depth: int = 0) -> dict[str, object]:
        keys = [str(_WORDS[self.next() % len(_WORDS)]) for _ in range(self.next() % 5)]
        return {k: self.value(depth + 1) for k in keys}


def registry_manifest_tree(data: bytes) -> None:
    """``registry_manifest`` on a JSON document built from the input (``_Bytes``)."""
    tree = _Bytes(data[1:]).mapping() if data else {}
    registry_manifest(data[:1] + json.dumps(tree).encode())  # b"" too: imports the parser


def registry_auth(data: bytes) -> None:
    """A ``WWW-Authenticate`` value, a newline, then the token server's answer."""
    from importer.registry import auth

    header, _, body = data[1:].partition(b"\n")
    try:
        found = auth.challenge(header.decode("latin-1"))
        if found is not None:
            url = auth.token_url(found, "library/busybox", "https")
            if urlsplit(url).scheme != "https":
                raise AssertionError(f"an https registry sent us to {url!r}")
        auth.token_from(body)
    except WorkerError:
        pass


def registry_reference(data: bytes) -> None:
    """A DataVolume's ``docker://`` URL; a parsed reference reads back as the same image."""
    from importer.registry.reference import parse_reference

    try:
        ref = parse_reference(data[1:].decode("utf-8", "replace"))
    except WorkerError:
        return
    again = parse_reference(str(ref))
    if (again.registry, again.repository, again.reference) != (
        ref.registry,
        ref.repository,
        ref.reference,
    ):
        raise AssertionError(f"{ref!r} reads back as {again!r}")


class _Idle(TimeoutError):
    """The in-memory client's idle timeout: ``read_head`` lets the socket's errors through
    (the proxy ends the connection on any ``OSError``), the body relay wraps them."""


class _Client:
    """An in-memory client socket (``http1.Socketish``): ``data`` in receives of ``step``
    bytes; at its end a clean close, or (``idle``) the timeout the proxy's socket raises."""

    def __init__(self, data: bytes, step: int, idle: bool) -> None:
        self.data, self.pos, self.step, self.idle = data, 0, step, idle

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        if self.pos >= len(self.data) and self.idle:
            raise _Idle("timed out")
        n = min(nbytes or len(buffer), len(buffer), self.step, len(self.data) - self.pos)
        buffer[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n

    def sendall(self, data: bytes | memoryview) -> None:
        raise AssertionError("the parser wrote to the client")


class _Sink:
    """The upload server's side of the relay: keeps what it is sent (bounded by the input)."""

    def __init__(self) -> None:
        self.got = bytearray()

    def sendall(self, data: bytes | memoryview) -> None:
        self.got += data

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int:
        raise AssertionError("the relay read from the upload server while sending a body")


def _client(data: bytes) -> _Client:
    """Selector byte: the receive size (``_CHUNKS``), and an idle end (bit 7) or a close."""
    return _Client(data[1:], _CHUNKS[data[0] % len(_CHUNKS)], bool(data[0] & 0x80))


def http1_request(data: bytes) -> None:
    """Heads, framing and bodies as the proxy's ``_exchange`` reads them, until the end."""
    from wire import http1

    if not data:
        return
    wire = http1.Wire(_client(data))
    piece = memoryview(bytearray(4096))
    try:
        while (head := wire.read_head()) is not None:
            _check_head(http1, head)
            framing = http1.request_framing(head)
            if framing.kind not in ("none", "length", "chunked") or framing.length < 0:
                raise AssertionError(f"a request framed as {framing}")
            http1.relay_body(wire, _Sink(), framing, piece)
    except (http1.HttpError, http1.SourceEnded, _Idle):
        pass


def _check_head(http1: types.ModuleType, head: object) -> None:
    assert isinstance(head, http1.Head)
    if len(head.headers) > http1.MAX_HEADERS:
        raise AssertionError(f"{len(head.headers)} headers accepted")
    again = http1.Wire(_Client(head.encode(), 1 << 20, False)).read_head()
    if again != head:
        raise AssertionError(f"{head!r} forwards as {again!r}")


def http1_chunked(data: bytes) -> None:
    """A chunked body relayed to the upload server: what it gets is a prefix of the input."""
    from wire import http1

    if not data:
        return
    client, sink = _client(data), _Sink()
    wire = http1.Wire(client)
    try:
        http1.relay_body(wire, sink, http1.Framing("chunked"), memoryview(bytearray(4096)))
    except (http1.HttpError, http1.SourceEnded):
        pass
    if not client.data.startswith(sink.got):
        raise AssertionError("the relayed body is not what the client sent")


TARGETS: dict[str, Callable[[bytes], None]] = {
    "qcow2": qcow2,
    "vmdk": vmdk,
    "vdi": vdi,
    "tar": tar,
    "registry-manifest": registry_manifest,
    "registry-manifest-tree": registry_manifest_tree,
    "registry-auth": registry_auth,
    "registry-reference": registry_reference,
    "http1-request": http1_request,
    "http1-chunked": http1_chunked,
}
# libFuzzer's -max_len per target: big enough for the seeds (a VDI block is 1 MiB).
MAX_LEN = {
    "qcow2": 1 << 17,
    "vmdk": 1 << 16,
    "vdi": (1 << 20) + 8192,
    "tar": 1 << 15,
    "registry-manifest": 1 << 14,
    "registry-manifest-tree": 1 << 12,
    "registry-auth": 1 << 12,
    "registry-reference": 1 << 10,
    "http1-request": 1 << 14,
    "http1-chunked": 1 << 13,
}
# The packages each target's parsers live in: instrumented for coverage (tests.fuzz.child).
INSTRUMENTED = ("datapath", "importer.registry", "wire.http1")
