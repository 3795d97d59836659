"""The GCS source against a real GCS emulator on loopback (fake-gcs-server,
``testkit/gcsserver.py``) and a real OAuth token endpoint (``testkit.gcsserver.TokenServer``,
since fake-gcs-server has none): a public object without a secret and a private one with a
service-account key, through the pod's own env (``from_env`` + ``run_import``), gs:// URLs on
the ``STORAGE_EMULATOR_HOST`` endpoint and the https form, parallel ranged reads with the Bearer
token, and the typed refusals: a key the token endpoint does not accept (``SourceForbidden``
naming the refusal, never the key), a missing object or bucket (``SourceNotFound``), a malformed
key file and URL (``InvalidConfig``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from cdi.api.constants import ImporterEnv
from cdi.api.errors import InvalidConfig
from cdi.api.termination import TerminationMessage
from datapath import Processor, TargetSpec
from importer.config import build_plan, from_env
from importer.runner import run_import
from importer.sources.gcs import (
    GcsSource,
    emulator_endpoint,
    gcs_options,
    parse_gcs_url,
    service_account,
)
from importer.sources.http import HttpOptions
from testkit.gcsserver import GcsServer, ServiceAccountKey
from tests.component.conftest import ImageFactory, same_content
from tests.component.helpers import LOOPBACK_ALLOWED

BUCKET = "images"


@pytest.fixture(scope="module")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsServer]:
    server = GcsServer(tmp_path_factory.mktemp("gcs")).start()
    yield server
    server.stop()


def pod_env(
    server: GcsServer, url: str, tmp_path: Path, credentials: str | None = None
) -> dict[str, str]:
    """What the controller renders for ``source.gcs``: the Secret's ``credentials.json``
    mounted as a file (CDI's ``/google``), the emulator as the gs:// endpoint, the import
    policy as CIDRs."""
    env = {
        ImporterEnv.SOURCE: "gcs",
        ImporterEnv.ENDPOINT: url,
        "STORAGE_EMULATOR_HOST": server.emulator_host,
        ImporterEnv.ALLOWED_SOURCE_CIDRS: "127.0.0.1/32",
        "IMPORTER_DATA_DIR": str(tmp_path),
        "IMPORTER_BLOCK_PATH": str(tmp_path / "no-block-device"),
        "IMPORTER_SCRATCH_DIR": str(tmp_path),
        "IMPORTER_TERMINATION_PATH": str(tmp_path / "termination"),
    }
    if credentials is not None:
        google = tmp_path / "google"
        google.mkdir()
        (google / "credentials.json").write_text(credentials)
        env[ImporterEnv.GOOGLE_APPLICATION_CREDENTIALS] = str(google / "credentials.json")
    return env


async def import_pod_env(env: dict[str, str]) -> TerminationMessage:
    config = from_env(env)
    return await run_import(replace(config, edges=replace(config.edges, metrics_port=None)))


async def test_a_public_object_imports_without_a_secret(
    gcs: GcsServer, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    url = gcs.put(BUCKET, "public/disk.qcow2", image.path)
    assert gcs.tokens is not None
    granted = len(gcs.tokens.granted)
    result = await import_pod_env(pod_env(gcs, url, tmp_path))
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert len(gcs.tokens.granted) == granted  # anonymous: no token asked for


async def test_the_operators_gcs_endpoint_wins_over_storage_emulator_host(
    gcs: GcsServer, images: ImageFactory, tmp_path: Path
) -> None:
    """``IMPORTER_GCS_ENDPOINT`` (CDIConfig ``spec.gcsEndpoint``) is where gs:// URLs are
    read, whatever ``STORAGE_EMULATOR_HOST`` says (here: a port nothing listens on)."""
    image = images.make("qcow2")
    url = gcs.put(BUCKET, "endpoint/disk.qcow2", image.path)
    assert url.startswith("gs://")
    env = pod_env(gcs, url, tmp_path)
    env["STORAGE_EMULATOR_HOST"] = "127.0.0.1:9"
    env[ImporterEnv.GCS_ENDPOINT] = gcs.endpoint
    result = await import_pod_env(env)
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)


@pytest.mark.parametrize(("kind", "compression"), [("qcow2", None), ("raw", "gz")])
async def test_a_service_account_key_gets_a_token_and_imports_identical_bytes(
    gcs: GcsServer, images: ImageFactory, tmp_path: Path, kind: str, compression: str | None
) -> None:
    image = images.make(kind, compression)
    url = gcs.put(BUCKET, f"private dir/{image.path.name}", image.path)  # a space: encoded
    assert gcs.tokens is not None
    granted = len(gcs.tokens.granted)
    credentials = gcs.credentials_json()
    result = await import_pod_env(pod_env(gcs, url, tmp_path, credentials))
    assert result.succeeded, result
    assert same_content(tmp_path / "disk.img", image.reference)
    new = gcs.tokens.granted[granted:]
    assert new == [(gcs.account.email, "https://www.googleapis.com/auth/devstorage.read_only")]
    written = (tmp_path / "termination").read_text()
    assert gcs.account.private_pem not in written + result.message


async def test_the_https_form_names_the_endpoint_and_parallel_ranges_carry_the_token(
    gcs: GcsServer, images: ImageFactory, tmp_path: Path
) -> None:
    """Forced to split early, the import reads 1 MiB segments over four connections from the
    https-form URL (its host is the endpoint); one token serves every request."""
    image = images.make("raw")
    gcs.put(BUCKET, "parallel/disk.raw", image.path)
    url = gcs.https_url(BUCKET, "parallel/disk.raw")
    account = service_account(gcs.credentials_json())
    base = HttpOptions(
        url="",
        policy=LOOPBACK_ALLOWED,
        parallel_below=float("inf"),
        probe_bytes=1,
        segment_size=1024 * 1024,
        backoff_initial=0.01,
        backoff_max=0.05,
    )
    source = GcsSource(gcs_options(url, account, base))
    target = tmp_path / "disk.img"
    plan = build_plan(source.gcs, TargetSpec(path=str(target), block=False), scratch_dir=None)
    result = await Processor(plan, source).run()
    assert result.succeeded, result
    assert source.parallel
    assert source.tokens is not None and source.tokens.fetched == 1
    assert same_content(target, image.reference)


async def test_a_key_the_token_endpoint_refuses_is_a_permanent_forbidden_without_the_key(
    gcs: GcsServer, images: ImageFactory, tmp_path: Path
) -> None:
    """A key the account does not have (as after a key is deleted): Google's
    ``invalid_grant``, named; neither key nor assertion in the message; no retry loop."""
    image = images.make("raw")
    url = gcs.put(BUCKET, "refused/disk.raw", image.path)
    stranger = ServiceAccountKey.generate(gcs.account.email)  # same account, another key
    assert gcs.tokens is not None
    refused = gcs.tokens.refused
    result = await import_pod_env(pod_env(gcs, url, tmp_path, gcs.credentials_json(stranger)))
    assert not result.succeeded
    assert result.reason == "SourceForbidden", result
    assert "invalid_grant" in result.message and gcs.account.email in result.message
    assert stranger.private_pem.splitlines()[1] not in result.message
    assert gcs.tokens.refused - refused <= 2  # the HEAD probe and the GET: not retried
    assert not (tmp_path / "disk.img").exists() or (tmp_path / "disk.img").stat().st_size == 0


@pytest.mark.parametrize("what", ["object", "bucket"])
async def test_a_missing_object_or_bucket_is_source_not_found(
    gcs: GcsServer, images: ImageFactory, tmp_path: Path, what: str
) -> None:
    gcs.put(BUCKET, "present.raw", images.make("raw").path)
    url = f"gs://{BUCKET}/absent.raw" if what == "object" else "gs://no-such-bucket/disk.raw"
    result = await import_pod_env(pod_env(gcs, url, tmp_path, gcs.credentials_json()))
    assert not result.succeeded
    assert result.reason == "SourceNotFound", result
    assert "absent.raw" in result.message or "no-such-bucket" in result.message


@pytest.mark.parametrize(
    "url", ["gs://bucket-only", "gs://bucket/", "gs:///object", "ftp://host/b/o", "gs://b/dir/"]
)
def test_a_url_naming_no_object_is_invalid_config(url: str) -> None:
    with pytest.raises(InvalidConfig, match="GCS URL"):
        parse_gcs_url(url)


def test_url_forms_map_to_the_media_url() -> None:
    assert (
        parse_gcs_url("gs://b/dir/a b.img").object_url
        == "https://storage.googleapis.com/storage/v1/b/b/o/dir%2Fa%20b.img?alt=media"
    )
    emulator = emulator_endpoint("127.0.0.1:4443")
    assert parse_gcs_url("gs://b/o", emulator).object_url == (
        "http://127.0.0.1:4443/storage/v1/b/b/o/o?alt=media"
    )
    browser = parse_gcs_url("https://storage.cloud.google.com/b/o.img")
    assert browser.object_url.startswith("https://storage.googleapis.com/storage/v1/b/b/o/")
    # the https form's host is the endpoint, whatever STORAGE_EMULATOR_HOST says
    assert parse_gcs_url("http://10.0.0.1:9000/b/o", emulator).endpoint == "http://10.0.0.1:9000"


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("not json", "not JSON"),
        ('{"type": "authorized_user"}', "not a service-account key"),
        ('{"client_email": "a@b"}', "no private_key"),
    ],
)
def test_a_malformed_key_file_is_invalid_config_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(InvalidConfig, match=field):
        service_account(text)


async def test_a_private_key_that_is_not_pem_is_invalid_config_unquoted(
    gcs: GcsServer, tmp_path: Path
) -> None:
    bogus = '{"client_email": "a@b.example", "private_key": "s3cret-not-a-key"}'
    result = await import_pod_env(pod_env(gcs, f"gs://{BUCKET}/x.raw", tmp_path, bogus))
    assert result.reason == "InvalidConfig", result
    assert "s3cret" not in result.message
