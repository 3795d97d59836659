"""A DataImportCron's pvc source in another namespace, on the real control plane with the product
installed (issue 27; CDI #3617, #3970/#3971).

The cron is admitted; the controller clones for the cron namespace's ``default`` ServiceAccount
only: without a RoleBinding in the source namespace the cron says ``NotAuthorized`` (CDI's
words), imports nothing and polls again on its schedule, not sooner; with one (a Role with
CDI's ``create datavolumes/source``), a forced poll imports the claim with identical bytes, the
import carrying the controller's signed on-behalf record. A tenant's own DataVolume carrying a
valid on-behalf record (signed with the real key, as a replayed or leaked one would be) gains
nothing: the record is read only on the controller's own DataVolumes; and the controller's own
DataVolume without one never clones across namespaces on the controller's rights.
"""

from __future__ import annotations

import base64
import filecmp
import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from cdi.api import onbehalf
from cdi.api.requester import ANN_REQUESTER_SIGNATURE, Requester, sign
from testkit.kubeclient import ApiError, Kube, ns_path
from testkit.product import Product
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    ImageServer,
    condition,
    dv_path,
    same_prefix_then_zeros,
)
from tests.integration.datavolumes.cdi_env import (  # the fixtures this module uses
    cdi_crds as cdi_crds,
)
from tests.integration.datavolumes.cdi_env import (
    controller as controller,
)
from tests.integration.datavolumes.cdi_env import (
    image_server as image_server,
)
from tests.integration.datavolumes.cdi_env import (
    images as images,
)
from tests.integration.datavolumes.cdi_env import (
    product as product,
)
from tests.integration.datavolumes.test_clone_csi import data_of
from tests.integration.datavolumes.test_clone_golden import new_namespace
from tests.integration.datavolumes.test_clone_golden import (
    webhooks_out_of_the_path as webhooks_out_of_the_path,
)
from tests.integration.test_dataimportcron_formats import (
    CRON_LABEL,
    CRONS,
    FORCE,
    NEXT,
    conditions,
    cron_of,
    import_of,
    publish,
    pvc_cron,
    wait_data_source,
)

pytestmark = pytest.mark.integration
RBAC = "/apis/rbac.authorization.k8s.io/v1"
KEY_SECRET = "/api/v1/namespaces/cdi/secrets/cdi-requester-key"
CONTROLLER_SA = "system:serviceaccount:cdi:cdi-controller"


@pytest.fixture
def source_ns(kube: Kube, controller: Any) -> Iterator[str]:
    ns = new_namespace(kube, "golden")
    yield ns
    kube.delete_ignore_missing(f"/api/v1/namespaces/{ns}")


def allow_default_sa_to_clone(kube: Kube, source: str, cron_ns: str) -> None:
    """CDI's explicit clone right in ``source`` for ``cron_ns``'s default ServiceAccount."""
    rule = {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"],
            "verbs": ["create"]}  # fmt: skip
    kube.create(f"{RBAC}/namespaces/{source}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "cron-cloner"}, "rules": [rule],
    })  # fmt: skip
    kube.create(f"{RBAC}/namespaces/{source}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "cron-cloner"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "cron-cloner"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": cron_ns}],
    })  # fmt: skip


def shared_key(kube: Kube) -> bytes:
    return base64.b64decode(kube.get(KEY_SECRET)["data"]["key"]).strip()


def up_to_date(kube: Kube, ns: str, cron: str) -> dict[str, Any]:
    return conditions(cron_of(kube, ns, cron)).get("UpToDate") or {}


def cron_dvs(kube: Kube, ns: str) -> list[str]:
    return [
        d["metadata"]["name"]
        for d in kube.get(dv_path(ns))["items"]
        if CRON_LABEL in (d["metadata"].get("labels") or {})
    ]


def test_a_cron_clones_from_another_namespace_only_for_its_default_service_account(
    kube: Kube, namespace: str, source_ns: str, image_server: ImageServer, images: Images,
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    deployed: Product = request.getfixturevalue("controller")
    uid = publish(kube, source_ns, image_server)
    kube.create(CRONS.format(ns=namespace), pvc_cron("xns-cron", source_ns, "testkit-fs", 2))

    # not authorized: said so in CDI's words, nothing imported, no poll before the schedule
    refused = wait_until(
        lambda: (
            (c := up_to_date(kube, namespace, "xns-cron")).get("reason") == "NotAuthorized" and c
        ),
        "UpToDate=False NotAuthorized",
        60,
    )
    assert refused["status"] == "False"
    sa = f"system:serviceaccount:{namespace}:default"
    assert refused["message"] == (
        "Not authorized to clone the source PVC: "
        f"User {sa} has insufficient permissions in clone source namespace {source_ns}"
    )
    year = time.strftime("%Y-", time.gmtime(time.time() + 366 * 86400))
    polled = cron_of(kube, namespace, "xns-cron")
    assert polled["metadata"]["annotations"][NEXT] > time.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert polled["metadata"]["annotations"][NEXT] < f"{year}12-31"
    executed = polled["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.lastCronTime"]
    time.sleep(4)  # reconciles go on: no new poll, no import
    again = cron_of(kube, namespace, "xns-cron")
    assert again["metadata"]["annotations"]["cdi.kubevirt.io/storage.import.lastCronTime"] == (
        executed
    )
    assert cron_dvs(kube, namespace) == []
    assert "sourceDesiredDigest" not in json.dumps(again["metadata"]["annotations"])

    # the default ServiceAccount may clone there: the next (forced) poll imports the claim
    allow_default_sa_to_clone(kube, source_ns, namespace)
    kube.patch(f"{CRONS.format(ns=namespace)}/xns-cron", FORCE)
    name = import_of(uid)
    wait_data_source(kube, namespace, "pvc", name, deployed, "xns-cron")
    dv = kube.get(dv_path(namespace, name))
    assert dv["spec"]["source"] == {"pvc": {"namespace": source_ns, "name": "published"}}
    ann = dv["metadata"]["annotations"]
    assert ann["cdi.kubevirt.io/storage.requester.username"] == CONTROLLER_SA
    assert json.loads(ann[onbehalf.ANN_ON_BEHALF])["username"] == sa
    key = shared_key(kube)
    assert onbehalf.trusted_on_behalf(dv, key, (source_ns, "published")) is not None
    assert filecmp.cmp(data_of(kube, namespace, name), data_of(kube, source_ns, "published"), False)
    same_prefix_then_zeros(data_of(kube, namespace, name), images.reference)
    assert (up_to_date(kube, namespace, "xns-cron")["status"]) == "True"


def signed_clone(
    key: bytes, ns: str, name: str, source: str, user: Requester | None, by: Requester
) -> dict[str, Any]:
    """A clone DataVolume of ``source/published`` whose requester record ``by`` verifies with
    the real key (as the webhook writes it), with an on-behalf record for ``user`` (if any)
    that verifies too."""
    now = datetime.now(UTC)
    record = by.record()
    annotations = {**record, ANN_REQUESTER_SIGNATURE: sign(key, ns, name, record, now)}
    if user is not None:
        annotations.update(
            onbehalf.signed_annotations(key, ns, name, user, (source, "published"), now)
        )
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "source": {"pvc": {"namespace": source, "name": "published"}},
            "storage": {"storageClassName": "testkit-fs",
                        "resources": {"requests": {"storage": "64Mi"}}},
        },
    }  # fmt: skip


def refused_clone(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    def refused() -> dict[str, Any] | None:
        dv = kube.get(dv_path(ns, name))
        bound = next((c for c in (dv.get("status") or {}).get("conditions") or []
                      if c["type"] == "Bound"), {})  # fmt: skip
        return dv if bound.get("reason") == "CloneNotAuthorized" else None

    return wait_until(refused, f"the controller to refuse {name}", 60)


def test_an_on_behalf_record_on_anyone_elses_datavolume_gains_nothing(
    kube: Kube, namespace: str, source_ns: str, image_server: ImageServer,
    webhooks_out_of_the_path: None,
) -> None:  # fmt: skip
    """The default ServiceAccount of ``namespace`` may clone from ``source_ns``; alice may not.
    Her DataVolume carries her (valid) requester record and a valid on-behalf record for that
    ServiceAccount: without the guard the clone would go ahead on the ServiceAccount's rights."""
    publish(kube, source_ns, image_server)
    allow_default_sa_to_clone(kube, source_ns, namespace)
    key = shared_key(kube)
    sa = onbehalf.default_service_account(namespace)
    alice = Requester("alice", ("system:authenticated",))
    kube.create(dv_path(namespace), signed_clone(key, namespace, "stolen", source_ns, sa, alice))
    dv = refused_clone(kube, namespace, "stolen")
    assert condition(dv, "Bound")["message"] == (
        f"User alice has insufficient permissions in clone source namespace {source_ns}"
    )

    # the controller's own DataVolume without an on-behalf record: its rights decide nothing
    controller_sa = Requester(
        CONTROLLER_SA,
        ("system:serviceaccounts", "system:serviceaccounts:cdi", "system:authenticated"),
    )
    kube.create(
        dv_path(namespace), signed_clone(key, namespace, "bare", source_ns, None, controller_sa)
    )
    dv = refused_clone(kube, namespace, "bare")
    assert "without a valid on-behalf record" in condition(dv, "Bound")["message"]
    time.sleep(3)
    for name in ("stolen", "bare"):
        assert kube.get_or_none(ns_path(namespace, "persistentvolumeclaims", name)) is None
    pods = kube.get(ns_path(source_ns, "pods"))["items"]
    assert not [p for p in pods if p["metadata"]["name"].endswith("-source-pod")]


def test_admission_still_checks_the_source_claims_fields(kube: Kube, namespace: str) -> None:
    bad = pvc_cron("bad-ns", "Not_A_Namespace", "testkit-fs", 1)
    with pytest.raises(ApiError) as refused:
        kube.create(CRONS.format(ns=namespace), bad)
    assert "spec.template.spec.source.pvc.namespace" in str(refused.value)
