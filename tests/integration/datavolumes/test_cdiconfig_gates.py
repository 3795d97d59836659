"""CDIConfig is the one place feature gates and the log verbosity are set, on the installed
product: the webhook and the controller read ``spec.featureGates`` from it (there is no
controller flag), so a claim adoption the webhook admits is carried out (CDI's adoption
scenarios); without the gate an existing claim is refused, as CDI refuses it. And
``spec.logVerbosity`` changes what each running process logs, with nothing restarted."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    CDI_NAMESPACE,
    DV_API,
    datavolume,
    dv_path,
    wait_phase,
)

pytestmark = pytest.mark.integration

CONFIG = f"{DV_API}/cdiconfigs/config"
GATE = "DataVolumeClaimAdoption"
ALLOW = "cdi.kubevirt.io/allowClaimAdoption"


@pytest.fixture
def spec_of_config(kube: Kube, product: Product) -> Iterator[Callable[[dict[str, Any]], None]]:
    """Merge-patch CDIConfig's spec; the fields touched are put back afterwards."""
    touched: dict[str, Any] = {}

    def patch(spec: dict[str, Any]) -> None:
        before = kube.get(CONFIG).get("spec") or {}
        for key in spec:
            touched.setdefault(key, before.get(key))
        kube.patch(CONFIG, {"spec": spec})

    yield patch
    if touched:
        kube.patch(CONFIG, {"spec": touched})


def existing_claim(kube: Kube, ns: str, name: str) -> str:
    """A claim nobody made for a DataVolume; its UID."""
    pvc = kube.create(ns_path(ns, "persistentvolumeclaims"), {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "testkit-fs",
                 "volumeMode": "Filesystem", "resources": {"requests": {"storage": "64Mi"}}},
    })  # fmt: skip
    return str(pvc["metadata"]["uid"])


def adopting(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return datavolume(name, {"blank": {}}, size="64Mi", annotations=annotations)


def assert_adopted(kube: Kube, ns: str, name: str, uid: str) -> None:
    done = wait_phase(kube, ns, name, ("Succeeded", "Failed"), 120)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    pvc = kube.get(ns_path(ns, "persistentvolumeclaims", name))
    assert pvc["metadata"]["uid"] == uid  # the same claim, taken over, not a new one


def test_with_the_gate_in_cdiconfig_only_a_datavolume_adopts_an_existing_claim(
    kube: Kube, namespace: str, spec_of_config: Callable[[dict[str, Any]], None]
) -> None:
    spec_of_config({"featureGates": [GATE]})
    uid = existing_claim(kube, namespace, "adopted")
    kube.create(dv_path(namespace), adopting("adopted"))  # no annotation: the gate decides
    assert_adopted(kube, namespace, "adopted", uid)


def test_without_the_gate_an_existing_claim_is_refused_unless_the_datavolume_allows_it(
    kube: Kube, namespace: str, spec_of_config: Callable[[dict[str, Any]], None]
) -> None:
    spec_of_config({"featureGates": ["HonorWaitForFirstConsumer"]})
    existing_claim(kube, namespace, "taken")
    with pytest.raises(ApiError) as refused:
        kube.create(dv_path(namespace), adopting("taken"))
    assert f"Destination PVC {namespace}/taken already exists" in str(refused.value)
    # the annotation decides over the gate, by the same rule in the webhook and the
    # controller: "True" is Go's ParseBool true (the controller once took only "true")
    uid = existing_claim(kube, namespace, "allowed")
    kube.create(dv_path(namespace), adopting("allowed", {ALLOW: "True"}))
    assert_adopted(kube, namespace, "allowed", uid)


def product_logs(cluster: Cluster, kube: Kube, app: str, container: str) -> list[str]:
    pods = kube.get(f"/api/v1/namespaces/{CDI_NAMESPACE}/pods", labelSelector=f"app={app}")
    return [
        cluster.container_log(CDI_NAMESPACE, p["metadata"]["name"], container)
        for p in pods["items"]
    ]


def test_log_verbosity_changes_what_each_running_process_logs(
    cluster: Cluster, kube: Kube, spec_of_config: Callable[[dict[str, Any]], None]
) -> None:
    processes = (
        ("cdi-controller", "controller"),
        ("cdi-webhook", "webhook"),
        ("cdi-apiserver", "apiserver"),
        ("cdi-uploadproxy", "uploadproxy"),
    )

    def counts(line: str) -> dict[str, list[int]]:
        return {
            app: [log.count(line) for log in product_logs(cluster, kube, app, container)]
            for app, container in processes
        }

    def logged_again(line: str, before: dict[str, list[int]]) -> bool:
        now = counts(line)
        for app, _ in processes:
            grew = [n > b for n, b in zip(now[app], before[app], strict=False)]
            # the controller: the replica that leads (a standby runs no informer and takes
            # CDIConfig's level once it leads); the servers: every replica
            if not (any(grew) if app == "cdi-controller" else grew and all(grew)):
                return False
        return True

    debug, info = (
        "log level DEBUG (CDIConfig logVerbosity 3)",
        "log level INFO (CDIConfig logVerbosity unset)",
    )
    before = counts(debug)
    spec_of_config({"logVerbosity": 3})
    wait_until(lambda: logged_again(debug, before), "DEBUG everywhere", 30, 0.5)
    before = counts(info)
    kube.patch(CONFIG, {"spec": {"logVerbosity": None}})
    wait_until(lambda: logged_again(info, before), "INFO again everywhere", 30, 0.5)
