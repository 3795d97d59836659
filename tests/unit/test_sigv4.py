"""The SigV4 signer against AWS's published vectors: the SigV4 test suite (``get-vanilla``
family: credentials AKIDEXAMPLE, 2015-08-30T12:36:00Z, us-east-1, service ``service``) and the
S3 documentation's worked examples (GET Object with a Range header, a presigned URL)."""

from __future__ import annotations

import datetime as dt
from urllib.parse import parse_qs, urlsplit

import pytest

from cdi.api.redact import redact_url
from importer.sources.sigv4 import (
    Credentials,
    canonical_path,
    host_header,
    presign,
    sign_headers,
)

SUITE = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY")
SUITE_AT = dt.datetime(2015, 8, 30, 12, 36, tzinfo=dt.UTC)
S3_DOCS = Credentials("AKIAIOSFODNN7EXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")
S3_AT = dt.datetime(2013, 5, 24, tzinfo=dt.UTC)
SCOPE = "Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request"


@pytest.mark.parametrize(
    ("name", "method", "url", "signature"),
    [
        (
            "get-vanilla",
            "GET",
            "https://example.amazonaws.com/",
            "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
        ),
        (
            "post-vanilla",
            "POST",
            "https://example.amazonaws.com/",
            "5da7c1a2acd57cee7505fc6676e4e544621c30862966e37dddb68e92efbe5d6b",
        ),
        (
            "get-vanilla-query-order-key-case",
            "GET",
            "https://example.amazonaws.com/?Param2=value2&Param1=value1",
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500",
        ),
        (
            "get-unreserved",
            "GET",
            "https://example.amazonaws.com/-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz",
            "07ef7494c76fa4850883e2b006601f940f8a34d404d0cfa977f52a65bbf5f24f",
        ),
    ],
)
def test_signatures_match_the_aws_sigv4_test_suite(
    name: str, method: str, url: str, signature: str
) -> None:
    headers = sign_headers(
        method,
        url,
        SUITE,
        region="us-east-1",
        now=SUITE_AT,
        service="service",
        content_sha256_header=False,
    )
    assert headers["Authorization"] == (
        f"AWS4-HMAC-SHA256 {SCOPE}, SignedHeaders=host;x-amz-date, Signature={signature}"
    ), name
    assert headers["Host"] == "example.amazonaws.com"
    assert headers["X-Amz-Date"] == "20150830T123600Z"


def test_s3_get_object_with_range_matches_the_s3_documentation() -> None:
    headers = sign_headers(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        S3_DOCS,
        region="us-east-1",
        now=S3_AT,
        headers={"Range": "bytes=0-9"},
    )
    assert headers["Authorization"] == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
    )
    assert headers["X-Amz-Content-Sha256"] == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


def test_presigned_url_matches_the_s3_documentation_and_redacts_whole() -> None:
    url = presign(
        "GET",
        "https://examplebucket.s3.amazonaws.com/test.txt",
        S3_DOCS,
        region="us-east-1",
        now=S3_AT,
        expires=86400,
    )
    query = parse_qs(urlsplit(url).query)
    assert query["X-Amz-Signature"] == [
        "aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    ]
    assert query["X-Amz-Credential"] == ["AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request"]
    shown = redact_url(url)
    assert shown == "https://examplebucket.s3.amazonaws.com/test.txt?REDACTED"
    assert "aeeed9" not in shown and "AKIA" not in shown


def test_a_presign_expiry_outside_s3s_bounds_is_refused() -> None:
    with pytest.raises(ValueError):
        presign("GET", "https://h/b/k", S3_DOCS, region="r", now=S3_AT, expires=8 * 24 * 3600)


def test_a_changed_secret_or_time_changes_the_signature() -> None:
    url = "http://127.0.0.1:7070/bucket/disk.img"
    a = sign_headers("GET", url, S3_DOCS, region="us-east-1", now=S3_AT)
    b = sign_headers(
        "GET", url, Credentials(S3_DOCS.access_key_id, "other"), region="us-east-1", now=S3_AT
    )
    c = sign_headers("GET", url, S3_DOCS, region="us-east-1", now=S3_AT + dt.timedelta(seconds=1))
    assert len({a["Authorization"], b["Authorization"], c["Authorization"]}) == 3
    assert S3_DOCS.secret_access_key not in a["Authorization"]


def test_paths_are_encoded_once_whatever_the_user_wrote() -> None:
    assert canonical_path("/bucket/my disk+1.img") == "/bucket/my%20disk%2B1.img"
    assert canonical_path("/bucket/my%20disk%2B1.img") == "/bucket/my%20disk%2B1.img"
    assert canonical_path("") == "/"


def test_host_header_is_what_http_client_sends() -> None:
    assert host_header("http://127.0.0.1:80/b/k") == "127.0.0.1"
    assert host_header("https://S3.example.com:443/b/k") == "s3.example.com"
    assert host_header("http://[::1]:7070/b/k") == "[::1]:7070"


def test_credentials_repr_hides_the_secret() -> None:
    assert "EXAMPLEKEY" not in repr(S3_DOCS)
