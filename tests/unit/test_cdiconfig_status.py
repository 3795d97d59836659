"""CDIConfig status follows CDI's config controller, and what it says reaches rendered claims."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.api.config import CDIConfig, StorageProfile
from cdi.api.quantity import Quantity
from cdi.api.types import DataVolume
from cdi.render.cdiconfig import desired_status, ingress_host, upload_proxy_url
from cdi.render.pvc import render_pvc, required_space

MiB = 1024 * 1024
CLASSES = ["testkit-block", "testkit-fs"]


def config(**spec: Any) -> CDIConfig:
    return CDIConfig.from_dict({"metadata": {"name": "config"}, "spec": spec})


def with_status(cfg: CDIConfig, proxy: str | None = None) -> CDIConfig:
    raw = cfg.to_dict()
    raw["status"] = desired_status(cfg, CLASSES, proxy)
    return CDIConfig.from_dict(raw)


@pytest.mark.parametrize("value", ["0", "0.0", "1", "0.123", "0.5"])
def test_valid_global_overhead_is_used_for_every_class(value: str) -> None:
    status = desired_status(config(filesystemOverhead={"global": value}), CLASSES, None)
    assert status["filesystemOverhead"] == {
        "global": value,
        "storageClass": {"testkit-block": value, "testkit-fs": value},
    }


@pytest.mark.parametrize("value", ["abc", "1.abc", "1.0001", "inf", "-0.1", "0.1234"])
def test_invalid_global_overhead_falls_back_to_cdis_default(value: str) -> None:
    status = desired_status(config(filesystemOverhead={"global": value}), CLASSES, None)
    assert status["filesystemOverhead"]["global"] == "0.06"


def test_per_class_overhead_wins_and_invalid_ones_take_the_global() -> None:
    cfg = config(
        filesystemOverhead={
            "global": "0.1",
            "storageClass": {"testkit-fs": "0.2", "testkit-block": "oops", "gone": "0.3"},
        }
    )
    overhead = desired_status(cfg, CLASSES, None)["filesystemOverhead"]
    assert overhead["storageClass"] == {"testkit-fs": "0.2", "testkit-block": "0.1"}


def test_defaults_when_the_spec_is_empty() -> None:
    status = desired_status(config(), CLASSES, None)
    assert status == {
        "filesystemOverhead": {
            "global": "0.06",
            "storageClass": {"testkit-block": "0.06", "testkit-fs": "0.06"},
        },
        "defaultPodResourceRequirements": {
            "requests": {"cpu": "100m", "memory": "60M"},
            "limits": {"cpu": "750m", "memory": "600M"},
        },
        "preallocation": False,
    }


def test_spec_settings_are_copied_or_merged() -> None:
    cfg = config(
        podResourceRequirements={"limits": {"memory": "1Gi"}},
        scratchSpaceStorageClass="testkit-fs",
        importProxy={"HTTPProxy": "http://proxy:3128", "noProxy": "10.0.0.0/8"},
        imagePullSecrets=[{"name": "pull"}],
        preallocation=True,
    )
    status = desired_status(cfg, CLASSES, "proxy.example")
    assert status["defaultPodResourceRequirements"]["limits"] == {"cpu": "750m", "memory": "1Gi"}
    assert status["scratchSpaceStorageClass"] == "testkit-fs"
    assert status["importProxy"] == {"HTTPProxy": "http://proxy:3128", "noProxy": "10.0.0.0/8"}
    assert status["imagePullSecrets"] == [{"name": "pull"}]
    assert status["preallocation"] is True
    assert status["uploadProxyURL"] == "proxy.example"
    missing = desired_status(config(scratchSpaceStorageClass="nope"), CLASSES, None)
    assert "scratchSpaceStorageClass" not in missing


def ingress(host: str, service: str) -> dict[str, Any]:
    backend = {"service": {"name": service, "port": {"number": 443}}}
    path = {"path": "/", "pathType": "Prefix", "backend": backend}
    return {"spec": {"rules": [{"host": host, "http": {"paths": [path]}}]}}


def test_upload_proxy_url_override_then_ingress_then_service() -> None:
    svc = {"metadata": {"name": "cdi-uploadproxy", "namespace": "cdi"}}
    routes = [ingress("other.example", "other"), ingress("upload.example", "cdi-uploadproxy")]
    override = config(uploadProxyURLOverride="https://mine.example")
    assert upload_proxy_url(override, routes, svc) == "https://mine.example"
    assert upload_proxy_url(config(), routes, svc) == "upload.example"
    assert upload_proxy_url(config(), routes[:1], svc) == "cdi-uploadproxy.cdi.svc"
    assert upload_proxy_url(config(), [], None) is None
    assert ingress_host({"spec": {}}, "cdi-uploadproxy") is None


def storage_dv() -> DataVolume:
    return DataVolume.from_dict(
        {
            "metadata": {"name": "dv", "namespace": "ns", "uid": "u"},
            "spec": {
                "source": {"blank": {}},
                "storage": {"resources": {"requests": {"storage": "100Mi"}}},
            },
        }
    )


def test_changing_the_spec_overhead_changes_the_next_claim_size() -> None:
    profile = StorageProfile.from_dict(
        {
            "metadata": {"name": "testkit-fs"},
            "status": {
                "storageClass": "testkit-fs",
                "claimPropertySets": [
                    {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}
                ],
            },
        }
    )
    sizes = []
    for overhead in ("0.06", "0.5"):
        cfg = with_status(config(filesystemOverhead={"global": overhead}))
        pvc = render_pvc(storage_dv(), profile, cfg)
        sizes.append(Quantity.parse(pvc["spec"]["resources"]["requests"]["storage"]).value())
    assert sizes == [required_space(0.06, 100 * MiB), required_space(0.5, 100 * MiB)]
    assert sizes[1] == 200 * MiB
