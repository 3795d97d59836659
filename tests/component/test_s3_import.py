"""The S3 source against a real S3 server on loopback (versitygw, ``testkit/s3server.py``):
qcow2 and raw.gz objects through the pod's own env (``from_env`` + ``run_import``), path-style and
virtual-hosted URLs, parallel signed range reads, and the typed refusals: wrong keys
(``SourceForbidden`` naming the server's code, never the secret), a missing object or bucket
(``SourceNotFound``), an endpoint the import policy refuses."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from cdi.api.constants import ImporterEnv
from cdi.api.netpolicy import NetPolicy
from cdi.api.termination import TerminationMessage
from datapath import Processor, TargetSpec
from importer.config import build_plan, from_env
from importer.runner import run_import
from importer.sources.http import HttpOptions
from importer.sources.s3 import S3Options, S3Source, s3_options
from importer.sources.sigv4 import Credentials
from testkit.registry import Tls
from testkit.s3server import S3Server
from tests.component.conftest import ImageFactory, same_content
from tests.component.helpers import LOOPBACK_ALLOWED

BUCKET = "images"
DOMAIN = "s3.test"  # virtual-hosted buckets: <bucket>.s3.test, resolved by the test's resolver


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server(tmp_path_factory.mktemp("s3"), virtual_domain=DOMAIN).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    root = tmp_path_factory.mktemp("s3tls")
    server = S3Server(root / "gw", tls=Tls.make(root / "tls")).start()
    yield server
    server.stop()


def keys(server: S3Server) -> Credentials:
    return Credentials(server.access_key, server.secret_key)


def options(url: str, credentials: Credentials | None, **http: object) -> S3Options:
    http.setdefault("policy", LOOPBACK_ALLOWED)
    base = HttpOptions(url="", backoff_initial=0.01, backoff_max=0.05, **http)  # type: ignore[arg-type]
    return s3_options(url, credentials, base)


async def run_source(source: S3Source, target: Path) -> TerminationMessage:
    plan = build_plan(source.s3, TargetSpec(path=str(target), block=False), scratch_dir=None)
    return await Processor(plan, source).run()


def pod_env(
    server: S3Server, url: str, tmp_path: Path, secret: str | None = None
) -> dict[str, str]:
    """What the controller renders for ``source.s3`` with a ``secretRef``: the Secret mounted
    as files, the import policy as CIDRs."""
    auth = tmp_path / "auth"
    auth.mkdir()
    (auth / "accessKeyId").write_text(server.access_key)
    (auth / "secretKey").write_text(secret if secret is not None else server.secret_key)
    return {
        ImporterEnv.SOURCE: "s3",
        ImporterEnv.ENDPOINT: url,
        ImporterEnv.ACCESS_KEY_ID_FILE: str(auth / "accessKeyId"),
        ImporterEnv.SECRET_KEY_FILE: str(auth / "secretKey"),
        ImporterEnv.ALLOWED_SOURCE_CIDRS: "127.0.0.1/32",
        "IMPORTER_DATA_DIR": str(tmp_path),
        "IMPORTER_BLOCK_PATH": str(tmp_path / "no-block-device"),
        "IMPORTER_SCRATCH_DIR": str(tmp_path),
        "IMPORTER_TERMINATION_PATH": str(tmp_path / "termination"),
    }


async def import_pod_env(env: dict[str, str]) -> TerminationMessage:
    config = from_env(env)
    return await run_import(replace(config, edges=replace(config.edges, metrics_port=None)))


@pytest.mark.parametrize(("kind", "compression"), [("qcow2", None), ("raw", "gz")])
async def test_an_object_imports_through_the_pod_env_with_identical_bytes(
    s3: S3Server, images: ImageFactory, tmp_path: Path, kind: str, compression: str | None
) -> None:
    image = images.make(kind, compression)
    url = s3.put(BUCKET, f"dir/{image.path.name}", image.path)
    result = await import_pod_env(pod_env(s3, url, tmp_path))
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    written = (tmp_path / "termination").read_text()
    assert s3.secret_key not in written and s3.secret_key not in result.message


async def test_ranged_parallel_reads_are_each_signed(
    s3: S3Server, images: ImageFactory, tmp_path: Path
) -> None:
    """Forced to split early (every rate counts as slow), the import reads 1 MiB segments over
    four connections, each request signed on its own; the server accepts every one."""
    image = images.make("raw")
    url = s3.put(BUCKET, "parallel/disk.raw", image.path)
    opts = options(
        url,
        keys(s3),
        parallel_below=float("inf"),
        probe_bytes=1,
        segment_size=1024 * 1024,
    )
    source = S3Source(opts)
    result = await run_source(source, tmp_path / "disk.img")
    assert result.succeeded, result
    assert source.parallel and source.info.ranges and source.info.size == image.path.stat().st_size
    assert same_content(tmp_path / "disk.img", image.reference)


async def test_a_virtual_hosted_url_names_the_bucket_in_the_host(
    s3: S3Server, images: ImageFactory, tmp_path: Path
) -> None:
    """``http://images.s3.test:<port>/key``: the bucket is the host's first label, the Host
    header is signed as sent; the test's resolver gives the name the loopback address (the
    import policy still checks that address)."""
    image = images.make("qcow2")
    s3.put(BUCKET, "virtual/disk.qcow2", image.path)
    url = f"http://{BUCKET}.{DOMAIN}:{s3.port}/virtual/disk.qcow2"
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    source = S3Source(options(url, keys(s3)), resolve=resolve)
    assert source.location.virtual_host and source.location.bucket == BUCKET
    result = await run_source(source, tmp_path / "disk.img")
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert set(asked) == {f"{BUCKET}.{DOMAIN}"}


@pytest.mark.parametrize("wrong", ["access", "secret"])
async def test_wrong_keys_are_a_permanent_refusal_naming_the_servers_code(
    s3: S3Server, images: ImageFactory, tmp_path: Path, wrong: str
) -> None:
    image = images.make("raw", "gz")
    url = s3.put(BUCKET, "forbidden/disk.raw.gz", image.path)
    secret = "WRONG-secret-value-42"
    env = pod_env(s3, url, tmp_path, secret=secret if wrong == "secret" else None)
    if wrong == "access":
        Path(env[ImporterEnv.ACCESS_KEY_ID_FILE]).write_text("NO-SUCH-ACCESS-KEY")
    result = await import_pod_env(env)
    assert result.reason == "SourceForbidden" and not result.transient, result
    code = "InvalidAccessKeyId" if wrong == "access" else "SignatureDoesNotMatch"
    assert code in result.message and s3.endpoint in result.message, result.message
    assert "accessKeyId and secretKey" in result.message
    written = (tmp_path / "termination").read_text()
    for secret_value in (secret, s3.secret_key):
        assert secret_value not in result.message and secret_value not in written
    assert not (tmp_path / "disk.img").exists()


@pytest.mark.parametrize(
    ("bucket", "key", "code"),
    [(BUCKET, "no/such/disk.img", "NoSuchKey"), ("no-such-bucket", "disk.img", "NoSuchBucket")],
)
async def test_a_missing_object_or_bucket_is_source_not_found(
    s3: S3Server, tmp_path: Path, bucket: str, key: str, code: str
) -> None:
    result = await import_pod_env(pod_env(s3, s3.url(bucket, key), tmp_path))
    assert result.reason == "SourceNotFound" and not result.transient, result
    assert code in result.message and repr(key) in result.message, result.message


async def test_the_import_policy_refuses_the_endpoint_before_any_request(
    s3: S3Server, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("raw", "gz")
    url = s3.put(BUCKET, "policy/disk.raw.gz", image.path)
    source = S3Source(options(url, keys(s3), policy=NetPolicy()))
    result = await run_source(source, tmp_path / "disk.img")
    assert result.reason == "SourceForbidden" and "import policy" in result.message, result


@pytest.mark.parametrize("with_ca", [True, False])
async def test_an_https_endpoint_is_trusted_through_the_cert_config_map_only(
    s3_tls: S3Server, images: ImageFactory, tmp_path: Path, with_ca: bool
) -> None:
    """The certConfigMap's files (``IMPORTER_CERT_DIR``) are the CAs an https endpoint is
    verified against, as for http; without them the import fails at once, saying what to do."""
    image = images.make("qcow2")
    url = s3_tls.put(BUCKET, "tls/disk.qcow2", image.path)
    env = pod_env(s3_tls, url, tmp_path)
    if with_ca:
        certs = tmp_path / "certs"
        certs.mkdir()
        assert s3_tls.tls is not None
        (certs / "ca.pem").write_bytes(s3_tls.tls.ca_pem.read_bytes())
        env[ImporterEnv.CERT_DIR] = str(certs)
    result = await import_pod_env(env)
    if with_ca:
        assert result.succeeded, result
        assert same_content(tmp_path / "disk.img", image.reference)
    else:
        assert result.reason == "SourceUnavailable" and not result.transient, result
        assert "certConfigMap" in result.message


async def test_an_endpoint_in_another_region_is_signed_again_for_the_region_it_names(
    tmp_path: Path, images: ImageFactory
) -> None:
    """A non-AWS URL says nothing of the region: the first signature (us-east-1) earns
    ``AuthorizationHeaderMalformed`` with ``<Region>``; the source signs for that region once,
    learns it before the transfer (HEAD has no error body), and reads in parallel ranges."""
    server = S3Server(tmp_path / "gw", region="eu-central-1").start()
    try:
        image = images.make("raw")
        url = server.put(BUCKET, "region/disk.raw", image.path)
        opts = options(
            url, keys(server), parallel_below=float("inf"), probe_bytes=1, segment_size=1 << 20
        )
        source = S3Source(opts)
        result = await run_source(source, tmp_path / "disk.img")
        assert result.succeeded, result
        assert (source.region, source.region_learned) == ("eu-central-1", True)
        assert source.info.size == image.path.stat().st_size and source.parallel
        assert same_content(tmp_path / "disk.img", image.reference)
    finally:
        server.stop()


class CuttingRelay:
    """A TCP relay in front of the server (real bytes both ways) that cuts the first
    connection after ``cut_after`` response bytes, and keeps each request head it relays."""

    def __init__(self, upstream_port: int, cut_after: int) -> None:
        self.upstream_port, self.cut_after = upstream_port, cut_after
        self.heads: list[str] = []
        self.cuts = 0
        self.port = 0

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[CuttingRelay]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        cut = not self.cuts

        async def requests() -> None:
            while data := await reader.read(65536):
                self.heads.append(data.decode("latin-1"))
                up_writer.write(data)
                await up_writer.drain()

        async def responses() -> None:
            sent = 0
            while data := await up_reader.read(65536):
                writer.write(data)
                await writer.drain()
                sent += len(data)
                if cut and not self.cuts and sent > self.cut_after:
                    self.cuts += 1
                    return

        pump = asyncio.ensure_future(requests())
        try:
            await responses()
        finally:
            pump.cancel()
            for w in (writer, up_writer):
                w.transport.abort()


async def test_a_cut_body_resumes_with_a_range_request_signed_afresh(
    s3: S3Server, images: ImageFactory, tmp_path: Path
) -> None:
    """The first response is cut after 4 MiB: the source resumes with ``Range`` on a new
    connection, its request signed again at send time (a clock that ticks a second per
    signature makes each one distinct; the server accepts them all), and the bytes are whole."""
    image = images.make("raw")
    s3.put(BUCKET, "resume/disk.raw", image.path)
    async with CuttingRelay(s3.port, 4 << 20).running() as relay:
        url = f"http://127.0.0.1:{relay.port}/{BUCKET}/resume/disk.raw"
        ticks = itertools.count()
        start = dt.datetime.now(dt.UTC)
        source = S3Source(
            options(url, keys(s3)), clock=lambda: start + dt.timedelta(seconds=next(ticks))
        )
        result = await run_source(source, tmp_path / "disk.img")
    assert result.succeeded, result
    assert relay.cuts == 1 and source.resumed >= 1
    assert same_content(tmp_path / "disk.img", image.reference)
    gets = [h for h in relay.heads if h.startswith("GET ")]
    ranged = [h for h in gets if "\r\nRange: bytes=" in h]
    assert ranged, gets
    signatures = {
        line for h in gets for line in h.split("\r\n") if line.startswith("Authorization")
    }
    assert len(signatures) == len(gets)  # each GET carries its own signature
