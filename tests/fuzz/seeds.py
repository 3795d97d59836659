"""A small valid corpus per target, built by the same builders the unit tests use.

Each seed starts with the chunk-size selector byte (``targets._chunks``; for the registry
targets it picks the manifest's Content-Type or is ignored). Seeds cover the
layouts the decoders branch on (ordered, tables after data, compressed, zero entries,
extended L2, version 2, zstd) so the fuzzer starts from inputs that reach deep code.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

from tests.unit import qcow2_builder as q
from tests.unit.disk_builders import VdiSpec, VmdkSpec, build_vdi, build_vmdk

_DATA = bytes(range(256)) * 2


def _qcow2() -> list[bytes]:
    base = {0: _DATA, 3: b"\x01" * 512, 100: _DATA}
    specs = [
        q.Spec(data=dict(base)),
        q.Spec(data=dict(base), compressed={3}, zero={5}),
        q.Spec(data=dict(base), version=2, header_length=72),
        q.Spec(data=dict(base), extended_l2=True, cluster_bits=12),
        q.Spec(data=dict(base), layout="data-first"),
        q.Spec(data=dict(base), layout="l1-last"),
        q.Spec(data=dict(base), compressed={0, 3}, zstd=True),
    ]
    return [q.build(spec) for spec in specs]


def _vmdk() -> list[bytes]:
    grains = {0: b"\x02" * 4096, 5: b"\x03" * 100}
    specs = [
        VmdkSpec(grains=dict(grains)),
        VmdkSpec(grains=dict(grains), zeroed={2}, order=[5, 0]),
        VmdkSpec(grains=dict(grains), compressed=True, version=3),
        VmdkSpec(grains=dict(grains), gd_at_end=True),
        VmdkSpec(grains=dict(grains), grains_first=True),
    ]
    return [build_vmdk(spec) for spec in specs]


def _vdi() -> list[bytes]:
    specs = [
        VdiSpec(disk_size=2 << 20, blocks={1: b"\x04" * 1000}),
        VdiSpec(disk_size=2 << 20, blocks={0: b"\x05" * 10}, zero={1}),
        VdiSpec(disk_size=2 << 20, blocks={1: b"\x06"}, map_after_data=True),
        VdiSpec(disk_size=3 << 20, blocks={}, zero={0, 2}),
    ]
    return [build_vdi(spec) for spec in specs]


def _tar() -> list[bytes]:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as archive:
        _add(archive, "dir/", tarfile.DIRTYPE)
        _add(archive, "dir/file.txt", tarfile.REGTYPE, b"hello\n")
        _add(archive, "dir/link", tarfile.SYMTYPE, link="file.txt")
        _add(archive, "hard", tarfile.LNKTYPE, link="dir/file.txt")
        _add(archive, "disk/disk.img", tarfile.REGTYPE, b"\0" * 1024)
    pax = io.BytesIO()
    with tarfile.open(fileobj=pax, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _add(archive, "long/" + "n" * 120, tarfile.REGTYPE, b"x")
    return [out.getvalue(), pax.getvalue()]


def _add(
    archive: tarfile.TarFile, name: str, kind: bytes, data: bytes = b"", link: str = ""
) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, len(data), link
    archive.addfile(info, io.BytesIO(data) if data else None)


_SHA = "sha256:" + "ab" * 32


def _blob(media: str, size: int = 1234, **extra: object) -> dict[str, object]:
    return {"mediaType": media, "digest": _SHA, "size": size, **extra}


def _registry_manifest() -> list[bytes]:
    layer = "application/vnd.oci.image.layer.v1.tar+gzip"
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _blob("application/vnd.oci.image.config.v1+json"),
        "layers": [_blob(layer), _blob(layer, 99)],
    }
    docker = {**manifest, "mediaType": "application/vnd.docker.distribution.manifest.v2+json"}
    index = {
        "schemaVersion": 2,
        "manifests": [
            _blob("", platform={"os": "linux", "architecture": "arm64", "variant": "v8"}),
            _blob("application/vnd.oci.image.manifest.v1+json", platform={"architecture": "amd64"}),
        ],
    }
    config = {
        "architecture": "amd64",
        "config": {
            "Env": ["PATH=/bin", "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora"],
            "Labels": {"org.opencontainers.image.title": "disk"},
        },
    }
    bodies = [manifest, docker, index, {k: v for k, v in manifest.items() if k != "mediaType"}]
    return [json.dumps(b).encode() for b in [*bodies, config]]


def _registry_auth() -> list[bytes]:
    return [
        b'Bearer realm="https://auth.example/token",service="registry.example",'
        b'scope="repository:library/busybox:pull"\n{"token":"abc","expires_in":300}',
        b'Bearer realm="https://auth.example/token?a=1", error="invalid_token"\n'
        b'{"access_token":"t.u.v"}',
        b'Basic realm="registry"\n{}',
    ]


def _registry_reference() -> list[bytes]:
    return [
        b"docker://quay.io/containerdisks/fedora:39",
        b"docker://busybox",
        b"docker://localhost:5000/a/b@" + _SHA.encode(),
        b"docker://[::1]:5000/x/y:v1.2_3",
    ]


def _registry_manifest_tree() -> list[bytes]:
    """Bytes that ``targets._Bytes`` reads as small manifests and indexes."""
    return [bytes(range(0, 256, 7)), bytes(range(255, 0, -5)), b"\x04\x03\x07\x02\x08" * 20]


_AUTH = b"Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.eyJwdmMiOiJkdiJ9.c2ln\r\n"


def _http1_request() -> list[bytes]:
    """Valid uploads (a length, chunked, kept-alive pairs) and heads the parser refuses."""
    post = b"POST /v1beta1/upload HTTP/1.1\r\nHost: cdi-uploadproxy\r\n" + _AUTH
    return [
        post + b"Content-Type: application/octet-stream\r\nContent-Length: 5\r\n\r\nhello",
        post + b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
        b"5;ext=1\r\nhello\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"\r\nGET /healthz HTTP/1.1\r\n\r\nHEAD /healthz HTTP/1.0\r\nConnection: close\r\n\r\n",
        b"OPTIONS /v1beta1/upload-async?x=1 HTTP/1.1\r\nOrigin: https://ui\r\n"
        b"Access-Control-Request-Headers: authorization\r\n\r\n"
        + post.replace(b"POST", b"PATCH")
        + b"Content-Length: 3, 3\r\n\r\nabc",
        post + b"Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",  # CL+TE
        post + b"Transfer-Encoding: gzip, chunked\r\n\r\n",
        post + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        post + b"Content-Length: +1\r\n\r\nx",
        post + b"X-Bare: a\rb\r\nX-Lf: a\nb\r\nX-Nul: \x00\r\n\r\n",
        post + b"Bad Name: x\r\n :folded\r\n\tcontinued\r\nNoColon\r\n\r\n",
        b"POST  HTTP/1.1\r\n\r\n" + b"X-H: v\r\n" * 130 + b"\r\n",
        post + b"X-Long: " + b"a" * 2000,  # a head the connection ends inside
    ]


def _http1_chunked() -> list[bytes]:
    return [
        b"5\r\nhello\r\n0\r\n\r\n",
        b"A;name=value\r\n0123456789\r\n1\r\nx\r\n0\r\nTrailer: a\r\nT2: b\r\n\r\n",
        b"3\r\nabcd\r\n0\r\n\r\n",  # longer than its size
        b"-1\r\nx\r\n",
        b"0x5\r\nhello\r\n0\r\n\r\n",
        b"ffffffffffffffff\r\nshort",
        b"z\r\n\r\n",
        b"4\r\nabc",
    ]


SEEDS = {
    "qcow2": _qcow2,
    "vmdk": _vmdk,
    "vdi": _vdi,
    "tar": _tar,
    "registry-manifest": _registry_manifest,
    "registry-manifest-tree": _registry_manifest_tree,
    "registry-auth": _registry_auth,
    "registry-reference": _registry_reference,
    "http1-request": _http1_request,
    "http1-chunked": _http1_chunked,
}


# The first bytes each seed is written with; registry-manifest: three Content-Types and 6,
# "the body is an image config" (targets.registry_manifest).
# http1: receives of 1 byte, 512 bytes and 64 KiB; the last also ends in an idle timeout.
SELECTORS = {
    "registry-manifest": (0, 2, 4, 6),
    "http1-request": (0, 2, 0x80 | 4),
    "http1-chunked": (0, 2, 0x80 | 4),
}


def write_corpus(target: str, folder: str) -> int:
    """Write the target's seeds (each with a few selectors) into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    count = 0
    for i, image in enumerate(SEEDS[target]()):
        for selector in SELECTORS.get(target, (0, 2, 4)):
            with open(os.path.join(folder, f"seed-{i}-{selector}"), "wb") as fh:
                fh.write(bytes([selector]) + image)
            count += 1
    return count
