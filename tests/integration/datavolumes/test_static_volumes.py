"""Static and pre-populated volumes on the real API server (CDI ``datavolume_test.go`` "pre
populated", ``static-volume_test.go``): a DataVolume whose data is already on a volume
succeeds without an importer, the data kept. ``prePopulated`` waits for the user's claim and
adopts it; a claim ``populatedFor`` a DataVolume is adopted when the DataVolume comes; with
``checkStaticVolume`` the claim is made for an Available PersistentVolume pre-bound to it (the
real PV controller binds them) and its data is kept; a pre-bound volume too small for the claim
is not used, and the import runs as usual."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    condition,
    datavolume,
    dv_path,
    same_prefix_then_zeros,
    volume_dir,
    wait_phase,
)

pytestmark = pytest.mark.integration
MARKER = b"the data that was already there\n"
POPULATED_FOR = "cdi.kubevirt.io/storage.populatedFor"
VOLUME_LIST = "cdi.kubevirt.io/storage.persistentVolumeList"


def _claims(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/persistentvolumeclaims"


def _importer_pods(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return [p for p in pods if p["metadata"]["name"].startswith("importer-")]


def _phase(kube: Kube, path: str) -> str | None:
    return (kube.get(path).get("status") or {}).get("phase")


def _user_claim(kube: Kube, namespace: str, name: str) -> None:
    """The user's claim, ``populatedFor`` the DataVolume of its name, bound and holding data."""
    kube.create(
        _claims(namespace),
        {
            "metadata": {"name": name, "annotations": {POPULATED_FOR: name}},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "testkit-fs",
                "resources": {"requests": {"storage": "64Mi"}},
            },
        },
    )
    claim = f"{_claims(namespace)}/{name}"
    wait_until(lambda: _phase(kube, claim) == "Bound", f"claim {name} bound", 60)
    (volume_dir(kube, namespace, name) / "disk.img").write_bytes(MARKER)


def _source(image_server: ImageServer) -> dict[str, Any]:
    return {"http": {"url": image_server.url("ok", "disk.raw.gz")}}


def _asked(image_server: ImageServer) -> int:
    return sum(r.endswith("ok/disk.raw.gz") for r in image_server.requests)


def test_a_pre_populated_datavolume_waits_for_the_users_claim_and_adopts_it(
    kube: Kube, namespace: str, controller: Product, image_server: ImageServer
) -> None:
    asked = _asked(image_server)
    dv = datavolume("golden", _source(image_server))
    dv["metadata"]["annotations"]["cdi.kubevirt.io/storage.prePopulated"] = "golden"
    kube.create(dv_path(namespace), dv)
    pending = wait_phase(kube, namespace, "golden", ("Pending",), 60)
    assert condition(pending, "Bound")["reason"] == "NotFound"
    time.sleep(3)  # long enough for a claim and an importer, had the controller made them
    assert kube.get_or_none(f"{_claims(namespace)}/golden") is None
    assert kube.get(dv_path(namespace, "golden"))["status"]["phase"] == "Pending"

    _user_claim(kube, namespace, "golden")
    done = wait_phase(kube, namespace, "golden", ("Succeeded", "Failed"), 60)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    pvc = kube.get(f"{_claims(namespace)}/golden")
    owner = next(r for r in pvc["metadata"]["ownerReferences"] if r.get("controller"))
    assert (owner["kind"], owner["uid"]) == ("DataVolume", done["metadata"]["uid"])
    assert (volume_dir(kube, namespace, "golden") / "disk.img").read_bytes() == MARKER
    assert _importer_pods(kube, namespace) == [] and _asked(image_server) == asked


def test_a_claim_populated_for_a_new_datavolume_is_kept_as_it_is(
    kube: Kube, namespace: str, controller: Product, image_server: ImageServer
) -> None:
    asked = _asked(image_server)
    _user_claim(kube, namespace, "ready")
    kube.create(dv_path(namespace), datavolume("ready", _source(image_server)))
    done = wait_phase(kube, namespace, "ready", ("Succeeded", "Failed"), 60)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert (volume_dir(kube, namespace, "ready") / "disk.img").read_bytes() == MARKER
    assert _importer_pods(kube, namespace) == [] and _asked(image_server) == asked


@pytest.fixture
def static_pvs(kube: Kube) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        kube.delete_ignore_missing(f"/api/v1/persistentvolumes/{name}")


def _static_pv(
    kube: Kube, made: list[str], namespace: str, claim: str, folder: Path, size: str
) -> str:
    """An Available volume pre-bound to ``namespace/claim`` (no UID: the binder completes it),
    holding the marker as its ``disk.img``."""
    folder.mkdir(parents=True)
    (folder / "disk.img").write_bytes(MARKER)
    name = f"static-{namespace}"[:60]
    kube.create(
        "/api/v1/persistentvolumes",
        {
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "testkit-fs",
                "volumeMode": "Filesystem",
                "hostPath": {"path": str(folder)},
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
    )
    made.append(name)
    pv = f"/api/v1/persistentvolumes/{name}"
    wait_until(lambda: _phase(kube, pv) == "Available", f"PV {name} Available", 30)
    return name


def test_check_static_volume_binds_the_pre_bound_volume_and_keeps_its_data(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    static_pvs: list[str],
    tmp_path: Path,
) -> None:
    pv = _static_pv(kube, static_pvs, namespace, "static", tmp_path / "pv", "1Gi")
    asked = _asked(image_server)
    annotations = {"cdi.kubevirt.io/storage.checkStaticVolume": "true"}
    kube.create(
        dv_path(namespace), datavolume("static", _source(image_server), annotations=annotations)
    )
    done = wait_phase(kube, namespace, "static", ("Succeeded", "Failed"), 90)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    pvc = kube.get(f"{_claims(namespace)}/static")
    assert pvc["spec"]["volumeName"] == pv and pvc["status"]["phase"] == "Bound"
    annotations = pvc["metadata"]["annotations"]
    assert annotations[POPULATED_FOR] == "static" and VOLUME_LIST not in annotations
    assert "dataSourceRef" not in pvc["spec"]
    assert (tmp_path / "pv" / "disk.img").read_bytes() == MARKER
    assert _importer_pods(kube, namespace) == [] and _asked(image_server) == asked


def test_a_pre_bound_volume_too_small_for_the_claim_is_not_used(
    kube: Kube,
    namespace: str,
    controller: Product,
    image_server: ImageServer,
    images: Images,
    static_pvs: list[str],
    tmp_path: Path,
) -> None:
    pv = _static_pv(kube, static_pvs, namespace, "small", tmp_path / "pv", "1Mi")
    annotations = {"cdi.kubevirt.io/storage.checkStaticVolume": "true"}
    kube.create(
        dv_path(namespace), datavolume("small", _source(image_server), annotations=annotations)
    )
    done = wait_phase(kube, namespace, "small", ("Succeeded", "Failed"), 120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    pvc = kube.get(f"{_claims(namespace)}/small")
    assert pvc["spec"]["volumeName"] != pv and VOLUME_LIST not in pvc["metadata"]["annotations"]
    same_prefix_then_zeros(volume_dir(kube, namespace, "small") / "disk.img", images.reference)
    assert (tmp_path / "pv" / "disk.img").read_bytes() == MARKER
