"""The requester record is trusted only when the mutating webhook wrote it: signed with the
shared key, bound to the DataVolume's namespace, name and creation time."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from cdi.api.requester import (
    ANN_REQUESTER_SIGNATURE,
    Requester,
    RequesterSigner,
    trusted_requester,
)
from cdi.webhooks.mutation import UserInfo, apply_patch, mutate_datavolume

KEY = b"k" * 32
NOW = datetime(2026, 12, 1, 22, 0, 0, tzinfo=UTC)
SIGNER = RequesterSigner(KEY, clock=lambda: NOW)
ALICE = UserInfo("alice", ("devs", "system:authenticated"))
USERNAME = "cdi.kubevirt.io/storage.requester.username"


def submitted(**meta: Any) -> dict[str, Any]:
    metadata = {"name": "dv", "namespace": "tenant", **meta}
    return {"metadata": metadata, "spec": {"source": {"blank": {}}}}


def admitted(obj: dict[str, Any], signer: RequesterSigner | None = SIGNER) -> dict[str, Any]:
    """What the API server stores: the webhook's patch applied, then a name and a timestamp."""
    out = apply_patch(obj, mutate_datavolume(obj, None, ALICE, signer, "tenant"))
    meta = out["metadata"]
    meta["name"] = meta.get("name") or f"{meta.get('generateName', '')}x7k2p"
    meta["creationTimestamp"] = (NOW + timedelta(seconds=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def test_a_record_the_webhook_signed_is_trusted() -> None:
    assert trusted_requester(admitted(submitted()), KEY) == Requester(
        "alice", ("devs", "system:authenticated")
    )
    generated = admitted(submitted(name=None, generateName="disk-"))
    assert generated["metadata"]["name"] == "disk-x7k2p"
    assert trusted_requester(generated, KEY) is not None


def test_a_record_written_without_the_webhook_is_not_trusted() -> None:
    forged = admitted(submitted())
    forged["metadata"]["annotations"].pop(ANN_REQUESTER_SIGNATURE)
    assert trusted_requester(forged, KEY) is None
    assert trusted_requester(admitted(submitted(), signer=None), KEY) is None
    assert trusted_requester(admitted(submitted()), None) is None  # no key: trust nothing


def test_editing_any_signed_field_breaks_the_signature() -> None:
    good = admitted(submitted())
    for path, value in (
        (("annotations", USERNAME), "system:admin"),
        (("annotations", "cdi.kubevirt.io/storage.requester.groups"), '["system:masters"]'),
        (("namespace",), "other"),
        (("name",), "other"),
    ):
        obj = copy.deepcopy(good)
        target = obj["metadata"]
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert trusted_requester(obj, KEY) is None, path
    assert trusted_requester(good, b"another key" * 3) is None


def test_a_signature_replayed_on_a_later_datavolume_is_not_trusted() -> None:
    replayed = admitted(submitted())
    replayed["metadata"]["creationTimestamp"] = "2026-12-02T09:00:00Z"
    assert trusted_requester(replayed, KEY) is None


def test_the_webhook_overwrites_a_user_supplied_record_and_keeps_it_on_update() -> None:
    lying = submitted(annotations={USERNAME: "system:admin", ANN_REQUESTER_SIGNATURE: "v1:x:y"})
    unsigned = apply_patch(lying, mutate_datavolume(lying, None, ALICE, None, "tenant"))
    assert unsigned["metadata"]["annotations"][USERNAME] == "alice"
    assert ANN_REQUESTER_SIGNATURE not in unsigned["metadata"]["annotations"]
    stored = admitted(lying)
    update = copy.deepcopy(stored)
    update["metadata"]["annotations"][ANN_REQUESTER_SIGNATURE] = "v1:tampered:0"
    bob = UserInfo("bob")
    restored = apply_patch(update, mutate_datavolume(update, stored, bob, SIGNER, "tenant"))
    assert restored["metadata"]["annotations"] == stored["metadata"]["annotations"]
    assert trusted_requester(restored, KEY) == Requester("alice", ALICE.groups)
