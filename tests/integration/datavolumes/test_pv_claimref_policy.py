"""deploy/16-pv-claimref-policy.yaml on the real API server: acting as the controller's
ServiceAccount, a PersistentVolume's claimRef moves only as the controller's own code moves it
(a prime claim's PV to its target in the same namespace, a clone's held PV to its move target,
an abandoned move released), never another namespace's PV to a tenant's claim (N1).

Requests are ``kubectl --as=system:serviceaccount:cdi:cdi-controller patch --dry-run=server``:
RBAC and admission run as for the controller's own patch (it may patch every PV), nothing is
written. The PVs are made by the admin with reclaim policy Retain and a hostPath nobody mounts.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from testkit.kubeclient import Kube
from testkit.product import KubectlFailed, Product
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration

CONTROLLER_SA = "system:serviceaccount:cdi:cdi-controller"
POLICY = "cdi-controller-pv-claimref"
CLONE_FOR = "cdi.kubevirt.io/cloneFor"
MOVE_TARGET = "cdi.kubevirt.io/clone.moveTarget"
PVS = "/api/v1/persistentvolumes"


def _uid() -> str:
    h = secrets.token_hex(16)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _ref(namespace: str, name: str, uid: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "namespace": namespace,
        "name": name,
        "uid": uid,
    }


@pytest.fixture
def make_pv(kube: Kube) -> Iterator[Any]:
    made: list[str] = []

    def make(
        claim_ref: dict[str, Any],
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> str:
        name = f"policy-pv-{secrets.token_hex(4)}"
        ref = {k: v for k, v in claim_ref.items() if v is not None}
        kube.create(
            PVS,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {
                    "name": name,
                    "labels": labels or {},
                    "annotations": annotations or {},
                },
                "spec": {
                    "capacity": {"storage": "1Mi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": "policy-test-none",
                    "hostPath": {"path": f"/nonexistent/{name}"},
                    "claimRef": ref,
                },
            },
        )
        made.append(name)
        return name

    yield make
    for name in made:
        kube.delete_ignore_missing(f"{PVS}/{name}")


def _patch(
    product: Product, pv: str, patch: dict[str, Any], user: str | None = CONTROLLER_SA
) -> str:
    """'' when admitted, else the API server's refusal."""
    args = ["patch", "pv", pv, "--type=merge", "--dry-run=server", "-p", json.dumps(patch)]
    try:
        product.kubectl(*([f"--as={user}"] if user else []), *args)
    except KubectlFailed as e:
        return str(e)
    return ""


def _claim_ref_patch(namespace: str, name: str, uid: str | None) -> dict[str, Any]:
    return {"spec": {"claimRef": {**_ref(namespace, name, uid), "resourceVersion": None}}}


@pytest.fixture
def policy_loaded(product: Product, make_pv: Any, namespace: str) -> None:
    """The API server applies a new policy a moment after it is created: wait for a refusal."""
    pv = make_pv(_ref(namespace, "loaded", _uid()))
    wait_until(
        lambda: _patch(product, pv, _claim_ref_patch("elsewhere", "x", _uid())) != "",
        "the PV claimRef policy to refuse",
        30,
    )


def test_the_controller_may_not_hand_another_namespaces_pv_to_a_tenant_claim(
    product: Product, make_pv: Any, namespace: str, policy_loaded: None
) -> None:
    """N1's end: the victim's PV (bound in ``namespace``) pointed at the attacker's claim."""
    victim = make_pv(_ref(namespace, "golden", _uid()))
    refused = _patch(product, victim, _claim_ref_patch("evil", "steal", _uid()))
    assert POLICY in refused and f"{namespace}/golden -> evil/steal" in refused, refused
    # a victim's claim named like a prime is still in another namespace
    prime_named = make_pv(_ref(namespace, f"prime-{_uid()}", _uid()))
    assert POLICY in _patch(product, prime_named, _claim_ref_patch("evil", "steal", _uid()))


def test_the_controller_may_not_set_or_remove_a_claim_ref_or_rebind_a_plain_claim(
    product: Product, make_pv: Any, namespace: str, policy_loaded: None
) -> None:
    pv = make_pv(_ref(namespace, "data", _uid()))
    assert POLICY in _patch(product, pv, _claim_ref_patch(namespace, "other", _uid()))
    assert POLICY in _patch(product, pv, {"spec": {"claimRef": None}})


def test_the_controller_may_not_move_a_pv_it_does_not_hold(
    product: Product, make_pv: Any, namespace: str, policy_loaded: None
) -> None:
    dv_uid = _uid()
    # labelling someone's PV as held by a clone is refused ...
    victim = make_pv(_ref(namespace, "golden", _uid()))
    refused = _patch(product, victim, {"metadata": {"labels": {CLONE_FOR: dv_uid}}})
    assert POLICY in refused, refused
    # ... and so is moving a labelled PV that is not bound to the clone's temporary claim, or
    # to a target other than the one its move recorded
    labelled = make_pv(
        _ref(namespace, "golden", _uid()),
        labels={CLONE_FOR: dv_uid},
        annotations={MOVE_TARGET: "evil/steal"},
    )
    assert POLICY in _patch(product, labelled, _claim_ref_patch("evil", "steal", None))
    held = make_pv(
        _ref(namespace, f"tmp-pvc-{dv_uid}", _uid()),
        labels={CLONE_FOR: dv_uid},
        annotations={MOVE_TARGET: "target-ns/target"},
    )
    assert POLICY in _patch(product, held, _claim_ref_patch("evil", "steal", None))
    assert POLICY in _patch(product, held, {"metadata": {"labels": {CLONE_FOR: _uid()}}})


def test_the_controllers_own_pv_changes_are_admitted(
    product: Product, make_pv: Any, namespace: str, policy_loaded: None
) -> None:
    # the populators' handover: prime-<target uid> -> the target, one namespace
    target_uid = _uid()
    prime = make_pv(_ref(namespace, f"prime-{target_uid}", _uid()))
    assert _patch(product, prime, _claim_ref_patch(namespace, "target", target_uid)) == ""
    # the clone's hold: label and reclaim policy on the temporary claim's PV
    dv_uid = _uid()
    tmp = make_pv(_ref(namespace, f"tmp-pvc-{dv_uid}", _uid()))
    hold = {
        "metadata": {
            "labels": {CLONE_FOR: dv_uid},
            "annotations": {MOVE_TARGET: "target-ns/target"},
        },
        "spec": {"persistentVolumeReclaimPolicy": "Retain"},
    }
    assert _patch(product, tmp, hold) == ""
    # the move of a held PV to the target its hold recorded, pre-bound (no uid)
    held = make_pv(
        _ref(namespace, f"tmp-pvc-{dv_uid}", _uid()),
        labels={CLONE_FOR: dv_uid},
        annotations={MOVE_TARGET: "target-ns/target"},
    )
    assert _patch(product, held, _claim_ref_patch("target-ns", "target", None)) == ""
    # finish: the label and annotations go, the claim reference stays
    bound = make_pv(
        _ref("target-ns", "target", _uid()),
        labels={CLONE_FOR: dv_uid},
        annotations={MOVE_TARGET: "target-ns/target"},
    )
    done = {"metadata": {"labels": {CLONE_FOR: None}, "annotations": {MOVE_TARGET: None}}}
    assert _patch(product, bound, done) == ""
    # an abandoned move: a pre-bound reference gets a uid no claim has
    waiting = make_pv(
        _ref("target-ns", "target", None),
        labels={CLONE_FOR: dv_uid},
        annotations={MOVE_TARGET: "target-ns/target"},
    )
    release = {"metadata": {"labels": {CLONE_FOR: None}}, "spec": {"claimRef": {"uid": "x"}}}
    assert _patch(product, waiting, release) == ""


def test_other_users_pv_changes_are_not_the_policys_business(
    product: Product, make_pv: Any, namespace: str, policy_loaded: None
) -> None:
    pv = make_pv(_ref(namespace, "golden", _uid()))
    assert _patch(product, pv, _claim_ref_patch("elsewhere", "x", _uid()), user=None) == ""
