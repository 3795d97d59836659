"""CDI's documented http and blank DataVolumes are admitted by our webhook and rendered into
claims on this project's storage classes (the integration test imports them for real)."""

from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Any

import pytest
import yaml

from cdi.api.config import CDIConfig, StorageProfile, StorageProfileSpec
from cdi.api.types import DataVolume
from cdi.render.capabilities import LOCAL_PROVISIONER
from cdi.render.pvc import render_pvc
from cdi.render.storageprofile import desired_status
from cdi.webhooks.validation import StaticLookup, validate_datavolume

EXAMPLES = Path(__file__).resolve().parents[1] / "integration" / "data" / "cdi-examples.yaml"
VALUES = {
    "IMAGE_URL": "http://127.0.0.1:8000/ok/disk.qcow2",
    "ARCHIVE_URL": "http://127.0.0.1:8000/ok/files.tar",
    "IMAGE_SHA256": "ab" * 32,
}


def documents() -> list[dict[str, Any]]:
    text = Template(EXAMPLES.read_text()).substitute(VALUES)
    return [d for d in yaml.safe_load_all(text) if d]


def datavolumes() -> list[dict[str, Any]]:
    return [d for d in documents() if d["kind"] == "DataVolume"]


def local_profile(name: str) -> StorageProfile:
    sc = {"metadata": {"name": name}, "provisioner": LOCAL_PROVISIONER}
    status = desired_status(sc, StorageProfileSpec())
    return StorageProfile.from_dict({"metadata": {"name": name}, "status": status})


def test_the_examples_are_many_uniquely_named_and_in_the_storage_form() -> None:
    dvs = datavolumes()
    names = [d["metadata"]["name"] for d in documents()]
    assert len(dvs) >= 15 and len(set(names)) == len(names)
    bare = [d for d in dvs if "accessModes" not in d["spec"]["storage"]]
    assert len(bare) >= 14  # CDI's recommended form: no access modes
    assert sum(d["spec"]["source"].get("http", {}).get("checksum") == "" for d in dvs) >= 3


@pytest.mark.parametrize("manifest", datavolumes(), ids=lambda d: d["metadata"]["name"])
def test_documented_example_is_admitted(manifest: dict[str, Any]) -> None:
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": "ns"}}
    result = validate_datavolume(manifest, None, StaticLookup())
    assert result.allowed, result.messages


@pytest.mark.parametrize("manifest", datavolumes(), ids=lambda d: d["metadata"]["name"])
def test_documented_example_renders_a_complete_claim(manifest: dict[str, Any]) -> None:
    dv = DataVolume.from_dict(
        {**manifest, "metadata": {**manifest["metadata"], "namespace": "ns", "uid": "u"}}
    )
    claim = dv.spec.storage
    assert claim is not None
    profile = local_profile(claim.storage_class_name or "testkit-fs")
    pvc = render_pvc(dv, profile, CDIConfig())
    assert pvc["spec"]["accessModes"] == list(claim.access_modes or ["ReadWriteOnce"])
    assert pvc["spec"]["volumeMode"] == (claim.volume_mode or "Filesystem")
    assert pvc["spec"]["storageClassName"] == profile.storage_class
