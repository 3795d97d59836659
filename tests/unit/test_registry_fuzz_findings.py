"""What fuzzing the registry client's parsers found (``tests/fuzz``, targets ``registry-*``): each
input below crashed a parser with an untyped exception before it was fixed; now each is refused
with the typed error the import reports (``UnsupportedManifest``: the DataVolume shows
``UnsupportedFormat``; ``ImagePullFailed`` for the token exchange).

Found by the fuzzer: a token realm that is no URL (``registry-auth``, in 3 s: ``ValueError:
Invalid IPv6 URL`` from ``urlsplit``), a ``mediaType`` that is an object and an image config
whose ``Env`` is a number (``registry-manifest-tree``, in seconds and in 90 s; the byte-level
``registry-manifest`` ran 2 million inputs in 10 minutes without reaching either). Found while
writing the targets and confirmed by hand: JSON nested deeper than Python's recursion limit
(``RecursionError``, in manifests and token answers) and a ``platform`` that is not an object.
"""

from __future__ import annotations

import json

import pytest

from importer.registry.auth import challenge, token_from, token_url
from importer.registry.errors import ImagePullFailed, UnsupportedManifest
from importer.registry.manifest import (
    choose_platform,
    config_labels,
    media_type,
    parse_json,
    parse_manifest,
)

SHA = "sha256:" + "ab" * 32


def test_deeply_nested_json_is_refused_not_a_recursion_error() -> None:
    with pytest.raises(UnsupportedManifest, match="not JSON"):
        parse_json(b"[" * 100_000, "manifest")
    with pytest.raises(ImagePullFailed, match="not JSON"):
        token_from(b'{"token":' * 50_000)


@pytest.mark.parametrize("value", [["a"], {"a": 1}])
def test_a_media_type_that_is_not_a_string_is_refused(value: object) -> None:
    with pytest.raises(UnsupportedManifest, match="mediaType"):
        media_type({"schemaVersion": 2, "mediaType": value, "layers": []}, "")


@pytest.mark.parametrize("platform", [["linux"], "linux/amd64", 7])
def test_an_index_entry_whose_platform_is_not_an_object_is_refused(platform: object) -> None:
    index = {"manifests": [{"digest": SHA, "size": 1, "platform": platform}]}
    with pytest.raises(UnsupportedManifest, match="platform"):
        choose_platform(index, "amd64")
    manifest = {"config": {"digest": SHA, "size": 1, "platform": platform}, "layers": [{}]}
    with pytest.raises(UnsupportedManifest, match="platform"):
        parse_manifest(manifest)


@pytest.mark.parametrize("env", [7, 1.5, True])
def test_an_image_config_env_that_is_not_a_list_gives_no_labels(env: object) -> None:
    assert config_labels(json.loads(json.dumps({"config": {"Env": env}}))) == {}


@pytest.mark.parametrize(
    "realm", ["https://autu]s", "https://[::1", "https://[zz]/token", "https://h:99999999/t"]
)
def test_a_token_realm_that_is_no_url_is_refused(realm: str) -> None:
    found = challenge(f'Bearer realm="{realm}",service="s"')
    assert found is not None
    with pytest.raises(ImagePullFailed, match="unusable token realm"):
        token_url(found, "library/busybox", "https")
