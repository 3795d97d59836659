"""DataImportCron from an HTTP source and from a release stream, the pure parts: the stream
document's artifact and release, an HTTP image's identity (validators, checksum files), the
import each kind makes, the poller pod's environment, and admission."""

from __future__ import annotations

import copy
import datetime as dt
import json
from typing import Any

import pytest

from cdi.api.checksum import Checksum
from cdi.api.config import CDIConfig
from cdi.api.errors import (
    ChecksumFileInvalid,
    InvalidStreamDocument,
    NoValidator,
    StreamArtifactMissing,
)
from cdi.api.httpchange import (
    Validators,
    checksum_identity,
    checksum_url,
    find_checksum,
    image_file_name,
)
from cdi.api.releasestream import Artifact, StreamRelease, parse_stream
from cdi.controller.dataimportcron_desired import (
    ANN_DESIRED_DIGEST,
    ANN_DESIRED_RELEASE,
    ANN_NEXT_CRON_TIME,
    ANN_POLL_ERROR,
    LABEL_STREAM_DIGEST,
    LABEL_STREAM_RELEASE,
    Cron,
    desired_import,
    import_name,
    poll_due,
    poll_error,
    poller_pod,
    release_labels,
)
from cdi.render.importer_pod import ImporterPodConfig
from cdi.webhooks.dataimportcron import validate_dataimportcron

KUBEVIRT_DIGEST = "sha256:" + "ab" * 32
QCOW_SHA = "cd" * 32


def fcos(release: str = "40.20240416.3.1") -> dict[str, Any]:
    """A document shaped like builds.coreos.fedoraproject.org/streams/stable.json."""
    return {
        "stream": "stable",
        "metadata": {"last-modified": "2024-05-01T15:05:01Z", "generator": "fedora-coreos-stream"},
        "architectures": {
            "x86_64": {
                "artifacts": {
                    "qemu": {
                        "release": release,
                        "formats": {
                            "qcow2.xz": {
                                "disk": {
                                    "location": f"https://builds.example/{release}/x86_64/"
                                    f"fedora-coreos-{release}-qemu.x86_64.qcow2.xz",
                                    "signature": "https://builds.example/sig",
                                    "sha256": QCOW_SHA,
                                    "uncompressed-sha256": "ef" * 32,
                                }
                            }
                        },
                    }
                },
                "images": {
                    "kubevirt": {
                        "release": release,
                        "image": "quay.io/fedora/fedora-coreos-kubevirt:stable",
                        "digest-ref": f"quay.io/fedora/fedora-coreos-kubevirt@{KUBEVIRT_DIGEST}",
                    }
                },
            }
        },
    }


def doc(data: dict[str, Any]) -> bytes:
    return json.dumps(data).encode()


# -- the stream document ------------------------------------------------------------------


def test_the_kubevirt_artifact_is_the_containerdisk_by_its_digest_reference() -> None:
    found = parse_stream(doc(fcos()), "x86_64", Artifact.parse("kubevirt"))
    assert found.release == "40.20240416.3.1"
    assert found.stream == "stable"
    assert found.location == f"docker://quay.io/fedora/fedora-coreos-kubevirt@{KUBEVIRT_DIGEST}"
    assert found.digest == KUBEVIRT_DIGEST


def test_a_disk_artifact_is_its_url_and_the_streams_sha256() -> None:
    found = parse_stream(doc(fcos()), "x86_64", Artifact.parse("qemu/qcow2.xz"))
    assert found.location.endswith("-qemu.x86_64.qcow2.xz")
    assert found.digest == f"sha256:{QCOW_SHA}"
    assert StreamRelease.from_record(found.record()) == found


@pytest.mark.parametrize(
    ("mutate", "arch", "artifact", "error", "text"),
    [
        (lambda d: d, "aarch64", "kubevirt", StreamArtifactMissing, "architectures.aarch64"),
        (lambda d: d, "x86_64", "qemu/raw.xz", StreamArtifactMissing, "formats.raw.xz"),
        (lambda d: d, "x86_64", "openstack/qcow2.xz", StreamArtifactMissing, "artifacts.openstack"),
        (
            lambda d: d["architectures"]["x86_64"].pop("images"),
            "x86_64",
            "kubevirt",
            StreamArtifactMissing,
            "x86_64.images",
        ),
        (
            lambda d: d["architectures"]["x86_64"]["images"]["kubevirt"].update(
                {"digest-ref": "quay.io/fedora/fedora-coreos-kubevirt:stable"}
            ),
            "x86_64",
            "kubevirt",
            InvalidStreamDocument,
            "digest-ref",
        ),
        (
            lambda d: d["architectures"]["x86_64"]["artifacts"]["qemu"]["formats"]["qcow2.xz"][
                "disk"
            ].update({"location": "file:///etc/shadow"}),
            "x86_64",
            "qemu/qcow2.xz",
            InvalidStreamDocument,
            "not an http(s) URL",
        ),
        (
            lambda d: d["architectures"]["x86_64"]["artifacts"]["qemu"]["formats"]["qcow2.xz"][
                "disk"
            ].update({"sha256": "12345"}),
            "x86_64",
            "qemu/qcow2.xz",
            InvalidStreamDocument,
            "sha256:<64 hex>",
        ),
        (lambda d: d.pop("architectures"), "x86_64", "kubevirt", InvalidStreamDocument, "stream"),
    ],
)
def test_a_document_without_the_artifact_or_with_a_bad_one_is_refused_with_a_reason(
    mutate: Any, arch: str, artifact: str, error: type[Exception], text: str
) -> None:
    data = fcos()
    mutate(data)
    with pytest.raises(error, match=None) as caught:
        parse_stream(doc(data), arch, Artifact.parse(artifact))
    assert text in str(caught.value)


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b"[1, 2]", b"\xff\xfe", b""])
def test_a_document_that_does_not_parse_is_invalid(body: bytes) -> None:
    with pytest.raises(InvalidStreamDocument):
        parse_stream(body, "x86_64", Artifact.parse("kubevirt"))


@pytest.mark.parametrize("text", ["", "kubevirt/", "qemu", "Qemu/qcow2", "qemu/qcow2/xz", "../x/y"])
def test_artifact_names_are_kubevirt_or_platform_slash_format(text: str) -> None:
    with pytest.raises(ValueError, match="neither"):
        Artifact.parse(text)


def test_a_tampered_release_record_is_refused() -> None:
    record = parse_stream(doc(fcos()), "x86_64", Artifact.parse("kubevirt")).record()
    record["location"] = "docker://evil.example/other@" + "sha256:" + "00" * 32
    with pytest.raises(InvalidStreamDocument, match="another digest"):
        StreamRelease.from_record(record)


# -- an HTTP image's identity -------------------------------------------------------------


def test_validators_name_a_version_and_their_absence_is_no_validator() -> None:
    one = Validators(etag='"abc"', content_length=10).identity("u")
    assert one.startswith("sha256:") and len(one) == 71
    assert Validators(etag='"abd"', content_length=10).identity("u") != one
    assert Validators(etag='"abc"', content_length=11).identity("u") != one
    assert Validators(etag='"abc"', content_length=10).identity("u") == one
    assert Validators(last_modified="Tue, 01 Oct 2024 10:00:00 GMT").identity("u") != one
    with pytest.raises(NoValidator, match="checksumFile"):
        Validators(content_length=10).identity("http://h/disk.img")  # the length alone is not


SUMS = f"""-----BEGIN PGP SIGNED MESSAGE-----
Hash: SHA256

# Fedora-Cloud-41-1.4-x86_64-CHECKSUM
SHA256 (Fedora-Cloud-Base-41-1.4.x86_64.qcow2) = {"11" * 32}
SHA256 (Fedora-Cloud-Base-41-1.4.x86_64.raw.xz) = {"22" * 32}
{"33" * 32}  disk.qcow2
{"44" * 64} *images/disk.raw.gz
-----BEGIN PGP SIGNATURE-----
""".encode()


@pytest.mark.parametrize(
    ("name", "want"),
    [
        ("Fedora-Cloud-Base-41-1.4.x86_64.qcow2", Checksum("sha256", "11" * 32)),
        ("disk.qcow2", Checksum("sha256", "33" * 32)),
        ("disk.raw.gz", Checksum("sha512", "44" * 64)),
    ],
)
def test_checksum_files_in_gnu_and_bsd_style_give_the_images_entry(
    name: str, want: Checksum
) -> None:
    assert find_checksum(SUMS, name, "u") == want


def test_a_checksum_file_without_the_image_is_refused() -> None:
    with pytest.raises(ChecksumFileInvalid, match="lists no sha256"):
        find_checksum(SUMS, "other.qcow2", "u")
    twice = SUMS + f"{'55' * 32}  disk.qcow2\n".encode()
    with pytest.raises(ChecksumFileInvalid, match="different checksums"):
        find_checksum(twice, "disk.qcow2", "u")


def test_the_checksum_identity_is_the_sha256_itself() -> None:
    assert checksum_identity(Checksum("sha256", "11" * 32)) == "sha256:" + "11" * 32
    other = checksum_identity(Checksum("sha512", "44" * 64))
    assert other.startswith("sha256:") and len(other) == 71


def test_the_checksum_file_stays_on_the_images_origin() -> None:
    image = "https://dl.example/pub/41/disk.qcow2?x=1"
    assert checksum_url(image, "SHA256SUMS") == "https://dl.example/pub/41/SHA256SUMS"
    assert checksum_url(image, "../CHECKSUM") == "https://dl.example/pub/CHECKSUM"
    for bad in ("//evil.example/SUMS", "http://dl.example/SUMS", "https://dl.example:8443/S", ""):
        with pytest.raises(ValueError):
            checksum_url(image, bad)
    assert image_file_name("http://h/a/disk%20one.qcow2?x") == "disk one.qcow2"


# -- what the controller makes of a poll ----------------------------------------------------


def cron_obj(source: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "fcos", "namespace": "ns", "uid": "1234567890"},
        "spec": {
            "managedDataSource": "fcos",
            "schedule": "0 */6 * * *",
            "template": {
                "spec": {
                    "source": source,
                    "storage": {"resources": {"requests": {"storage": "1Gi"}}},
                }
            },
            **spec,
        },
    }


STREAM = {
    "stream": {
        "url": "https://builds.example/streams/stable.json",
        "architecture": "x86_64",
        "artifact": "kubevirt",
        "certConfigMap": "ca",
    }
}


def test_a_stream_release_imports_the_digest_reference_and_labels_the_release() -> None:
    found = parse_stream(doc(fcos()), "x86_64", Artifact.parse("kubevirt"))
    cron = Cron.from_obj(cron_obj(STREAM))
    dv = desired_import(cron, found.digest, found.record())
    assert dv["metadata"]["name"] == import_name("fcos", KUBEVIRT_DIGEST) == "fcos-" + "ab" * 6
    assert dv["spec"]["source"] == {"registry": {"certConfigMap": "ca", "url": found.location}}
    node = copy.deepcopy(STREAM)
    node["stream"]["pullMethod"] = "node"
    dv = desired_import(Cron.from_obj(cron_obj(node)), found.digest, found.record())
    assert dv["spec"]["source"]["registry"]["pullMethod"] == "node"
    assert dv["metadata"]["labels"][LABEL_STREAM_RELEASE] == "40.20240416.3.1"
    assert dv["metadata"]["labels"][LABEL_STREAM_DIGEST] == "sha256-" + "ab" * 6
    disk = parse_stream(doc(fcos()), "x86_64", Artifact.parse("qemu/qcow2.xz"))
    stream = copy.deepcopy(STREAM)
    stream["stream"]["artifact"] = "qemu/qcow2.xz"
    dv = desired_import(Cron.from_obj(cron_obj(stream)), disk.digest, disk.record())
    assert dv["spec"]["source"]["http"] == {
        "certConfigMap": "ca",
        "url": disk.location,
        "checksum": f"sha256:{QCOW_SHA}",
    }
    assert all(len(v) <= 63 for v in release_labels(disk.record()).values())


def test_an_http_cron_imports_the_template_with_the_polled_checksum() -> None:
    source = {"http": {"url": "http://h/disk.qcow2", "certConfigMap": "ca"}}
    cron = Cron.from_obj(cron_obj(source, httpPoll={"checksumFile": "SHA256SUMS"}))
    ident = "sha256:" + "11" * 32
    dv = desired_import(cron, ident, {"checksum": ident})
    assert dv["spec"]["source"] == {"http": {**source["http"], "checksum": ident}}
    plain = desired_import(Cron.from_obj(cron_obj(source)), ident, {"validator": 'ETag "x"'})
    assert plain["spec"]["source"] == source


def _env(pod: dict[str, Any]) -> dict[str, str]:
    container = next(c for c in pod["spec"]["containers"] if c["name"] == "importer")
    return {e["name"]: e.get("value", "") for e in container["env"]}


def test_the_poller_pod_reads_the_stream_document_as_an_http_source() -> None:
    config = ImporterPodConfig(image="importer", command=(), cdi_config=CDIConfig())
    env = _env(poller_pod(Cron.from_obj(cron_obj(STREAM)), config))
    assert env["IMPORTER_SOURCE"] == "http"
    assert env["IMPORTER_ENDPOINT"] == STREAM["stream"]["url"]
    assert env["IMPORTER_POLL"] == "stream"
    assert env["IMPORTER_POLL_STREAM_ARCHITECTURE"] == "x86_64"
    assert env["IMPORTER_POLL_STREAM_ARTIFACT"] == "kubevirt"
    assert "IMPORTER_REGISTRY_POLL" not in env
    source = {"http": {"url": "http://h/disk.qcow2"}}
    cron = Cron.from_obj(cron_obj(source, httpPoll={"checksumFile": "SUMS"}))
    env = _env(poller_pod(cron, config))
    assert env["IMPORTER_POLL"] == "http" and env["IMPORTER_POLL_CHECKSUM_FILE"] == "SUMS"


def test_a_permanent_poll_failure_shows_and_waits_to_be_asked() -> None:
    now = dt.datetime(2026, 12, 5, 12, tzinfo=dt.UTC)
    error = json.dumps({"reason": "NoValidator", "message": "no ETag"})
    obj = cron_obj({"http": {"url": "http://h/d"}}, schedule="")
    obj["metadata"]["annotations"] = {ANN_POLL_ERROR: error}
    cron = Cron.from_obj(obj)
    assert poll_error(cron) == (False, "NoValidator", "no ETag")
    assert not poll_due(cron, now), "no schedule: a failed poll is not repeated until asked"
    obj["metadata"]["annotations"][ANN_NEXT_CRON_TIME] = "2000-01-01T00:00:00Z"
    assert poll_due(Cron.from_obj(obj), now)
    registry = cron_obj({"registry": {"url": "docker://q.io/a:b"}})
    registry["metadata"]["annotations"] = {ANN_POLL_ERROR: error}
    assert poll_error(Cron.from_obj(registry)) is None, "registry crons keep CDI's conditions"
    obj["metadata"]["annotations"] = {ANN_DESIRED_DIGEST: "sha256:" + "1" * 64}
    obj["metadata"]["annotations"][ANN_DESIRED_RELEASE] = "{}"
    assert poll_error(Cron.from_obj(obj)) is None


# -- admission ----------------------------------------------------------------------------


def spec_of(source: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"spec": cron_obj(source, **extra)["spec"]}


@pytest.mark.parametrize(
    ("source", "extra"),
    [
        ({"http": {"url": "https://dl.example/disk.qcow2"}}, {}),
        ({"http": {"url": "https://dl.example/d.qcow2"}}, {"httpPoll": {"checksumFile": "SUMS"}}),
        (STREAM, {}),
        ({"stream": {**STREAM["stream"], "artifact": "qemu/qcow2.xz"}}, {}),
    ],
)
def test_http_and_stream_crons_are_admitted(source: dict[str, Any], extra: dict[str, Any]) -> None:
    verdict = validate_dataimportcron(spec_of(source, **extra), None)
    assert verdict.allowed, verdict.causes


@pytest.mark.parametrize(
    ("source", "extra", "message"),
    [
        ({"http": {"url": "ftp://h/d"}}, {}, "spec.source Invalid source URL scheme: ftp://h/d"),
        (
            {"http": {"url": "http://h/d", "checksum": "sha256:" + "1" * 64}},
            {},
            "A DataImportCron sets the http checksum itself (spec.httpPoll.checksumFile)",
        ),
        (
            {"http": {"url": "http://h/d", "extraHeaders": ["no colon"]}},
            {},
            'spec.source.http.extraHeaders[0]: Invalid value: "no colon": must be "Name: value"',
        ),
        (
            {"http": {"url": "http://h/d"}},
            {"httpPoll": {"checksumFile": "http://other/SUMS"}},
            "Illegal checksumFile: checksumFile must be on the image's origin "
            "(same scheme, host, port)",
        ),
        (
            {"registry": {"url": "docker://q.io/a:b"}},
            {"httpPoll": {"checksumFile": "SUMS"}},
            "httpPoll applies to http sources only",
        ),
        (
            {"stream": {**STREAM["stream"], "artifact": "qemu"}},
            {},
            "Illegal stream artifact: artifact 'qemu' is neither 'kubevirt' nor "
            "'<platform>/<format>' (e.g. qemu/qcow2.xz)",
        ),
        (
            {"stream": {**STREAM["stream"], "architecture": "X86 64"}},
            {},
            "Illegal stream architecture 'X86 64'",
        ),
        (
            {"stream": {**STREAM["stream"], "url": "file:///etc/x"}},
            {},
            "spec.source Invalid source URL scheme: file:///etc/x",
        ),
        (
            {"stream": {**STREAM["stream"], "artifact": "qemu/raw", "pullMethod": "node"}},
            {},
            "pullMethod applies to the kubevirt artifact only",
        ),
        (
            {"stream": STREAM["stream"], "http": {"url": "http://h/d"}},
            {},
            "DataImportCron source must be exactly one of registry, pvc, http, stream",
        ),
    ],
)
def test_http_and_stream_crons_are_checked(
    source: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    verdict = validate_dataimportcron(spec_of(source, **extra), None)
    assert [c.message for c in verdict.causes] == [message]
