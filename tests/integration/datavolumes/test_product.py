"""The product as a user installs it: ``crds/`` and ``deploy/`` applied with the real kubectl,
unchanged; every Deployment runs, the controller as 2 replicas behind a Lease, the webhook
reached through its Service; the README's DataVolume example, applied with kubectl, reaches
Succeeded and ``kubectl get dv`` / ``kubectl describe dv`` show what CDI's users expect."""

from __future__ import annotations

import re
import time

import pytest
import yaml

from testkit.product import CONTROLLER, NAMESPACE, Product, deployments
from testkit.tryout import example_datavolume
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import REPO, ImageServer, dv_path, wait_phase

pytestmark = pytest.mark.integration


def readme_example() -> str:
    """The DataVolume of the README's try-out section (its ``kubectl apply`` here-document), as
    a user copies it."""
    readme = (REPO / "README.md").read_text()
    found = re.findall(r"^kubectl apply -f - <<'EOF'\n(.*?)^EOF$", readme, flags=re.S | re.M)
    assert len(found) == 1, "the README should show exactly one DataVolume example"
    return str(found[0])


def test_every_deployment_in_deploy_is_available_with_the_controller_leading_by_lease(
    product: Product,
) -> None:
    kube = product.kube
    names = deployments()
    assert (NAMESPACE, CONTROLLER) in names and (NAMESPACE, "cdi-webhook") in names
    for ns, name in names:
        dep = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
        conds = {c["type"]: c["status"] for c in dep["status"].get("conditions") or []}
        assert conds.get("Available") == "True", (name, dep["status"])
        assert dep["status"].get("readyReplicas") == dep["spec"]["replicas"], name
    controllers = {p["metadata"]["name"] for p in product.pods(CONTROLLER)}
    assert len(controllers) == 2
    assert product.leader() in controllers  # the Lease names a running replica
    webhooks = product.pods("cdi-webhook")
    assert all(p["status"]["podIP"].startswith("127.") for p in webhooks)


def test_the_readme_example_applied_with_kubectl_succeeds_and_kubectl_shows_cdi_columns(
    product: Product, namespace: str, image_server: ImageServer
) -> None:
    example = readme_example()
    assert example == example_datavolume("127.0.0.1:8088"), "README and tryout differ"
    # The one edit: where the image is served (this test's own loopback server).
    url = image_server.url("ok", "disk.qcow2")
    doc = re.sub(r'url: "http://127\.0\.0\.1:8088/[^"]+"', f'url: "{url}"', example)
    assert url in doc
    name = yaml.safe_load(doc)["metadata"]["name"]
    product.kubectl("-n", namespace, "apply", "-f", "-", stdin=doc)
    dv = wait_phase(product.kube, namespace, name, ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]

    table = product.kubectl("-n", namespace, "get", "dv").splitlines()
    assert table[0].split() == ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"], table
    row = table[1].split()
    assert row[:4] == [name, "Succeeded", "100.0%", "0"], table
    assert product.kubectl("-n", namespace, "get", "datavolumes", name, "-o", "name") == (
        f"datavolume.cdi.kubevirt.io/{name}\n"
    )

    def described_with_success_event() -> str | None:
        text = product.kubectl("-n", namespace, "describe", "dv", name)
        return text if "ImportSucceeded" in text[text.index("Events:") :] else None

    # The event follows the status write, so it may land a moment after the phase.
    described = wait_until(described_with_success_event, "kubectl describe to show the event", 10)
    assert f"Name:         {name}" in described
    assert product.kube.get(dv_path(namespace, name))["spec"]["contentType"] == "kubevirt"


def test_a_leader_deleted_gracefully_releases_the_lease_and_the_deployment_heals(
    product: Product,
) -> None:
    old = product.leader()
    lease_seconds = product.lease()["spec"]["leaseDurationSeconds"]
    t0 = time.monotonic()
    product.kubectl("-n", NAMESPACE, "delete", "pod", old, "--wait=false")

    def successor() -> str | None:
        holder = product.leader()
        return holder if holder and holder != old else None

    new = wait_until(successor, "the standby to take the released Lease", lease_seconds)
    took = time.monotonic() - t0
    print(f"graceful hand-over: {new} leads {took:.1f} s after {old} was deleted")
    # SIGTERM makes the leader release the Lease: no waiting out its 15 s.
    assert took < lease_seconds / 2, f"{new} took over after {took:.1f} s"
    assert new in {p["metadata"]["name"] for p in product.pods(CONTROLLER)}
    product.kubectl(
        "-n", NAMESPACE, "wait", "--for=condition=Available", f"deployment/{CONTROLLER}",
        "--timeout=60s", timeout=70,
    )  # fmt: skip
    wait_until(lambda: len(product.pods(CONTROLLER)) == 2, "a replacement replica", 60)
