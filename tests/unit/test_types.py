"""DataVolume, StorageProfile and CDIConfig parse from CDI's JSON and give it back."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.checksum import Checksum, ChecksumFormatError
from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig, StorageProfile
from cdi.api.constants import ContentType, Phase, SourceKind
from cdi.api.types import DataVolume

FULL: dict[str, Any] = {
    "apiVersion": "cdi.kubevirt.io/v1beta1",
    "kind": "DataVolume",
    "metadata": {
        "name": "dv",
        "namespace": "ns",
        "uid": "u",
        "labels": {"a": "b"},
        "annotations": {"cdi.kubevirt.io/storage.bind.immediate.requested": "true"},
        "ownerReferences": [
            {
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachine",
                "name": "vm",
                "uid": "vmu",
                "controller": True,
            }
        ],
    },
    "spec": {
        "source": {
            "http": {
                "url": "https://h/x.qcow2",
                "secretRef": "s",
                "certConfigMap": "c",
                "extraHeaders": ["A: b"],
                "checksum": "md5:" + "0" * 32,
                "insecureSkipVerify": False,
            }
        },
        "storage": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": "Block",
            "storageClassName": "local",
            "resources": {"requests": {"storage": "10Gi"}},
            "selector": {"matchLabels": {"x": "y"}},
            "dataSourceRef": {"apiGroup": "g", "kind": "K", "name": "n"},
        },
        "contentType": "kubevirt",
        "priorityClassName": "high",
        "preallocation": True,
        "checkpoints": [{"previous": "", "current": "c1"}],
        "finalCheckpoint": True,
    },
    "status": {
        "phase": "ImportInProgress",
        "progress": "45.10%",
        "restartCount": 2,
        "claimName": "dv",
        "conditions": [
            {
                "type": "Running",
                "status": "True",
                "reason": "Pod is running",
                "lastTransitionTime": "2024-01-01T00:00:00Z",
            }
        ],
    },
}


def test_datavolume_round_trips() -> None:
    assert DataVolume.from_dict(FULL).to_dict() == FULL


def test_datavolume_fields_are_typed() -> None:
    dv = DataVolume.from_dict(FULL)
    assert dv.spec.source is not None and dv.spec.source.kind == SourceKind.HTTP
    assert dv.spec.storage is not None and dv.spec.claim is dv.spec.storage
    size = dv.spec.storage.requested_size
    assert size is not None and size.value() == 10 << 30
    assert dv.status is not None and dv.status.phase == Phase.IMPORT_IN_PROGRESS
    running = dv.status.condition("Running")
    assert running is not None and running.status == "True"
    assert dv.metadata.controller_ref() is not None
    assert dv.spec.effective_content_type == ContentType.KUBEVIRT


def test_null_members_count_as_absent() -> None:
    dv = DataVolume.from_dict({"spec": {"source": {"http": None, "blank": {}}, "pvc": None}})
    assert dv.spec.source is not None and dv.spec.source.kinds == (SourceKind.BLANK,)
    assert dv.spec.pvc is None


def test_empty_marker_sources_survive_a_round_trip() -> None:
    data = {"spec": {"source": {"blank": {}}}}
    assert DataVolume.from_dict(data).to_dict()["spec"] == {"source": {"blank": {}}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"spec": {"source": {"http": {"url": 5}}}},
            "spec.source.http.url: expected string, got integer",
        ),
        (
            {"spec": {"pvc": {"accessModes": "ReadWriteOnce"}}},
            "spec.pvc.accessModes: expected array, got string",
        ),
        ({"spec": {"preallocation": "yes"}}, "spec.preallocation: expected boolean, got string"),
        ({"spec": []}, "spec: expected object, got array"),
        (
            {"status": {"conditions": [{"status": "True"}]}},
            "status.conditions[0].type: Required value",
        ),
        (
            {"spec": {"storage": {"resources": {"requests": {"storage": "ten"}}}}},
            "spec.storage.resources.requests.storage: quantities must match the regular expression",
        ),
    ],
    ids=["string", "array", "boolean", "object", "required", "quantity"],
)
def test_malformed_objects_name_the_path(data: dict[str, Any], message: str) -> None:
    with pytest.raises(SchemaError) as err:
        DataVolume.from_dict(data)
    assert str(err.value).startswith(message)


def test_every_cdi_phase_is_known() -> None:
    assert len(Phase) == 23
    assert {
        "Pending",
        "WaitForFirstConsumer",
        "PVCBound",
        "ImportScheduled",
        "ImportInProgress",
        "Succeeded",
        "Failed",
    } <= {p.value for p in Phase}


def test_storage_profile_prefers_status_over_spec() -> None:
    profile = StorageProfile.from_dict(
        {
            "metadata": {
                "name": "local",
                "annotations": {"cdi.kubevirt.io/minimumSupportedPvcSize": "4Gi"},
            },
            "spec": {"claimPropertySets": [{"accessModes": ["ReadWriteMany"]}]},
            "status": {
                "storageClass": "local",
                "cloneStrategy": "copy",
                "claimPropertySets": [{"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}],
            },
        }
    )
    assert profile.claim_property_sets[0].volume_mode == "Block"
    minimum = profile.minimum_supported_pvc_size
    assert minimum is not None and minimum.value() == 4 << 30


def test_cdi_config_precedence_and_defaults() -> None:
    empty = CDIConfig()
    assert empty.filesystem_overhead("any") == "0.06"
    assert str(empty.pod_resources.limits["memory"]) == "600M"
    config = CDIConfig.from_dict(
        {
            "spec": {
                "filesystemOverhead": {"global": "0.1", "storageClass": {"fast": "0.2"}},
                "preallocation": True,
            },
            "status": {
                "filesystemOverhead": {"global": "0.055"},
                "preallocation": False,
                "importProxy": {"HTTPProxy": "http://p:3128"},
            },
        }
    )
    assert config.filesystem_overhead("fast") == "0.055"  # status, once written, is the truth
    assert (
        CDIConfig.from_dict({"spec": config.to_dict()["spec"]}).filesystem_overhead("fast") == "0.2"
    )
    assert config.filesystem_overhead("slow") == "0.055"
    assert config.preallocation is False
    assert config.import_proxy is not None and config.import_proxy.http_proxy == "http://p:3128"
    assert config.to_dict()["status"]["importProxy"] == {"HTTPProxy": "http://p:3128"}


def test_checksum_parses_case_insensitively() -> None:
    checksum = Checksum.parse(" SHA1 : " + "AB" * 20)
    assert (checksum.algorithm, checksum.digest) == ("sha1", "ab" * 20)
    with pytest.raises(ChecksumFormatError):
        Checksum.parse("sha1:" + "ab" * 19)
