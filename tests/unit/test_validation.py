"""The DataVolume validating webhook rejects what CDI rejects, with CDI's messages.

One table row per case of the reference's §6.5 table (and the rules behind it), plus the rules
this project adds. Each row starts from a valid manifest and changes one thing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from cdi.webhooks.validation import (
    CauseType,
    StaticLookup,
    ValidationResult,
    validate_datavolume,
)

Manifest = dict[str, Any]
Edit = Callable[[Manifest], None]

SHA256 = "sha256:" + "ab" * 32


def manifest() -> Manifest:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": "dv", "namespace": "ns", "uid": "uid-1"},
        "spec": {
            "source": {"http": {"url": "https://images.example/disk.qcow2"}},
            "pvc": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    }


def edited(*edits: Edit) -> Manifest:
    m = manifest()
    for edit in edits:
        edit(m)
    return m


def spec(**fields: Any) -> Edit:
    def apply(m: Manifest) -> None:
        for key, value in fields.items():
            if value is None:
                m["spec"].pop(key, None)
            else:
                m["spec"][key] = value

    return apply


def source(value: Any) -> Edit:
    return spec(source=value)


def size(value: Any) -> Edit:
    return lambda m: m["spec"]["pvc"]["resources"]["requests"].__setitem__("storage", value)


def pvc(**fields: Any) -> Edit:
    def apply(m: Manifest) -> None:
        for key, value in fields.items():
            if value is None:
                m["spec"]["pvc"].pop(key, None)
            else:
                m["spec"]["pvc"][key] = value

    return apply


def to_storage(m: Manifest) -> None:
    m["spec"]["storage"] = m["spec"].pop("pvc")


def http(**fields: Any) -> Edit:
    return source({"http": {"url": "https://images.example/disk.qcow2", **fields}})


def registry(**fields: Any) -> Edit:
    return source({"registry": fields})


IMAGEIO = {
    "url": "https://engine.example/ovirt-engine/api",
    "diskId": "d1",
    "secretRef": "engine-secret",
    "certConfigMap": "engine-ca",
}
VDDK = {
    "url": "https://vcenter.example/",
    "uuid": "u1",
    "backingFile": "[ds] vm/vm.vmdk",
    "thumbprint": "AA:BB",
    "secretRef": "vddk-secret",
}

ACCESS = '"ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"'
QUANTITY_RE = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)

# (case id, edits, expected message — exact, or a substring when prefixed with "~")
REJECTED: list[tuple[str, list[Edit], str]] = [
    # -- sources: missing, multiple, both source and sourceRef --------------------------------
    (
        "dvMissingSource2: no source key",
        [source(None)],
        "Data volume should have either Source or SourceRef, or be externally populated",
    ),
    ("dvMissingSource: source {}", [source({})], "Missing Data volume source"),
    ("dvMissingSourceHttp: http null", [source({"http": None})], "Missing Data volume source"),
    (
        "dvMultiSource: http + blank",
        [source({"http": {"url": "https://h/x"}, "blank": {}})],
        "Multiple Data volume sources",
    ),
    (
        "dvBothSourceAndSourceRef",
        [spec(sourceRef={"kind": "DataSource", "name": "golden"})],
        "Data volume should have either Source or SourceRef, or be externally populated",
    ),
    ("dvMissingCompleteSpec: no spec", [lambda m: m.pop("spec")], "Missing Data volume PVC"),
    # -- URLs and schemes ---------------------------------------------------------------------
    (
        "dvInvalidURL: 'i am invalid'",
        [http(url="i am invalid")],
        "spec.source Invalid source URL: i am invalid",
    ),
    ("http url invalidURL", [http(url="invalidURL")], "spec.source Invalid source URL: invalidURL"),
    ("http url empty", [http(url="")], "spec.source source URL is empty"),
    (
        "http url bad scheme",
        [http(url="ftp://h/x.img")],
        "spec.source Invalid source URL scheme: ftp://h/x.img",
    ),
    (
        "http url with space in host",
        [http(url="http://bad host/x")],
        "spec.source Invalid source URL: http://bad host/x",
    ),
    (
        "http url bad port",
        [http(url="http://h:port/x")],
        "spec.source Invalid source URL: http://h:port/x",
    ),
    (
        "s3 url invalidURL",
        [source({"s3": {"url": "invalidURL"}})],
        "spec.source Invalid source URL: invalidURL",
    ),
    ("s3 url empty", [source({"s3": {"url": ""}})], "spec.source source URL is empty"),
    (
        "gcs url bad scheme",
        [source({"gcs": {"url": "s3://bucket/obj"}})],
        "spec.source Invalid source URL scheme: s3://bucket/obj",
    ),
    (
        "imageio url empty",
        [source({"imageio": {**IMAGEIO, "url": ""}})],
        "spec.source source URL is empty",
    ),
    (
        "vddk url bad scheme",
        [source({"vddk": {**VDDK, "url": "vpx://vc/"}})],
        "spec.source Invalid source URL scheme: vpx://vc/",
    ),
    # -- checksum -----------------------------------------------------------------------------
    (
        "checksum without algorithm",
        [http(checksum="abc")],
        "Invalid checksum format: invalid checksum format: expected 'algorithm:hash', got 'abc'",
    ),
    (
        "checksum unknown algorithm",
        [http(checksum="crc32:deadbeef")],
        "Invalid checksum format: unsupported hash algorithm 'crc32': supported algorithms are: "
        "md5, sha1, sha256, sha512",
    ),
    (
        "checksum wrong length",
        [http(checksum="sha256:abcd")],
        "Invalid checksum format: invalid sha256 hash length: expected 64 hex characters, got 4",
    ),
    (
        "checksum not hex",
        [http(checksum="md5:" + "z" * 32)],
        "Invalid checksum format: checksum hash is not valid hexadecimal",
    ),
    (
        "checksum empty hash",
        [http(checksum="md5:")],
        "Invalid checksum format: checksum hash value cannot be empty",
    ),
    # -- size -----------------------------------------------------------------------------------
    (
        "dvMissingPVCSize",
        [lambda m: m["spec"]["pvc"]["resources"]["requests"].clear()],
        "PVC size is missing",
    ),
    ("dvMissingResourceSpec", [pvc(resources=None)], "PVC size is missing"),
    ("dvMissingRequestSpec", [pvc(resources={})], "PVC size is missing"),
    ("dv0SizePVC: 0G", [size("0G")], "PVC size can't be equal or less than zero"),
    ("size 0", [size("0")], "PVC size can't be equal or less than zero"),
    ("size -500m", [size("-500m")], "PVC size can't be equal or less than zero"),
    ("size -1Gi", [size("-1Gi")], "PVC size can't be equal or less than zero"),
    ("size 1Mi - 1 byte", [size("1048575")], "PVC size should be at least 1MiB"),
    ("size 500Ki", [size("500Ki")], "PVC size should be at least 1MiB"),
    (
        "storage size 0",
        [
            to_storage,
            lambda m: m["spec"]["storage"]["resources"]["requests"].__setitem__("storage", "0"),
        ],
        "Storage size can't be equal or less than zero",
    ),
    (
        "storage size missing on import",
        [to_storage, lambda m: m["spec"]["storage"].pop("resources")],
        "Storage size is missing",
    ),
    (
        "storage size 100k",
        [
            to_storage,
            lambda m: m["spec"]["storage"]["resources"]["requests"].__setitem__("storage", "100k"),
        ],
        "Storage size should be at least 1MiB",
    ),
    ("dvInvalidStorageSizeQuantity: 2Ng", [size("2Ng")], "~" + QUANTITY_RE),
    ("size invalid_size", [size("invalid_size")], "~" + QUANTITY_RE),
    # -- pvc / storage presence -------------------------------------------------------------
    ("dvMissingPVCSpec", [spec(pvc=None)], "Missing Data volume PVC"),
    (
        "both pvc and storage",
        [spec(storage={"resources": {"requests": {"storage": "1Gi"}}})],
        "Duplicate storage definition, both target storage and target pvc defined",
    ),
    (
        "storage class name too long",
        [pvc(storageClassName="s" * 254)],
        "Name cannot be longer than 253 characters",
    ),
    # -- access modes -------------------------------------------------------------------------
    (
        "dvMissingPVCAccessModes",
        [pvc(accessModes=None)],
        "Required value: at least 1 access mode is required",
    ),
    (
        "pvc accessModes []",
        [pvc(accessModes=[])],
        "Required value: at least 1 access mode is required",
    ),
    (
        "dvMultipleAccessModes",
        [pvc(accessModes=["ReadWriteOnce", "ReadOnlyMany"])],
        "PVC multiple accessModes",
    ),
    (
        "dvInvalidAccessModes: justATest",
        [pvc(accessModes=["justATest"])],
        f'Unsupported value: "justATest": supported values: {ACCESS}',
    ),
    (
        "storage invalid access mode (second entry)",
        [
            to_storage,
            lambda m: m["spec"]["storage"].__setitem__(
                "accessModes", ["ReadWriteOnce", "Sometimes"]
            ),
        ],
        f'Unsupported value: "Sometimes": supported values: {ACCESS}',
    ),
    # -- content type -------------------------------------------------------------------------
    (
        "dvInvalidContentType",
        [spec(contentType="invalid")],
        "ContentType not one of: kubevirt, archive",
    ),
    (
        "clone envelopes are the workers' content types, not a DataVolume's",
        [spec(contentType="blockdevice-clone")],
        "ContentType not one of: kubevirt, archive",
    ),
    (
        "filesystem-clone is not a DataVolume content type either",
        [spec(contentType="filesystem-clone")],
        "ContentType not one of: kubevirt, archive",
    ),
    (
        "dvBlankInvalidContentType",
        [source({"blank": {}}), spec(contentType="test")],
        "ContentType not one of: kubevirt, archive",
    ),
    (
        "dvBlankArchive",
        [source({"blank": {}}), spec(contentType="archive")],
        "SourceType cannot be blank and the contentType be archive",
    ),
    (
        "registry with archive",
        [registry(url="docker://quay.io/a/b"), spec(contentType="archive")],
        "ContentType must be kubevirt when Source is Registry",
    ),
    # -- registry -------------------------------------------------------------------------------
    (
        "registry neither url nor imageStream",
        [registry()],
        "Source registry should have either URL or ImageStream",
    ),
    (
        "registry both url and imageStream",
        [registry(url="docker://quay.io/a/b", imageStream="is", pullMethod="node")],
        "Source registry should have either URL or ImageStream",
    ),
    (
        "registry bad scheme",
        [registry(url="http://quay.io/a/b")],
        "Illegal registry source URL scheme http://quay.io/a/b",
    ),
    (
        "registry unparsable url",
        [registry(url="docker://quay.io:tag/a")],
        "Illegal registry source URL docker://quay.io:tag/a",
    ),
    (
        "registry bad pull method",
        [registry(url="docker://quay.io/a/b", pullMethod="kubelet")],
        'ImportMethod kubelet is neither pod, node or ""',
    ),
    (
        "registry empty imageStream",
        [registry(imageStream="", pullMethod="node")],
        "Source registry ImageStream is not valid",
    ),
    (
        "registry node pull of an oci-archive (the kubelet pulls docker:// only)",
        [registry(url="oci-archive:///images/x.tar", pullMethod="node")],
        "pullMethod node needs a docker:// registry URL: the kubelet pulls it",
    ),
    (
        "registry imageStream node pull (no OpenShift image lookup)",
        [registry(imageStream="fedora", pullMethod="node")],
        "Source registry ImageStream is not supported: it needs OpenShift's image lookup; "
        "use a docker:// URL",
    ),
    (
        "registry imageStream with pod pull",
        [registry(imageStream="is")],
        "Source registry ImageStream is supported only with node pull import method",
    ),
    # -- imageio / vddk -------------------------------------------------------------------------
    (
        "imageio empty diskId",
        [source({"imageio": {**IMAGEIO, "diskId": ""}})],
        "spec.source.Imageio source Imageio is not valid",
    ),
    (
        "imageio no secretRef",
        [source({"imageio": {**IMAGEIO, "secretRef": ""}})],
        "spec.source.Imageio source Imageio is not valid",
    ),
    (
        "imageio neither CA nor insecure",
        [source({"imageio": {**IMAGEIO, "certConfigMap": ""}})],
        "spec.source.Imageio source Imageio requires CertConfigMap or InsecureSkipVerify",
    ),
    (
        "vddk empty uuid",
        [source({"vddk": {**VDDK, "uuid": ""}})],
        "spec.source.VDDK source VDDK is not valid",
    ),
    (
        "vddk empty backingFile",
        [source({"vddk": {**VDDK, "backingFile": ""}})],
        "spec.source.VDDK source VDDK is not valid",
    ),
    (
        "vddk empty thumbprint",
        [source({"vddk": {**VDDK, "thumbprint": ""}})],
        "spec.source.VDDK source VDDK is not valid",
    ),
    # -- clone sources --------------------------------------------------------------------------
    (
        "pvc source namespace empty",
        [source({"pvc": {"namespace": "", "name": "src"}})],
        "spec.source.PVC source PVC is not valid",
    ),
    (
        "dvInvalidSourcePVC: pvc source name empty",
        [source({"pvc": {"namespace": "ns", "name": ""}})],
        "spec.source.PVC source PVC is not valid",
    ),
    (
        "snapshot source name empty",
        [source({"snapshot": {"namespace": "ns", "name": ""}})],
        "spec.source.Snapshot source snapshot is not valid",
    ),
    # -- sourceRef ------------------------------------------------------------------------------
    (
        "sourceRef kind empty",
        [source(None), spec(sourceRef={"kind": "", "name": "golden"})],
        "Missing sourceRef kind",
    ),
    (
        "sourceRef no-such-kind",
        [source(None), spec(sourceRef={"kind": "no-such-kind", "name": "golden"})],
        "Unsupported sourceRef kind no-such-kind, currently only DataSource is supported",
    ),
    (
        "sourceRef name empty",
        [source(None), spec(sourceRef={"kind": "DataSource", "name": ""})],
        "Missing sourceRef name",
    ),
    (
        "sourceRef DataSource missing",
        [source(None), spec(sourceRef={"kind": "DataSource", "name": "nope"})],
        "SourceRef DataSource/ns/nope not found",
    ),
    # -- external population -------------------------------------------------------------------
    (
        "external population with source",
        [pvc(dataSourceRef={"apiGroup": "x.io", "kind": "Pop", "name": "p"})],
        "External population is incompatible with Source and SourceRef",
    ),
    (
        "external population dataSource without apiGroup",
        [source(None), pvc(dataSource={"kind": "Pop", "name": "p"})],
        "Required value: DataSource apiGroup when kind is not 'PersistentVolumeClaim'",
    ),
    (
        "external population dataSourceRef with namespace",
        [
            source(None),
            pvc(
                dataSourceRef={"apiGroup": "x.io", "kind": "Pop", "name": "p", "namespace": "other"}
            ),
        ],
        "Invalid value: DataSourceRef namespace not supported",
    ),
    (
        "external population dataSource and dataSourceRef differ",
        [
            source(None),
            pvc(
                dataSource={"apiGroup": "x.io", "kind": "Pop", "name": "a"},
                dataSourceRef={"apiGroup": "x.io", "kind": "Pop", "name": "b"},
            ),
        ],
        "DataSourceRef and DataSource must match",
    ),
    # -- metadata -------------------------------------------------------------------------------
    (
        "name longer than 253",
        [lambda m: m["metadata"].__setitem__("name", "a" * 254)],
        "Name cannot be longer than 253 characters",
    ),
    # -- beyond CDI -----------------------------------------------------------------------------
    (
        "http url without host",
        [http(url="http:disk.img")],
        "spec.source Invalid source URL: http:disk.img",
    ),
    (
        "gs:// on an http source",
        [http(url="gs://bucket/disk.img")],
        "spec.source Invalid source URL scheme: gs://bucket/disk.img",
    ),
    (
        "extra header without colon",
        [http(extraHeaders=["X-Token abc"])],
        'spec.source.http.extraHeaders[0]: Invalid value: "X-Token abc": must be "Name: value"',
    ),
    (
        "secretRef not a DNS name",
        [http(secretRef="My_Secret")],
        '~spec.source.http.secretRef: Invalid value: "My_Secret": a lowercase RFC 1123 subdomain',
    ),
    (
        "certConfigMap not a DNS name",
        [http(certConfigMap="CA!")],
        '~spec.source.http.certConfigMap: Invalid value: "CA!"',
    ),
    (
        "pvc volumeMode unknown",
        [pvc(volumeMode="Raw")],
        'spec.pvc.volumeMode: Unsupported value: "Raw": supported values: "Block", "Filesystem"',
    ),
    (
        "pvc volumeMode FromStorageProfile",
        [pvc(volumeMode="FromStorageProfile")],
        'spec.pvc.volumeMode: Unsupported value: "FromStorageProfile": supported values: '
        '"Block", "Filesystem"',
    ),
    (
        "archive on a block volume",
        [pvc(volumeMode="Block"), spec(contentType="archive")],
        "DataVolume with ContentType Archive cannot have block volumeMode",
    ),
    (
        "checkpoints on an http source",
        [spec(checkpoints=[{"previous": "", "current": "c1"}])],
        "Checkpoints are only supported with imageio and vddk sources",
    ),
    (
        "priorityClassName not a DNS name",
        [spec(priorityClassName="High Priority")],
        '~spec.priorityClassName: Invalid value: "High Priority"',
    ),
    ("wrong JSON type", [http(url=5)], "spec.source.http.url: expected string, got integer"),
]


def check(result: ValidationResult, expected: str) -> None:
    assert not result.allowed
    if expected.startswith("~"):
        assert any(expected[1:] in m for m in result.messages), result.messages
    else:
        assert expected in result.messages, result.messages


@pytest.mark.parametrize(
    ("edits", "expected"), [(e, x) for _, e, x in REJECTED], ids=[case for case, _, _ in REJECTED]
)
def test_invalid_datavolume_is_rejected_with_cdis_message(edits: list[Edit], expected: str) -> None:
    check(validate_datavolume(edited(*edits), None, StaticLookup()), expected)


ACCEPTED: list[tuple[str, list[Edit]]] = [
    ("datavolume.yaml", []),
    ("dvLeadingZero: 000500Mi", [size("000500Mi")]),
    ("size exactly 1Mi", [size("1Mi")]),
    ("size as integer bytes", [size(1073741824)]),
    ("size in e-notation", [size("1e9")]),
    ("blank kubevirt", [source({"blank": {}})]),
    ("upload", [source({"upload": {}})]),
    ("http archive", [spec(contentType="archive")]),
    ("contentType empty", [spec(contentType="")]),
    ("http checksum upper case", [http(checksum="SHA256:" + "AB" * 32)]),
    (
        "http all fields",
        [
            http(
                secretRef="auth",
                certConfigMap="ca",
                checksum=SHA256,
                extraHeaders=["X-Auth: token"],
                secretExtraHeaders=["hdr"],
                insecureSkipVerify=True,
            )
        ],
    ),
    ("gcs gs://", [source({"gcs": {"url": "gs://bucket/disk.img"}})]),
    ("s3 https", [source({"s3": {"url": "https://bucket.s3.example/disk.img"}})]),
    ("registry docker pod pull", [registry(url="docker://quay.io/kubevirt/cirros:latest")]),
    ("registry oci-archive", [registry(url="oci-archive:///images/x.tar")]),
    ("registry docker node pull", [registry(url="docker://quay.io/a/b:tag", pullMethod="node")]),
    (
        "imageio insecure without CA",
        [source({"imageio": {**IMAGEIO, "certConfigMap": "", "insecureSkipVerify": True}})],
    ),
    (
        "vddk with checkpoints",
        [source({"vddk": VDDK}), spec(checkpoints=[{"previous": "", "current": "c1"}])],
    ),
    ("pvc clone, source missing (CDI waits)", [source({"pvc": {"namespace": "a", "name": "b"}})]),
    (
        "storage clone without size",
        [
            to_storage,
            lambda m: m["spec"]["storage"].pop("resources"),
            source({"pvc": {"namespace": "a", "name": "b"}}),
        ],
    ),
    (
        "storage without access modes",
        [to_storage, lambda m: m["spec"]["storage"].pop("accessModes")],
    ),
    (
        "storage with two access modes",
        [
            to_storage,
            lambda m: m["spec"]["storage"].__setitem__(
                "accessModes", ["ReadWriteMany", "ReadWriteOnce"]
            ),
        ],
    ),
    (
        "storage volumeMode FromStorageProfile",
        [
            to_storage,
            lambda m: m["spec"]["storage"].__setitem__("volumeMode", "FromStorageProfile"),
        ],
    ),
    ("ReadWriteOncePod", [pvc(accessModes=["ReadWriteOncePod"])]),
    (
        "external population",
        [source(None), pvc(dataSourceRef={"apiGroup": "x.io", "kind": "Pop", "name": "p"})],
    ),
    (
        "external population PVC kind without group",
        [source(None), pvc(dataSource={"kind": "PersistentVolumeClaim", "name": "p"})],
    ),
]


@pytest.mark.parametrize("edits", [e for _, e in ACCEPTED], ids=[c for c, _ in ACCEPTED])
def test_valid_datavolume_is_admitted(edits: list[Edit]) -> None:
    result = validate_datavolume(edited(*edits), None, StaticLookup())
    assert result.allowed, result.messages


# --- cluster-dependent cases ------------------------------------------------------------------


def claim(
    name: str = "dv",
    namespace: str = "ns",
    annotations: dict[str, str] | None = None,
    owner_kind: str | None = None,
    storage: str = "1Gi",
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "annotations": annotations or {}}
    if owner_kind:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": owner_kind, "name": "o", "uid": "u", "controller": True}
        ]
    return {"metadata": meta, "spec": {"resources": {"requests": {"storage": storage}}}}


def test_target_pvc_that_exists_and_is_not_adoptable_is_rejected() -> None:
    lookup = StaticLookup(pvcs={("ns", "dv"): claim()})
    result = validate_datavolume(manifest(), None, lookup)
    assert result.messages == ["Destination PVC ns/dv already exists"]
    assert result.causes[0].type == CauseType.DUPLICATE


def test_target_pvc_owned_by_another_controller_is_rejected() -> None:
    lookup = StaticLookup(pvcs={("ns", "dv"): claim(owner_kind="StatefulSet")})
    assert validate_datavolume(manifest(), None, lookup).messages == [
        "Destination PVC ns/dv already exists"
    ]


@pytest.mark.parametrize(
    ("pvc_annotations", "owner", "dv_annotations", "gate"),
    [
        ({"cdi.kubevirt.io/storage.populatedFor": "dv"}, None, {}, False),
        ({}, None, {"cdi.kubevirt.io/allowClaimAdoption": "true"}, False),
        ({}, None, {}, True),
        ({}, "DataVolume", {}, False),
    ],
    ids=["populatedFor", "allowClaimAdoption", "feature gate", "controlled by a DataVolume"],
)
def test_existing_target_pvc_that_may_be_adopted_is_admitted(
    pvc_annotations: dict[str, str],
    owner: str | None,
    dv_annotations: dict[str, str],
    gate: bool,
) -> None:
    lookup = StaticLookup(
        pvcs={("ns", "dv"): claim(annotations=pvc_annotations, owner_kind=owner)},
        adoption_enabled=gate,
    )
    m = edited(lambda m: m["metadata"].__setitem__("annotations", dv_annotations))
    assert validate_datavolume(m, None, lookup).allowed


def test_allow_claim_adoption_false_overrides_the_feature_gate() -> None:
    lookup = StaticLookup(pvcs={("ns", "dv"): claim()}, adoption_enabled=True)
    m = edited(
        lambda m: m["metadata"].__setitem__(
            "annotations", {"cdi.kubevirt.io/allowClaimAdoption": "false"}
        )
    )
    assert not validate_datavolume(m, None, lookup).allowed


def test_pvc_created_for_this_datavolume_is_never_adopted() -> None:
    pvc_ = claim(annotations={"cdi.kubevirt.io/createdForDataVolume": "uid-1"})
    lookup = StaticLookup(pvcs={("ns", "dv"): pvc_}, adoption_enabled=True)
    assert not validate_datavolume(manifest(), None, lookup).allowed


def test_namespace_comes_from_the_request_when_the_object_has_none() -> None:
    m = edited(lambda m: m["metadata"].pop("namespace"))
    lookup = StaticLookup(pvcs={("req-ns", "dv"): claim(namespace="req-ns")})
    result = validate_datavolume(m, None, lookup, namespace="req-ns")
    assert result.messages == ["Destination PVC req-ns/dv already exists"]


def test_clone_source_with_other_content_type_is_rejected() -> None:
    src = claim("src", "a", annotations={"cdi.kubevirt.io/storage.contentType": "archive"})
    m = edited(source({"pvc": {"namespace": "a", "name": "src"}}))
    result = validate_datavolume(m, None, StaticLookup(pvcs={("a", "src"): src}))
    assert result.messages == [
        "Source contentType (archive) and target contentType (kubevirt) do not match"
    ]


def test_clone_target_smaller_than_source_is_rejected() -> None:
    src = claim("src", "a", storage="2Gi")
    m = edited(source({"pvc": {"namespace": "a", "name": "src"}}))
    result = validate_datavolume(m, None, StaticLookup(pvcs={("a", "src"): src}))
    assert result.messages == [
        "target resources requests storage size is smaller than the source 1073741824 < 2147483648"
    ]


def test_source_ref_resolves_through_the_datasource() -> None:
    ds = {"spec": {"source": {"pvc": {"namespace": "golden", "name": "fedora"}}}}
    src = claim("fedora", "golden", storage="10Gi")
    lookup = StaticLookup(pvcs={("golden", "fedora"): src}, data_sources={("ns", "os"): ds})
    m = edited(source(None), spec(sourceRef={"kind": "DataSource", "name": "os"}))
    assert validate_datavolume(m, None, lookup).messages == [
        "target resources requests storage size is smaller than the source 1073741824 < 10737418240"
    ]


def test_source_ref_to_an_empty_datasource_is_rejected() -> None:
    lookup = StaticLookup(data_sources={("ns", "os"): {"spec": {"source": {}}}})
    m = edited(source(None), spec(sourceRef={"kind": "DataSource", "name": "os"}))
    assert validate_datavolume(m, None, lookup).messages == [
        "Empty source field in 'os'. DataSource may not be ready yet"
    ]


def test_source_ref_namespace_overrides_the_datavolume_namespace() -> None:
    ds = {"spec": {"source": {"snapshot": {"namespace": "golden", "name": "snap"}}}}
    lookup = StaticLookup(data_sources={("golden", "os"): ds})
    m = edited(
        source(None), spec(sourceRef={"kind": "DataSource", "name": "os", "namespace": "golden"})
    )
    assert validate_datavolume(m, None, lookup).allowed


# --- updates ----------------------------------------------------------------------------------


def test_spec_update_is_rejected() -> None:
    old = manifest()
    new = edited(http(url="https://images.example/other.qcow2"))
    result = validate_datavolume(new, old, StaticLookup())
    assert result.messages == ["Cannot update DataVolume Spec"]
    assert result.causes[0].type == CauseType.DUPLICATE


def test_metadata_update_is_admitted_even_over_an_existing_pvc() -> None:
    old = manifest()
    new = edited(lambda m: m["metadata"].__setitem__("labels", {"a": "b"}))
    lookup = StaticLookup(pvcs={("ns", "dv"): claim()})
    assert validate_datavolume(new, old, lookup).allowed


def test_semantically_equal_size_is_not_a_spec_change() -> None:
    assert validate_datavolume(edited(size("1024Mi")), manifest(), StaticLookup()).allowed


def test_checkpoint_update_of_a_multi_stage_import_is_admitted() -> None:
    def vddk(*checkpoints: str) -> Manifest:
        cps = [
            {"previous": p, "current": c}
            for p, c in zip(("", *checkpoints), checkpoints, strict=False)
        ]
        return edited(source({"vddk": VDDK}), spec(checkpoints=cps))

    result = validate_datavolume(vddk("c1", "c2"), vddk("c1"), StaticLookup())
    assert result.allowed, result.messages


def test_checkpoint_update_that_also_changes_the_source_is_rejected() -> None:
    old = edited(source({"vddk": VDDK}), spec(checkpoints=[{"previous": "", "current": "c1"}]))
    new = edited(
        source({"vddk": {**VDDK, "uuid": "u2"}}),
        spec(checkpoints=[{"previous": "", "current": "c1"}, {"previous": "c1", "current": "c2"}]),
    )
    assert validate_datavolume(new, old, StaticLookup()).messages == [
        "Cannot update DataVolume Spec"
    ]


def test_credentials_in_url_are_admitted_with_a_warning() -> None:
    result = validate_datavolume(edited(http(url="https://user:pw@h/x.img")), None, StaticLookup())
    assert result.allowed
    assert result.warnings == (
        "spec.source.http.url contains credentials; store them in a "
        "Secret and reference it with secretRef",
    )


def test_node_pull_with_a_secret_or_ca_is_admitted_with_a_warning() -> None:
    edits = registry(url="docker://quay.io/a/b:1", pullMethod="node", secretRef="s")
    result = validate_datavolume(edited(edits), None, StaticLookup())
    assert result.allowed, result.messages
    assert result.warnings == (
        "spec.source.registry: with pullMethod node the kubelet pulls the image with the node's "
        "registry configuration; secretRef and certConfigMap are not used",
    )
