"""Pure parts of registry imports and DataImportCron: references, challenges, manifests and
labels, the layer overlay (whiteouts, opaque folders, CDI's messages) on tars built here, the
cron's names, pinning and polling, and the cron's admission rules (garbage collection, pvc
sources and snapshots: ``test_cron_lifecycle.py``)."""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import io
import tarfile

import pytest

from cdi.api.errors import InvalidConfig
from cdi.controller.dataimportcron_desired import (
    ANN_DESIRED_DIGEST,
    ANN_NEXT_CRON_TIME,
    Cron,
    import_name,
    next_poll,
    pinned_url,
    poll_due,
)
from cdi.webhooks.dataimportcron import validate_dataimportcron
from importer.registry.auth import challenge, token_url
from importer.registry.errors import DigestMismatch, ImagePullFailed, NoMatchingPlatform
from importer.registry.layers import disk_bytes
from importer.registry.manifest import Descriptor, choose_platform, config_labels
from importer.registry.reference import parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("url", "registry", "repo", "tag", "digest"),
    [
        ("docker://quay.io/kubevirt/fedora:41", "quay.io", "kubevirt/fedora", "41", None),
        ("docker://127.0.0.1:5000/disks/tiny", "127.0.0.1:5000", "disks/tiny", "latest", None),
        ("docker://localhost/a/b@" + DIGEST, "localhost", "a/b", None, DIGEST),
        ("docker://ubuntu", "registry-1.docker.io", "library/ubuntu", "latest", None),
        ("docker://kubevirt/cirros:v1", "registry-1.docker.io", "kubevirt/cirros", "v1", None),
    ],
)
def test_references_are_parsed_like_the_container_tools(
    url: str, registry: str, repo: str, tag: str | None, digest: str | None
) -> None:
    ref = parse_reference(url)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (registry, repo, tag, digest)


@pytest.mark.parametrize(
    "url", ["http://quay.io/a", "docker://quay.io/A/b", "docker://q.io/a@sha256:12", "docker://"]
)
def test_bad_references_are_typed_config_errors(url: str) -> None:
    with pytest.raises(InvalidConfig):
        parse_reference(url)


def test_bearer_challenge_gives_the_token_url_and_refuses_a_downgrade() -> None:
    found = challenge('Bearer realm="https://auth.io/token",service="reg",scope="x:y:pull"')
    assert found is not None and found.scheme == "bearer"
    url = token_url(found, "disks/tiny", "https")
    assert url == "https://auth.io/token?service=reg&scope=repository%3Adisks%2Ftiny%3Apull"
    http_realm = challenge('Bearer realm="http://auth.io/token"')
    assert http_realm is not None
    with pytest.raises(ImagePullFailed):
        token_url(http_realm, "a", "https")


def test_image_env_becomes_valid_labels_only() -> None:
    env = [
        "TEST_KUBEVIRT_IO_TEST=testvalue",
        "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora",
        "X_KUBEVIRT_IO_Y=has spaces",
        "PATH=/bin",
    ]
    assert config_labels({"config": {"Env": env}}) == {
        "test.kubevirt.io/test": "testvalue",
        "instancetype.kubevirt.io/default-preference": "fedora",
    }


def test_index_without_the_platform_gives_cdis_message() -> None:
    entry = {"mediaType": "", "digest": DIGEST, "size": 1, "platform": {"architecture": "arm64"}}
    assert choose_platform({"manifests": [entry]}, "arm64").digest == DIGEST
    with pytest.raises(NoMatchingPlatform) as caught:
        choose_platform({"manifests": [entry]}, "absent")
    assert str(caught.value).endswith('architecture "absent", variant "", OS "linux"')


def _layer(*entries: tuple[str, bytes | None]) -> bytes:
    """A gzip tar: (name, content) files, (name, None) directories."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, content in entries:
            info = tarfile.TarInfo(name)
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return gzip.compress(buf.getvalue())


def _disk(*layers: bytes) -> bytes:
    blobs = {}
    descriptors = []
    for data in layers:
        d = Descriptor("", "sha256:" + hashlib.sha256(data).hexdigest(), len(data))
        blobs[d.digest] = data
        descriptors.append(d)
    return b"".join(disk_bytes(descriptors, lambda d: (c for c in [blobs[d.digest]])))


def test_overlay_picks_the_visible_disk() -> None:
    lower = _layer(("disk", None), ("disk/old.img", b"old" * 100))
    over = _layer(("disk/old.img", b"new" * 100))
    assert _disk(lower, over) == b"new" * 100
    whited = _layer(("disk/.wh.old.img", b""), ("disk/new.img", b"fresh"))
    assert _disk(lower, whited) == b"fresh"
    opaque = _layer(("disk/.wh..wh..opq", b""), ("disk/other.img", b"other"))
    assert _disk(lower, opaque) == b"other"


@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ([_layer(("disk", None))], "directory is empty"),
        ([_layer(("disk/a", b"a"), ("disk/b", b"b"))], "contains more than one file"),
        ([_layer(("disk/a", b"a")), _layer(("disk/b", b"b"))], "contains more than one file"),
        ([_layer(("disk/sub", None), ("disk/a", b"a"))], "contains another directory"),
        ([_layer(("disk/a", b"a")), _layer((".wh.disk", b""))], "directory is empty"),
    ],
)
def test_overlay_refuses_what_cdi_refuses(layers: list[bytes], message: str) -> None:
    with pytest.raises(Exception, match=message):
        _disk(*layers)


def test_a_blob_that_is_not_its_digest_fails() -> None:
    data = _layer(("disk/a", b"a" * 1000))
    d = Descriptor("", "sha256:" + hashlib.sha256(data).hexdigest(), len(data))
    tampered = data[:-1] + bytes([data[-1] ^ 1])
    with pytest.raises(DigestMismatch):
        b"".join(disk_bytes([d], lambda _: (c for c in [tampered])))


def test_cron_names_pins_and_polls() -> None:
    assert import_name("fedora", DIGEST) == "fedora-" + "ab" * 6
    assert pinned_url("docker://r:5000/a/b:latest", DIGEST) == f"docker://r:5000/a/b@{DIGEST}"
    now = dt.datetime(2026, 1, 1, 12, 0, tzinfo=dt.UTC)
    assert next_poll("0 * * * *", now) == dt.datetime(2026, 1, 1, 13, 0, tzinfo=dt.UTC)

    def cron(annotations: dict[str, str]) -> Cron:
        return Cron.from_obj({"metadata": {"name": "c", "annotations": annotations}, "spec": {}})

    assert poll_due(cron({}), now), "at creation"
    assert not poll_due(cron({ANN_DESIRED_DIGEST: DIGEST}), now), "external polling only"
    forced = {ANN_DESIRED_DIGEST: DIGEST, ANN_NEXT_CRON_TIME: "2000-01-01T00:00:00Z"}
    assert poll_due(cron(forced), now)
    retry = {ANN_NEXT_CRON_TIME: "2026-01-01T12:00:30Z"}
    assert not poll_due(cron(retry), now), "a failed poll waits for its retry time"


GOOD = {
    "managedDataSource": "fedora",
    "schedule": "*/5 * * * *",
    "template": {"spec": {"source": {"registry": {"url": "docker://q.io/a/b:latest"}}}},
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"template": {"spec": {"source": {"blank": {}}}}}, "Missing source"),
        ({"schedule": "every minute"}, "Illegal cron schedule"),
        ({"importsToKeep": -1}, "Illegal ImportsToKeep value"),
        ({"garbageCollect": "Sometimes"}, "Illegal GarbageCollect value"),
        ({"managedDataSource": ""}, "Illegal ManagedDataSource value"),
        (
            {"template": {"spec": {**GOOD["template"]["spec"], "contentType": "archive"}}},  # type: ignore[index]
            "Unsettable fields: SourceRef, ContentType, Checkpoints, FinalCheckpoint",
        ),
    ],
)
def test_cron_admission_rules_use_cdis_messages(change: dict, message: str) -> None:  # type: ignore[type-arg]
    assert validate_dataimportcron({"spec": GOOD}, None).allowed
    verdict = validate_dataimportcron({"spec": {**GOOD, **change}}, None)
    assert [c.message for c in verdict.causes] == [message]


def test_cron_spec_cannot_change() -> None:
    verdict = validate_dataimportcron({"spec": {**GOOD, "importsToKeep": 2}}, {"spec": GOOD})
    assert [c.message for c in verdict.causes] == ["Cannot update DataImportCron Spec"]


def test_pvc_gets_only_image_labels_of_the_kubevirt_shape_and_the_digest() -> None:
    from cdi.api.termination import TerminationMessage
    from cdi.controller.registry_result import ANN_SOURCE_DIGEST, result_patch

    message = TerminationMessage(
        reason="Completed",
        message="",
        labels={
            "test.kubevirt.io/test": "testvalue",
            "cdi.kubevirt.io/storage.pod.phase": "Succeeded",  # the controller's own: never
            "evil.example.com/x": "y",
            "a.kubevirt.io/bad": "not a label value",
        },
        source_digest=DIGEST,
    )
    assert result_patch(message) == {
        "metadata": {
            "labels": {"test.kubevirt.io/test": "testvalue"},
            "annotations": {ANN_SOURCE_DIGEST: DIGEST},
        }
    }
    assert result_patch(TerminationMessage(reason="Completed", message="")) is None
