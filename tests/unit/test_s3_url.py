"""``source.s3.url`` forms: path-style and virtual-hosted, the signing region, the object URL on
the wire, refusals of URLs that name no object; the pod's env into S3 options."""

from __future__ import annotations

from pathlib import Path

import pytest

from cdi.api.constants import ImporterEnv
from cdi.api.errors import InvalidConfig
from importer.config import from_env
from importer.sources.s3 import S3Options, error_code, error_region, parse_s3_url


@pytest.mark.parametrize(
    ("url", "endpoint", "bucket", "key", "region", "virtual", "wire"),
    [
        (
            "https://mybucket.s3.us-west-2.amazonaws.com/images/disk.qcow2",
            "https://mybucket.s3.us-west-2.amazonaws.com",
            "mybucket",
            "images/disk.qcow2",
            "us-west-2",
            True,
            "https://mybucket.s3.us-west-2.amazonaws.com/images/disk.qcow2",
        ),
        (
            "https://my.dotted.bucket.s3.amazonaws.com/disk.img",
            "https://my.dotted.bucket.s3.amazonaws.com",
            "my.dotted.bucket",
            "disk.img",
            "us-east-1",
            True,
            "https://my.dotted.bucket.s3.amazonaws.com/disk.img",
        ),
        (
            "https://b.s3-eu-west-1.amazonaws.com/k",
            "https://b.s3-eu-west-1.amazonaws.com",
            "b",
            "k",
            "eu-west-1",
            True,
            "https://b.s3-eu-west-1.amazonaws.com/k",
        ),
        (
            "https://s3.eu-central-1.amazonaws.com/bucket/dir/disk.raw.gz",
            "https://s3.eu-central-1.amazonaws.com",
            "bucket",
            "dir/disk.raw.gz",
            "eu-central-1",
            False,
            "https://s3.eu-central-1.amazonaws.com/bucket/dir/disk.raw.gz",
        ),
        (
            "http://127.0.0.1:7070/bucket/my disk.img",
            "http://127.0.0.1:7070",
            "bucket",
            "my disk.img",
            "us-east-1",
            False,
            "http://127.0.0.1:7070/bucket/my%20disk.img",
        ),
        (
            "http://minio.storage.svc:9000/images/cirros.qcow2",
            "http://minio.storage.svc:9000",
            "images",
            "cirros.qcow2",
            "us-east-1",
            False,
            "http://minio.storage.svc:9000/images/cirros.qcow2",
        ),
        (
            "http://user:pw@[::1]:9000/b/k?versionId=3",
            "http://[::1]:9000",
            "b",
            "k",
            "us-east-1",
            False,
            "http://[::1]:9000/b/k?versionId=3",
        ),
    ],
)
def test_url_forms_cdi_accepts_split_into_endpoint_bucket_and_key(
    url: str, endpoint: str, bucket: str, key: str, region: str, virtual: bool, wire: str
) -> None:
    loc = parse_s3_url(url)
    assert (loc.endpoint, loc.bucket, loc.key, loc.region) == (endpoint, bucket, key, region)
    assert loc.virtual_host is virtual
    assert loc.object_url == wire


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:7070/bucket",
        "http://127.0.0.1:7070/bucket/",
        "http://127.0.0.1:7070/",
        "https://bucket.s3.amazonaws.com/",
        "https://bucket.s3.amazonaws.com/dir/",
        "s3://bucket/key",
        "http://[::1/bucket/key",
    ],
)
def test_a_url_that_names_no_object_is_a_typed_config_error(url: str) -> None:
    with pytest.raises(InvalidConfig):
        parse_s3_url(url)


def test_error_codes_are_read_only_as_plain_tokens() -> None:
    body = b"<?xml version='1.0'?><Error><Code>SignatureDoesNotMatch</Code><StringToSign>x"
    assert error_code(body) == "SignatureDoesNotMatch"
    assert error_code(b"<Error><Code>secret key here</Code></Error>") is None
    assert error_code(b"not xml") is None
    malformed = b"<Error><Code>AuthorizationHeaderMalformed</Code><Region>eu-west-1</Region>"
    assert error_region(malformed) == "eu-west-1"
    assert error_region(b"<Region>eu west</Region>") is None


def _env(tmp_path: Path, **files: str) -> dict[str, str]:
    auth = tmp_path / "auth"
    auth.mkdir(parents=True)
    env = {
        ImporterEnv.SOURCE: "s3",
        ImporterEnv.ENDPOINT: "http://10.0.0.5:9000/images/disk.qcow2",
        "IMPORTER_DATA_DIR": str(tmp_path),
        "IMPORTER_BLOCK_PATH": str(tmp_path / "none"),
    }
    for name, value in files.items():
        (auth / name).write_text(value + "\n")
        key = (
            ImporterEnv.ACCESS_KEY_ID_FILE if name == "accessKeyId" else ImporterEnv.SECRET_KEY_FILE
        )
        env[key] = str(auth / name)
    return env


def test_the_pod_env_gives_s3_options_with_the_mounted_key_pair(tmp_path: Path) -> None:
    config = from_env(_env(tmp_path, accessKeyId="AKID", secretKey="s3cret"))
    source = config.source
    assert isinstance(source, S3Options)
    assert source.credentials is not None
    assert (source.credentials.access_key_id, source.credentials.secret_access_key) == (
        "AKID",
        "s3cret",
    )
    assert source.http.url == "http://10.0.0.5:9000/images/disk.qcow2"
    assert source.http.username is None and source.http.password is None
    assert config.plan.checkpoint is not None
    assert config.plan.checkpoint.source_id == "http://10.0.0.5:9000/images/disk.qcow2"


def test_no_secret_is_an_anonymous_request_and_half_a_pair_is_refused(tmp_path: Path) -> None:
    anonymous = from_env(_env(tmp_path)).source
    assert isinstance(anonymous, S3Options) and anonymous.credentials is None
    with pytest.raises(InvalidConfig, match="both accessKeyId and secretKey"):
        from_env(_env(tmp_path / "half", accessKeyId="AKID"))


def test_an_s3_url_without_an_object_fails_at_configuration(tmp_path: Path) -> None:
    env = _env(tmp_path, accessKeyId="AKID", secretKey="s3cret")
    env[ImporterEnv.ENDPOINT] = "http://10.0.0.5:9000/images"
    with pytest.raises(InvalidConfig, match="names no object"):
        from_env(env)
