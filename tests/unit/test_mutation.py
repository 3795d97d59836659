"""The mutating webhook records the requester (unforgeably) and fills defaults."""

from __future__ import annotations

import json
from typing import Any

from cdi.webhooks.mutation import UserInfo, apply_patch, mutate_datavolume

USER = UserInfo("alice", ("devs", "system:authenticated"))
ANN_USER = "cdi.kubevirt.io/storage.requester.username"
ANN_GROUPS = "cdi.kubevirt.io/storage.requester.groups"


def dv(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "dv", "namespace": "ns"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"source": {"blank": {}}, **spec}}


def test_create_records_username_and_groups() -> None:
    out = apply_patch(dv(), mutate_datavolume(dv(), None, USER))
    assert out["metadata"]["annotations"][ANN_USER] == "alice"
    assert json.loads(out["metadata"]["annotations"][ANN_GROUPS]) == [
        "devs",
        "system:authenticated",
    ]


def test_create_overwrites_a_forged_requester() -> None:
    new = dv({ANN_USER: "admin", "keep": "me"})
    out = apply_patch(new, mutate_datavolume(new, None, USER))
    assert out["metadata"]["annotations"][ANN_USER] == "alice"
    assert out["metadata"]["annotations"]["keep"] == "me"


def test_update_restores_the_recorded_requester() -> None:
    old = dv({ANN_USER: "alice", ANN_GROUPS: '["devs"]'}, contentType="kubevirt")
    new = dv({ANN_USER: "mallory"}, contentType="kubevirt")
    out = apply_patch(new, mutate_datavolume(new, old, UserInfo("mallory")))
    assert out["metadata"]["annotations"] == {ANN_USER: "alice", ANN_GROUPS: '["devs"]'}


def test_update_cannot_add_a_requester_the_object_never_had() -> None:
    old = dv({}, contentType="kubevirt")
    new = dv({ANN_USER: "mallory"}, contentType="kubevirt")
    out = apply_patch(new, mutate_datavolume(new, old, UserInfo("mallory")))
    assert ANN_USER not in out["metadata"]["annotations"]


def test_defaults_content_type_and_registry_pull_method() -> None:
    new = {
        "metadata": {"name": "dv"},
        "spec": {"source": {"registry": {"url": "docker://quay.io/a/b"}}},
    }
    out = apply_patch(new, mutate_datavolume(new, None, USER))
    assert out["spec"]["contentType"] == "kubevirt"
    assert out["spec"]["source"]["registry"]["pullMethod"] == "pod"


def test_unchanged_update_needs_no_patch() -> None:
    old = dv({ANN_USER: "alice", ANN_GROUPS: "[]"}, contentType="archive")
    assert mutate_datavolume(old, old, UserInfo("bob")) == []
