"""Issue 23, N1: a tenant cannot take another namespace's volume through a populator handover.

The attack, as the security review ran it live: ``alice`` (the built-in ``edit`` role in her
namespace, nothing on PersistentVolumes, nothing in the victim's namespace) creates a claim whose
``dataSourceRef`` names a ``VolumeImportSource`` (or ``VolumeUploadSource``), then creates its
"prime" herself, before the controller does: ``prime-<target uid>``, pre-bound
(``spec.volumeName``) to the victim's PV, with a forged ``storage.pod.phase: Succeeded``. Before
the fix the controller patched that PV's ``claimRef`` to alice's claim within seconds: she read
and wrote the victim's data and the victim's claim went ``Lost``.

Also: a forged outcome on the controller's *own* prime (alice edits its annotations mid-import)
must not hand over a half-written volume.

The real API server, PV binder and the product from ``deploy/``; alice acts with her own
credentials."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from testkit.cluster import Cluster
from testkit.kubeclient import ApiError, Kube
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    event_reasons,
    pv_of,
    same_prefix_then_zeros,
    volume_dir,
)
from tests.integration.datavolumes.populator_env import (
    import_source,
    populated_claim,
    pvc_path,
    vis_path,
)
from tests.integration.datavolumes.test_upload import User
from tests.integration.helpers import pvc_manifest

pytestmark = pytest.mark.integration

FORGED_OUTCOME = {"cdi.kubevirt.io/storage.pod.phase": "Succeeded"}
SECRET = "VICTIM-SECRET-4242\n"
# The populators poll a missing source every 5 s and re-check a prime every second or so:
# three polls is ample for the handover the attack provoked before the fix.
WATCH_SECONDS = 20.0


@pytest.fixture
def victim(cluster: Cluster, kube: Kube, namespace: str) -> Any:
    """A namespace alice has no right in, with a bound claim holding a secret."""
    ns = f"{namespace[:50]}-victim"
    kube.create("/api/v1/namespaces", {"metadata": {"name": ns}})
    claim = pvc_manifest("secret-db", "16Mi", "testkit-fs")
    kube.create(pvc_path(ns), claim)
    wait_until(
        lambda: kube.get(pvc_path(ns, "secret-db"))["status"].get("phase") == "Bound",
        "the victim's claim Bound",
        60,
    )
    (volume_dir(kube, ns, "secret-db") / "secret.txt").write_text(SECRET)
    yield ns
    kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}")


def impostor_prime(target: dict[str, Any], pv: dict[str, Any]) -> dict[str, Any]:
    """alice's "prime": pre-bound to the victim's PV, carrying a forged import outcome."""
    claim = pvc_manifest(
        f"prime-{target['metadata']['uid']}", "1Mi", pv["spec"]["storageClassName"]
    )
    claim["metadata"]["annotations"] = dict(FORGED_OUTCOME)
    claim["spec"]["volumeName"] = pv["metadata"]["name"]
    return claim


def assert_victim_untouched(kube: Kube, victim: str, pv_name: str, thief_ns: str) -> None:
    pv = kube.get(f"/api/v1/persistentvolumes/{pv_name}")
    ref = pv["spec"].get("claimRef") or {}
    assert (ref.get("namespace"), ref.get("name")) == (victim, "secret-db"), ref
    assert kube.get(pvc_path(victim, "secret-db"))["status"]["phase"] == "Bound"
    for claim in kube.get(pvc_path(thief_ns))["items"]:  # the impostor names it, unbound
        bound = claim.get("status", {}).get("phase") == "Bound"
        assert not (bound and claim["spec"].get("volumeName") == pv_name), claim["metadata"]
    assert (Path(pv["spec"]["local"]["path"]) / "secret.txt").read_text() == SECRET


@pytest.mark.parametrize("kind", ["VolumeImportSource", "VolumeUploadSource"])
def test_a_tenant_made_prime_bound_to_another_namespaces_volume_is_never_handed_over(
    cluster: Cluster, kube: Kube, namespace: str, product: Product, victim: str, kind: str
) -> None:
    alice = User(cluster, kube, namespace).kube
    pv = pv_of(kube, victim, "secret-db")
    target_manifest = populated_claim("steal", "nothing", "1Mi", pv["spec"]["storageClassName"])
    target_manifest["spec"]["dataSourceRef"]["kind"] = kind

    def created() -> dict[str, Any] | None:
        try:  # alice's RoleBinding may take a moment to reach the authorizer
            return alice.create(pvc_path(namespace), target_manifest)
        except ApiError:  # Forbidden until then
            return None

    target = wait_until(created, "alice's target claim", 30)
    alice.create(pvc_path(namespace), impostor_prime(target, pv))
    deadline = time.monotonic() + WATCH_SECONDS
    while time.monotonic() < deadline:
        assert_victim_untouched(kube, victim, pv["metadata"]["name"], namespace)
        time.sleep(1.0)
    steal = kube.get(pvc_path(namespace, "steal"))
    assert steal["status"].get("phase") != "Bound", steal["status"]
    reasons = event_reasons(kube, namespace, "steal", {"PrimeNotCreatedByController"})
    assert "RebindInProgress" not in reasons, reasons


def test_a_forged_outcome_on_the_controllers_prime_does_not_hand_over_a_partial_volume(
    cluster: Cluster, kube: Kube, namespace: str, product: Product, image_server: ImageServer,
    images: Images,
) -> None:  # fmt: skip
    alice = User(cluster, kube, namespace).kube
    wait_until(lambda: can_read_claims(alice, namespace), "alice's edit binding in effect", 30)
    # crawl: ~2.6 MiB of data at 192 KiB/s, well over the window watched below
    url = image_server.url("crawl", "disk.qcow2")
    kube.create(vis_path(namespace), import_source("src", {"http": {"url": url}}))
    target = kube.create(pvc_path(namespace), populated_claim("disk", "src"))
    prime = f"prime-{target['metadata']['uid']}"
    wait_until(lambda: importing(kube, namespace), "the importer pod running", 60)
    alice.patch(pvc_path(namespace, prime), {"metadata": {"annotations": FORGED_OUTCOME}})
    deadline = time.monotonic() + 6.0
    while time.monotonic() < deadline:
        claim = kube.get(pvc_path(namespace, "disk"))
        assert not claim["spec"].get("volumeName"), "a half-written volume was handed over"
        time.sleep(0.5)
    assert importing(kube, namespace), "the import ended inside the window: it proves nothing"
    wait_until(
        lambda: kube.get(pvc_path(namespace, "disk"))["status"].get("phase") == "Bound",
        "the target Bound once the real import is done",
        120,
    )
    same_prefix_then_zeros(volume_dir(kube, namespace, "disk") / "disk.img", images.reference)
    event_reasons(kube, namespace, "disk", {"PrimeRecordAltered"})


def can_read_claims(client: Kube, namespace: str) -> bool:
    try:
        client.get(pvc_path(namespace))
    except ApiError:
        return False
    return True


def importing(kube: Kube, namespace: str) -> bool:
    pods = kube.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    return any(p.get("status", {}).get("phase") == "Running" for p in pods)
