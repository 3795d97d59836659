"""The DataSource mutator records the creator, signed so that only a DataSource's own record
is trusted (N7): never a DataVolume's signature on a DataSource of the same name, nor the
reverse; the reconciler's source lookup is pure and tested here too."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cdi.api.datasource_requester import trusted_datasource_requester
from cdi.api.requester import ANN_REQUESTER_SIGNATURE, Requester, RequesterSigner, trusted_requester
from cdi.api.types import DataSourceSource
from cdi.controller.datasource import source_objects
from cdi.kube.client import DATAVOLUMES, PVCS, VOLUME_SNAPSHOTS
from cdi.webhooks.datasource_mutation import mutate_datasource
from cdi.webhooks.mutation import UserInfo, apply_patch, mutate_datavolume

KEY = b"k" * 32
SIGNED_AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
SIGNER = RequesterSigner(KEY, clock=lambda: SIGNED_AT)
ALICE = UserInfo("alice", ("devs", "system:authenticated"))
ANN_USER = "cdi.kubevirt.io/storage.requester.username"


def obj(
    kind: str, name: str = "golden", annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "alice",
        "creationTimestamp": "2026-01-02T03:04:06Z",
    }
    if annotations is not None:
        meta["annotations"] = annotations
    return {"kind": kind, "metadata": meta, "spec": {"source": {}}}


def created_datasource(user: UserInfo = ALICE, **kw: Any) -> dict[str, Any]:
    new = obj("DataSource", **kw)
    return apply_patch(new, mutate_datasource(new, None, user, SIGNER, "alice"))


def test_the_webhook_signed_creator_of_a_datasource_is_trusted() -> None:
    ds = created_datasource()
    assert trusted_datasource_requester(ds, KEY) == Requester(
        "alice", ("devs", "system:authenticated")
    )
    assert trusted_datasource_requester(ds, None) is None
    assert trusted_datasource_requester(ds, b"x" * 32) is None


def test_a_forged_creator_is_overwritten_and_an_edited_record_is_not_trusted() -> None:
    ds = created_datasource(annotations={ANN_USER: "system:admin"})
    assert ds["metadata"]["annotations"][ANN_USER] == "alice"
    ds["metadata"]["annotations"][ANN_USER] = "system:admin"
    assert trusted_datasource_requester(ds, KEY) is None


def test_an_update_keeps_the_record_made_at_creation() -> None:
    old = created_datasource()
    new = obj("DataSource", annotations={ANN_USER: "mallory"})
    out = apply_patch(new, mutate_datasource(new, old, UserInfo("mallory"), SIGNER, "alice"))
    assert trusted_datasource_requester(out, KEY) == trusted_datasource_requester(old, KEY)


def test_signatures_do_not_cross_between_datavolumes_and_datasources() -> None:
    dv = obj("DataVolume")
    dv = apply_patch(dv, mutate_datavolume(dv, None, ALICE, SIGNER, "alice"))
    ds = created_datasource()
    assert trusted_requester(dv, KEY) is not None
    copied = obj("DataSource", annotations=dict(dv["metadata"]["annotations"]))
    assert trusted_datasource_requester(copied, KEY) is None
    reverse = obj("DataVolume", annotations=dict(ds["metadata"]["annotations"]))
    assert trusted_requester(reverse, KEY) is None


def test_a_generated_name_is_signed_as_its_prefix() -> None:
    new = obj("DataSource", name="")
    new["metadata"]["generateName"] = "golden-"
    out = apply_patch(new, mutate_datasource(new, None, ALICE, SIGNER, "alice"))
    out["metadata"]["name"] = "golden-x7k2p"
    assert trusted_datasource_requester(out, KEY) is not None
    out["metadata"]["name"] = "other-x7k2p"
    assert trusted_datasource_requester(out, KEY) is None


def test_without_a_key_no_signature_is_written() -> None:
    new = obj("DataSource", annotations={ANN_REQUESTER_SIGNATURE: "v1:forged"})
    out = apply_patch(new, mutate_datasource(new, None, ALICE, None, "alice"))
    assert ANN_REQUESTER_SIGNATURE not in out["metadata"]["annotations"]


def test_a_source_is_read_as_its_claim_and_datavolume_or_its_snapshot() -> None:
    pvc = DataSourceSource.from_dict({"pvc": {"namespace": "bob", "name": "disk"}})
    assert source_objects(pvc, "alice") == ("bob", [DATAVOLUMES, PVCS], "disk")
    snap = DataSourceSource.from_dict({"snapshot": {"name": "snap"}})
    assert source_objects(snap, "alice") == ("alice", [VOLUME_SNAPSHOTS], "snap")
    assert source_objects(DataSourceSource(), "alice") == ("alice", [], "")
