"""StorageProfile status is computed from the class, the known-provisioner table and the spec,
and a ``storage`` claim without modes is completed from it."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.config import CDIConfig, StorageProfile, StorageProfileSpec
from cdi.api.types import DataVolume
from cdi.render import RenderError
from cdi.render import capabilities as caps
from cdi.render.pvc import render_pvc
from cdi.render.storageprofile import desired_status, is_complete, missing_annotations

RWO_FS = {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}
RWO_BLOCK = {"accessModes": ["ReadWriteOnce"], "volumeMode": "Block"}


def sc(
    name: str,
    provisioner: str,
    parameters: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "annotations": annotations or {}},
        "provisioner": provisioner,
        "parameters": parameters or {},
    }


def spec(**fields: Any) -> StorageProfileSpec:
    return StorageProfileSpec.from_dict(fields)


def profile_for(cls: dict[str, Any], **fields: Any) -> StorageProfile:
    return StorageProfile.from_dict(
        {
            "metadata": {"name": cls["metadata"]["name"]},
            "status": desired_status(cls, spec(**fields)),
        }
    )


def storage_dv(**storage: Any) -> DataVolume:
    storage.setdefault("resources", {"requests": {"storage": "64Mi"}})
    return DataVolume.from_dict(
        {
            "metadata": {"name": "dv", "namespace": "ns", "uid": "u"},
            "spec": {"source": {"blank": {}}, "storage": storage},
        }
    )


@pytest.mark.parametrize(
    ("cls", "first"),
    [
        (sc("testkit-fs", caps.LOCAL_PROVISIONER), RWO_FS),
        (sc("testkit-fs-wffc", caps.LOCAL_PROVISIONER), RWO_FS),
        (sc("testkit-block", caps.LOCAL_PROVISIONER), RWO_BLOCK),
        (sc("gp3", "ebs.csi.aws.com", {"type": "gp3"}), RWO_BLOCK),
        (
            sc("nfs", "nfs.csi.k8s.io"),
            {"accessModes": ["ReadWriteMany"], "volumeMode": "Filesystem"},
        ),
        (
            sc("lh", "driver.longhorn.io", {"migratable": "true"}),
            {"accessModes": ["ReadWriteMany"], "volumeMode": "Block"},
        ),
    ],
    ids=["local fs", "local wffc", "local block", "ebs gp3", "nfs", "longhorn migratable"],
)
def test_known_provisioners_fill_claim_property_sets_preferred_first(
    cls: dict[str, Any], first: dict[str, Any]
) -> None:
    status = desired_status(cls, spec())
    assert status["claimPropertySets"][0] == first
    assert status["storageClass"] == cls["metadata"]["name"]
    assert status["provisioner"] == cls["provisioner"]
    assert status["conditions"] == [
        {
            "type": "Recognized",
            "status": "True",
            "reason": "RecognizedProvisioner",
            "message": "Provisioner is recognized",
        }
    ]


def test_unknown_provisioner_gives_an_empty_profile_and_says_so() -> None:
    status = desired_status(sc("x", "example.com/unknown"), spec())
    assert status["claimPropertySets"] == []
    assert status["conditions"][0]["reason"] == "UnrecognizedProvisioner"
    trident = desired_status(sc("t", "csi.trident.netapp.io", {"backendType": "weird"}), spec())
    assert trident["conditions"][0]["reason"] == "UnrecognizedStorageClassParameters"
    assert trident["claimPropertySets"] == []


def test_spec_claim_property_sets_override_the_table_even_when_incomplete() -> None:
    cls = sc("testkit-fs", caps.LOCAL_PROVISIONER)
    override = [{"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}]
    assert desired_status(cls, spec(claimPropertySets=override))["claimPropertySets"] == override
    incomplete = [{"volumeMode": "Filesystem"}]
    status = desired_status(cls, spec(claimPropertySets=incomplete))
    assert status["claimPropertySets"] == incomplete
    assert not is_complete(profile_for(cls, claimPropertySets=incomplete).claim_property_sets)


@pytest.mark.parametrize(
    ("cls", "fields", "snapshot_class", "strategy"),
    [
        (sc("a", caps.LOCAL_PROVISIONER), {}, None, "csi-clone"),
        (sc("a", caps.LOCAL_PROVISIONER), {}, "vsc", "csi-clone"),  # advised wins over default
        (sc("a", "rbd.csi.ceph.com"), {}, None, "csi-clone"),
        (sc("a", "rbd.csi.ceph.com"), {"cloneStrategy": "copy"}, "vsc", "copy"),
        (
            sc("a", "x", annotations={"cdi.kubevirt.io/clone-strategy": "csi-clone"}),
            {},
            None,
            "csi-clone",
        ),
        (sc("a", "pd.csi.storage.gke.io"), {}, None, "copy"),  # snapshot, but no snapshot class
        (sc("a", "pd.csi.storage.gke.io"), {"snapshotClass": "vsc"}, "vsc", "snapshot"),
        (sc("a", "example.com/unknown"), {}, "vsc", "snapshot"),  # CDI's default with a class
        (sc("a", "example.com/unknown"), {}, None, "copy"),
        (sc("a", "example.com/unknown"), {"cloneStrategy": "snapshot"}, None, "snapshot"),
    ],
    ids=[
        "local",
        "local with a class",
        "table",
        "spec wins",
        "class annotation",
        "no snapshot class",
        "snapshot",
        "default snapshot",
        "default copy",
        "spec snapshot",
    ],
)
def test_clone_strategy_precedence(
    cls: dict[str, Any], fields: dict[str, Any], snapshot_class: str | None, strategy: str
) -> None:
    assert desired_status(cls, spec(**fields), snapshot_class)["cloneStrategy"] == strategy


def test_advised_minimum_size_is_annotated_once() -> None:
    cls = sc("io2", "ebs.csi.aws.com", {"type": "io2"})
    assert missing_annotations(cls, {}) == {"cdi.kubevirt.io/minimumSupportedPvcSize": "4Gi"}
    assert missing_annotations(cls, {"cdi.kubevirt.io/minimumSupportedPvcSize": "8Gi"}) == {}
    assert missing_annotations(sc("fs", caps.LOCAL_PROVISIONER), {}) == {}


@pytest.mark.parametrize(
    ("name", "mode"), [("testkit-fs", "Filesystem"), ("testkit-block", "Block")]
)
def test_storage_claim_without_modes_is_completed_from_the_computed_profile(
    name: str, mode: str
) -> None:
    profile = profile_for(sc(name, caps.LOCAL_PROVISIONER))
    pvc = render_pvc(storage_dv(), profile, CDIConfig())
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["volumeMode"] == mode
    assert pvc["spec"]["storageClassName"] == name


def test_profile_without_access_modes_gives_cdis_claim_error() -> None:
    cls = sc("testkit-fs", caps.LOCAL_PROVISIONER)
    profile = profile_for(cls, claimPropertySets=[{"volumeMode": "Filesystem"}])
    with pytest.raises(RenderError) as err:
        render_pvc(storage_dv(), profile, CDIConfig())
    assert err.value.reason == "ErrClaimNotValid"
    assert err.value.message == "no accessMode specified in StorageProfile testkit-fs"
    with pytest.raises(RenderError) as none:
        render_pvc(storage_dv(), None, CDIConfig())
    assert none.value.message == (
        "PVC spec is missing accessMode and no storageClass to choose profile"
    )
