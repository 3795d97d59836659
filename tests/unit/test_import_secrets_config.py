"""Configuration-time security checks of the importer: extra headers (injection, forbidden
names, a secret header file without a name) are typed ``InvalidConfig`` errors that never echo
a header value; the network policy comes from the pod's env and the CLI's flags; URL redaction
keeps what identifies a source and drops userinfo and query."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cdi.api.errors import InvalidConfig
from cdi.api.netpolicy import NetPolicy
from cdi.api.redact import MARK, redact_text, redact_url
from commands.main import cli_policy, config_from_args
from importer.config import HttpOptions, from_env, split_header
from importer.sources.http_client import userinfo_authorization, without_userinfo


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": "https://example.com/disk.img",
        "IMPORTER_DATA_DIR": str(tmp_path),
        "IMPORTER_SECRET_EXTRA_HEADERS_DIR": str(tmp_path / "extraheaders"),
        **extra,
    }


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("X-A: b\r\nHost: evil", "CR, LF or NUL"),
        ("X-A: b\nX-B: c", "CR, LF or NUL"),
        ("X-A: b\0", "CR, LF or NUL"),
        (": value-only", "no header name"),
        ("value without a colon", "no header name"),
        ("Host: internal.example", "may not be set"),
        ("Connection: close", "may not be set"),
        ("Transfer-Encoding: chunked", "may not be set"),
        ("Proxy-Authorization: Basic eA==", "may not be set"),
        ("Range: bytes=0-", "may not be set"),
        ("X A: b", "not a valid header name"),
        ("X\u00e9: b", "not a valid header name"),
    ],
)
def test_bad_headers_are_invalid_config_without_their_value(text: str, problem: str) -> None:
    with pytest.raises(InvalidConfig, match=problem) as info:
        split_header(text, "IMPORTER_EXTRA_HEADER_0")
    assert "IMPORTER_EXTRA_HEADER_0" in info.value.message
    value = text.partition(":")[2].strip()
    assert not value or value not in info.value.message


def test_env_headers_are_plain_and_mounted_ones_secret(tmp_path: Path) -> None:
    secret = tmp_path / "extraheaders" / "0"
    secret.mkdir(parents=True)
    (secret / "token").write_text("Authorization: Bearer s3cret\n")
    config = from_env(_env(tmp_path, IMPORTER_EXTRA_HEADER_0="X-Plain: yes"))
    assert config.source is not None
    assert config.source.headers == (("X-Plain", "yes"),)
    assert config.source.secret_headers == (("Authorization", "Bearer s3cret"),)


def test_a_secret_header_file_without_a_name_is_named_by_its_file(tmp_path: Path) -> None:
    secret = tmp_path / "extraheaders" / "0"
    secret.mkdir(parents=True)
    (secret / "token").write_text("s3cret-only\n")
    with pytest.raises(InvalidConfig, match="secret header 0/token") as info:
        from_env(_env(tmp_path))
    assert "s3cret" not in info.value.message


@pytest.mark.parametrize(
    "content",
    [
        "Bearer TOPSECRET:xyz",  # a value with a colon: the "name" is the secret
        "tokn QWRTY:zxcvb",
        "Bea\u00dfer SEKRIT: v",  # not ASCII
        "Bearer TOPSECRET",  # no colon at all
        ": ONLYVALUE",
        "Hoost Qzx-Secret: v",
        "Host: internal-SECRET",  # a name the importer may not send
        "Proxy-Authorization: Basic c2VjcmV0",
        "X-Api-Kee: abc\rXSECRET",  # CR/LF/NUL in the value
        "X-Api-Kee: abc\x00XSECRET",
    ],
)
def test_a_malformed_secret_header_file_echoes_none_of_its_content(
    tmp_path: Path, content: str
) -> None:
    """N10: the message becomes the DataVolume's condition and events (readable by ``view``,
    which may not read Secrets), so it names the file and the problem, never a byte of it."""
    secret = tmp_path / "extraheaders" / "0"
    secret.mkdir(parents=True)
    (secret / "auth").write_text(content + "\n")
    with pytest.raises(InvalidConfig) as info:
        from_env(_env(tmp_path))
    message = info.value.message
    assert "secret header 0/auth" in message
    said = message.replace("secret header 0/auth", "")
    leaked = {content[i : i + 4] for i in range(len(content) - 3)} & {
        said[i : i + 4] for i in range(len(said) - 3)
    }
    assert not leaked, message


def test_pod_policy_comes_from_env_and_defaults_to_public_only(tmp_path: Path) -> None:
    default = from_env(_env(tmp_path))
    assert default.source is not None and default.source.policy == NetPolicy()
    env = _env(
        tmp_path,
        IMPORTER_ALLOWED_SOURCE_CIDRS="127.0.0.0/8,fd00::/8",
        IMPORTER_CLUSTER_CIDRS="10.96.0.0/12",
    )
    config = from_env(env)
    assert config.source is not None
    assert config.source.policy == NetPolicy.parse(["127.0.0.0/8", "fd00::/8"], ["10.96.0.0/12"])
    with pytest.raises(InvalidConfig, match="not a CIDR"):
        from_env(_env(tmp_path, IMPORTER_ALLOWED_SOURCE_CIDRS="10.0.0.0/40"))


def test_cli_allows_private_ranges_by_default_but_never_metadata() -> None:
    policy = cli_policy([])
    assert policy.allows("127.0.0.1") and policy.allows("10.1.2.3") and policy.allows("fd00::1")
    assert not policy.allows("169.254.169.254") and not policy.allows("fe80::1")
    strict = cli_policy(["none"])
    assert not strict.allows("127.0.0.1") and strict.allows("8.8.8.8")
    assert cli_policy(["192.168.0.0/16"]).allows("192.168.1.1")
    assert not cli_policy(["192.168.0.0/16"]).allows("127.0.0.1")
    with pytest.raises(InvalidConfig, match="--allow-source-cidr"):
        cli_policy(["nonsense"])


def test_cli_header_files_are_secret_headers(tmp_path: Path) -> None:
    header = tmp_path / "h"
    header.write_text("X-Key: k\n")
    args = argparse.Namespace(
        source="https://example.com/d.img",
        target=str(tmp_path / "disk.img"),
        size=None,
        checksum=None,
        content_type="kubevirt",
        ca=[],
        insecure=False,
        header=["X-Plain: p"],
        header_file=[str(header)],
        username_file=None,
        password_file=None,
        allow_source_cidr=["none"],
        proxy=None,
        no_proxy="",
        preallocate=False,
        bandwidth_limit=None,
        verify=False,
        filesystem_overhead=0.0,
        target_is_zero=False,
        scratch_dir=None,
        termination_message=None,
        metrics_port=None,
        owner_uid="",
        overwrite=False,
    )
    config = config_from_args(args)
    assert config.source is not None
    assert config.source.headers == (("X-Plain", "p"),)
    assert config.source.secret_headers == (("X-Key", "k"),)
    assert config.source.policy == NetPolicy()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://u:p@host:8443/a/b?token=x#f", f"https://{MARK}@host:8443/a/b?{MARK}#{MARK}"),
        ("http://host/disk.img", "http://host/disk.img"),
        ("http://user@[fd00::1]:80/x?a=1", f"http://{MARK}@[fd00::1]:80/x?{MARK}"),
        ("http://[::1/x", MARK),  # unparseable: nothing echoed
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@given(
    st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=4),
    st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=4),
)
def test_redacted_text_never_holds_the_secrets(password: str, token: str) -> None:
    text = f"cannot reach http://user:{password}@h.example/p?t={token} (refused)"
    redacted = redact_text(text)
    assert f":{password}@" not in redacted and f"t={token}" not in redacted
    assert redacted.endswith(" (refused)") and "h.example/p" in redacted


def test_userinfo_is_split_from_the_wire_url() -> None:
    assert without_userinfo("http://a:b@h:1/p?q=1#f") == "http://h:1/p?q=1"
    assert userinfo_authorization("http://a%40x:b@h/") == "Basic YUB4OmI="
    assert userinfo_authorization("http://h/") is None


def test_the_proxy_ca_dir_trusts_the_proxy_and_the_destination(tmp_path: Path) -> None:
    """``IMPORTER_PROXY_CERT_DIR`` (importProxy.trustedCAProxy): its bundles verify an https://
    proxy and, as in CDI, the destination too; the certConfigMap's only the destination."""
    certs, proxycerts = tmp_path / "certs", tmp_path / "proxycerts"
    for folder, name in ((certs, "ca.crt"), (proxycerts, "ca.pem")):
        folder.mkdir()
        (folder / name).write_text("pem")
    (proxycerts / "..data").mkdir()  # a mounted ConfigMap's bookkeeping is no bundle
    env = _env(
        tmp_path,
        IMPORTER_CERT_DIR=str(certs),
        IMPORTER_PROXY_CERT_DIR=str(proxycerts),
        https_proxy="https://proxy.corp:3129",
    )
    http = from_env(env).source
    assert isinstance(http, HttpOptions)
    assert http.proxy_ca_files == (str(proxycerts / "ca.pem"),)
    assert http.ca_files == (str(certs / "ca.crt"), str(proxycerts / "ca.pem"))
    assert http.proxy.for_url("https://example.com/disk.img") == "https://proxy.corp:3129"
