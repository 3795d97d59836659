"""The CDI resource on the installed product (issue 26): its ``spec.config`` becomes CDIConfig's
spec (and a direct edit is put back), its status says Deployed with CDI's conditions, a second
one is in Error, ``workload`` places every worker pod, a DataVolume's node selector narrows it
(one that no node has leaves the DataVolume waiting, ``Unschedulable``, never ``Failed``), a
WaitForFirstConsumer claim's worker pod is pinned to the node the scheduler chose, and
``BlockUninstallIfWorkloadsExist`` refuses the resource's deletion while DataVolumes exist;
``cloneStrategyOverride`` makes a clone copy where the profile says csi-clone, and
``certConfig.server`` sets an upload server's certificate lifetime and deadline."""

from __future__ import annotations

import base64
import copy
import datetime as dt
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from cryptography import x509

from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    DV_API,
    condition,
    datavolume,
    dv_path,
    wait_phase,
    wait_running_reason,
)

pytestmark = pytest.mark.integration

CDIS = f"{DV_API}/cdis"
CONFIG = f"{DV_API}/cdiconfigs/config"
RETAIN = {"cdi.kubevirt.io/storage.pod.retainAfterCompletion": "true"}
NODE_SELECTOR = "cdi.kubevirt.io/storage.pod.nodeSelector"
TOLERATION = {"key": "cdi-test/dedicated", "operator": "Exists", "effect": "NoSchedule"}
ARCH_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [
                    {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
            ]
        }
    }
}  # fmt: skip

MakeCDI = Callable[..., dict[str, Any]]


@pytest.fixture
def cdi_resource(kube: Kube, product: Product) -> Iterator[MakeCDI]:
    """Create CDI resources; afterwards they go (their uninstall unblocked first) and
    CDIConfig's spec is what it was, with nothing of theirs left in its status."""
    saved = copy.deepcopy(kube.get(CONFIG).get("spec") or {})
    made: list[str] = []

    def make(name: str = "cdi", **spec: Any) -> dict[str, Any]:
        made.append(name)
        body = {"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
                "metadata": {"name": name}, "spec": spec}  # fmt: skip
        return kube.create(CDIS, body)

    yield make
    for name in made:
        try:
            kube.patch(f"{CDIS}/{name}", {"spec": {"uninstallStrategy": "RemoveWorkloads"}})
            kube.delete(f"{CDIS}/{name}")
        except ApiError as e:
            if e.status != 404:
                raise
    for _ in range(20):  # the controller writes the status meanwhile: 409, read again
        try:
            kube.replace(CONFIG, {**kube.get(CONFIG), "spec": saved})
            break
        except ApiError as e:
            if not e.conflict:
                raise
    wait_until(
        lambda: "workload" not in (kube.get(CONFIG).get("status") or {}),
        "CDIConfig's status without the CDI resource's workload",
        30,
    )


def config_status_has(kube: Kube, key: str) -> Callable[[], Any]:
    return lambda: (kube.get(CONFIG).get("status") or {}).get(key)


def pods_of(kube: Kube, ns: str, component: str) -> list[dict[str, Any]]:
    path = ns_path(ns, "pods")
    return list(kube.get(path, labelSelector=f"cdi.kubevirt.io={component}")["items"])


def test_spec_config_becomes_cdiconfigs_spec_and_the_status_is_cdis(
    kube: Kube, cdi_resource: MakeCDI
) -> None:
    config = {**(kube.get(CONFIG).get("spec") or {}), "insecureRegistries": ["cdi-test:5000"]}
    cdi_resource(config=config)
    wait_until(lambda: kube.get(CONFIG)["spec"] == config, "CDIConfig's spec from the CDI", 30)
    # a direct edit of CDIConfig is put back: the CDI resource is the source of truth
    kube.patch(CONFIG, {"spec": {"insecureRegistries": ["elsewhere:5000"]}})
    wait_until(lambda: kube.get(CONFIG)["spec"] == config, "the edit put back", 30)

    def deployed() -> dict[str, Any] | None:
        status = kube.get(f"{CDIS}/cdi").get("status") or {}
        return status if status.get("phase") == "Deployed" else None

    status = wait_until(deployed, "the CDI resource Deployed", 60)
    kinds = {c["type"]: c["status"] for c in status["conditions"]}
    assert kinds == {"Available": "True", "Progressing": "False", "Degraded": "False"}
    assert status["observedVersion"]

    cdi_resource("second")  # CDI serves one: a later one is in Error

    def second_in_error() -> bool:
        return (kube.get(f"{CDIS}/second").get("status") or {}).get("phase") == "Error"

    wait_until(second_in_error, "the second CDI resource in Error", 30)
    assert kube.get(f"{CDIS}/cdi")["status"]["phase"] == "Deployed"


def test_workload_placement_reaches_the_worker_pods_and_a_datavolume_narrows_it(
    kube: Kube, namespace: str, cdi_resource: MakeCDI
) -> None:
    workload = {"nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": [TOLERATION],
                "affinity": ARCH_AFFINITY}  # fmt: skip
    cdi_resource(workload=workload)
    wait_until(config_status_has(kube, "workload"), "the workload in CDIConfig's status", 30)

    kube.create(dv_path(namespace), datavolume("placed", {"blank": {}}, annotations=RETAIN))
    done = wait_phase(kube, namespace, "placed", ("Succeeded", "Failed"), 120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    (pod,) = pods_of(kube, namespace, "importer")
    spec = pod["spec"]  # as the real API server stored it
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert TOLERATION in spec["tolerations"]
    assert spec["affinity"] == ARCH_AFFINITY

    nowhere = {NODE_SELECTOR: '{"cdi-test/disk": "nvme"}'}  # no node has this label
    kube.create(dv_path(namespace), datavolume("nowhere", {"blank": {}}, annotations=nowhere))
    running = wait_running_reason(kube, namespace, "nowhere", "Unschedulable", 90)
    assert running["status"] == "False"
    assert running["message"].startswith("Importer pod cannot be scheduled")
    time.sleep(3)  # it waits; it does not fail
    dv = kube.get(dv_path(namespace, "nowhere"))
    assert dv["status"]["phase"] == "ImportScheduled", dv["status"]
    assert condition(dv, "Ready")["status"] == "False"
    pending = [p for p in pods_of(kube, namespace, "importer") if p["status"]["phase"] == "Pending"]
    (terms,) = [
        p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ]
        for p in pending
    ]
    assert terms[0]["matchExpressions"][-1] == {
        "key": "cdi-test/disk", "operator": "In", "values": ["nvme"]
    }  # fmt: skip


def test_a_wait_for_first_consumer_claims_importer_runs_on_the_chosen_node(
    kube: Kube, namespace: str, product: Product
) -> None:
    nodes = [n["metadata"]["name"] for n in kube.get("/api/v1/nodes")["items"]]
    local = datavolume("local", {"blank": {}}, "16Mi", "testkit-csi-fs-wffc", annotations=RETAIN)
    kube.create(dv_path(namespace), local)
    wait_phase(kube, namespace, "local", ("PendingPopulation",), 60)
    consumer = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "vm"},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "600"],
                                 "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
                 "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": "local"}}]},
    }  # fmt: skip
    kube.create(ns_path(namespace, "pods"), consumer)

    def importer_affinity() -> dict[str, Any] | None:
        for pod in pods_of(kube, namespace, "importer"):
            return dict(pod["spec"].get("affinity") or {})
        return None

    affinity = wait_until(importer_affinity, "the prime's importer pod", 60, interval=0.05)
    chosen = kube.get(ns_path(namespace, "persistentvolumeclaims", "local"))["metadata"][
        "annotations"
    ]["volume.kubernetes.io/selected-node"]
    assert chosen in nodes
    required = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert required["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [chosen]}]}
    ]
    done = wait_phase(kube, namespace, "local", ("Succeeded", "Failed"), 120)
    assert done["status"]["phase"] == "Succeeded", done["status"]


def test_the_cdi_resource_is_not_deleted_while_datavolumes_exist_if_it_says_so(
    kube: Kube, namespace: str, cdi_resource: MakeCDI
) -> None:
    cdi_resource(uninstallStrategy="BlockUninstallIfWorkloadsExist")
    wait_until(
        lambda: (kube.get(f"{CDIS}/cdi").get("status") or {}).get("phase") == "Deployed",
        "the CDI resource Deployed",
        60,
    )
    kube.create(dv_path(namespace), datavolume("keep", {"blank": {}}))
    with pytest.raises(ApiError) as refused:
        kube.delete(f"{CDIS}/cdi")
    assert "Rejecting the uninstall request, since there are still DataVolumes present" in str(
        refused.value
    )
    assert kube.get(f"{CDIS}/cdi")["metadata"]["name"] == "cdi"  # still there
    kube.delete(dv_path(namespace, "keep"))

    def gone() -> bool:
        return not kube.get(dv_path(namespace))["items"]

    wait_until(gone, "no DataVolume left", 60)
    # other tests' DataVolumes may exist in other namespaces: only the ones of this cluster count
    if not kube.get(f"{DV_API}/datavolumes")["items"]:
        kube.delete(f"{CDIS}/cdi")
        wait_until(lambda: not kube.get(CDIS)["items"], "the CDI resource deleted", 30)


def test_clone_strategy_override_copy_beats_the_profiles_csi_clone(
    kube: Kube, namespace: str, cdi_resource: MakeCDI
) -> None:
    kube.create(dv_path(namespace), datavolume("golden", {"blank": {}}, "16Mi", "testkit-csi-fs"))
    assert (
        wait_phase(kube, namespace, "golden", ("Succeeded", "Failed"), 120)["status"]["phase"]
        == "Succeeded"
    )
    profile = kube.get(f"{DV_API}/storageprofiles/testkit-csi-fs")
    assert profile["status"]["cloneStrategy"] != "copy"  # the profile alone would not copy
    cdi_resource(cloneStrategyOverride="copy")
    wait_until(config_status_has(kube, "cloneStrategyOverride"), "the override in CDIConfig", 30)
    clone = {
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "copied"},
        "spec": {"source": {"pvc": {"namespace": namespace, "name": "golden"}},
                 "storage": {"storageClassName": "testkit-csi-fs", "volumeMode": "Filesystem"}},
    }  # fmt: skip
    kube.create(dv_path(namespace), clone)
    done = wait_phase(kube, namespace, "copied", ("Succeeded", "Failed"), 180)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    claim = kube.get(ns_path(namespace, "persistentvolumeclaims", "copied"))
    assert claim["metadata"]["annotations"]["cdi.kubevirt.io/cloneType"] == "copy"


def test_cert_config_server_sets_the_upload_servers_certificate_and_deadline(
    kube: Kube, namespace: str, cdi_resource: MakeCDI
) -> None:
    cdi_resource(certConfig={"server": {"duration": "2h", "renewBefore": "30m"}})
    wait_until(config_status_has(kube, "certConfig"), "the certConfig in CDIConfig", 30)
    up = datavolume("up", {"upload": {}}, "32Mi")
    kube.create(dv_path(namespace), up)
    wait_phase(kube, namespace, "up", ("UploadReady",), 120)
    started = time.time()
    secret = kube.get(ns_path(namespace, "secrets", "cdi-upload-up-tls"))
    pem = base64.b64decode(secret["data"]["tls.crt"])
    cert = x509.load_pem_x509_certificate(pem)
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert lifetime == dt.timedelta(hours=2, minutes=5)  # valid from 5 minutes before issuing
    pod = kube.get(ns_path(namespace, "pods", "cdi-upload-up"))
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    deadline = dt.datetime.strptime(env["DEADLINE"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    left = deadline.timestamp() - started
    assert 90 * 60 - 120 < left <= 90 * 60  # duration - renewBefore from when it was issued
