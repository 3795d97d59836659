"""DataSources on the real control plane, as CDI's ``tests/datasource_test.go`` drives them: an
empty source is ``NoSource``, a missing PVC ``NotFound``; a DataVolume cloning through it waits
as ``CloneWithoutSource``; once the PVC is imported the DataSource is ``Ready`` (with the
source's ``*.kubevirt.io/*`` labels) and the clone succeeds; a DataSource naming that one
follows it; deleting the PVC makes it ``NotFound`` again."""

from __future__ import annotations

from typing import Any

import pytest

from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    ImageServer,
    datavolume,
    dv_path,
    wait_phase,
)

pytestmark = pytest.mark.integration


def ds_path(ns: str, name: str = "") -> str:
    return f"{DV_API}/namespaces/{ns}/datasources" + (f"/{name}" if name else "")


def ready(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    conds = (kube.get(ds_path(ns, name)).get("status") or {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "Ready"), {})


def wait_reason(kube: Kube, ns: str, name: str, reason: str) -> dict[str, Any]:
    return wait_until(
        lambda: (c := ready(kube, ns, name)).get("reason") == reason and c,
        f"DataSource {name} Ready reason {reason}",
        60,
        0.2,
    )


def test_a_datasource_follows_its_pvc_and_a_clone_waits_for_it(
    kube: Kube, namespace: str, controller: Any, image_server: ImageServer
) -> None:
    def source(spec: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataSource",
                "metadata": {"name": "os"}, "spec": {"source": spec}}  # fmt: skip

    kube.create(ds_path(namespace), source({}))
    empty = wait_reason(kube, namespace, "os", "NoSource")
    assert (empty["status"], empty["message"]) == ("False", "No source PVC set")
    kube.patch(ds_path(namespace, "os"),
               {"spec": {"source": {"pvc": {"namespace": namespace, "name": "img"}}}})  # fmt: skip
    assert wait_reason(kube, namespace, "os", "NotFound")["status"] == "False"
    alias = source({"dataSource": {"namespace": namespace, "name": "os"}})
    alias["metadata"]["name"] = "alias"
    kube.create(ds_path(namespace), alias)
    wait_reason(kube, namespace, "alias", "NotFound")

    clone = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
             "metadata": {"name": "vm-disk"},
             "spec": {"sourceRef": {"kind": "DataSource", "name": "alias"},
                      "storage": {"storageClassName": "testkit-fs"}}}  # fmt: skip
    kube.create(dv_path(namespace), clone)
    wait_until(
        lambda: any(c["type"] == "Bound" and c.get("reason") == "CloneWithoutSource"
                    for c in (kube.get(dv_path(namespace, "vm-disk")).get("status") or {})
                    .get("conditions") or []),
        "CloneWithoutSource", 30,
    )  # fmt: skip

    image = datavolume("img", {"http": {"url": image_server.url("ok", "disk.qcow2")}})
    image["metadata"]["labels"] = {"instancetype.kubevirt.io/default-preference": "fedora",
                                   "app": "not-copied"}  # fmt: skip
    kube.create(dv_path(namespace), image)
    wait_reason(kube, namespace, "os", "Ready")
    wait_reason(kube, namespace, "alias", "Ready")
    labels = kube.get(ds_path(namespace, "os"))["metadata"].get("labels") or {}
    assert labels.get("instancetype.kubevirt.io/default-preference") == "fedora"
    assert "app" not in labels
    dv = wait_phase(kube, namespace, "vm-disk", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]

    kube.delete(dv_path(namespace, "img"))
    wait_until(lambda: kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", "img"))
               is None, "the image's claim gone", 60)  # fmt: skip
    wait_reason(kube, namespace, "os", "NotFound")
