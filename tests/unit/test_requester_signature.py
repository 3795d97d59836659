"""The requester record is trusted only when the mutating webhook wrote it: signed with the
shared key, bound to the DataVolume's namespace, name and creation time; the requester's uid
and extra are recorded and signed with it and reach every SubjectAccessReview (W1)."""

from __future__ import annotations

import copy
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from cdi.api.cloneauth import access_review_body, clone_checks
from cdi.api.requester import (
    ANN_REQUESTER_SIGNATURE,
    Requester,
    RequesterSigner,
    trusted_requester,
)
from cdi.webhooks.mutation import UserInfo, apply_patch, mutate_datavolume
from cdi.webhooks.visibility import access_review

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


# --- W1 (issue 23): uid and extra are part of the requester --------------------------------

SCOPED = UserInfo.from_dict(
    {
        "username": "alice",
        "uid": "b6c1e0d2-uid",
        "groups": ["devs", "system:authenticated"],
        "extra": {
            "scopes.example.com/allowed": ["read-only"],
            "authentication.kubernetes.io/x": [],
        },
    }
)
EXTRA = "cdi.kubevirt.io/storage.requester.extra"


def scoped_admitted() -> dict[str, Any]:
    obj = submitted()
    out = apply_patch(obj, mutate_datavolume(obj, None, SCOPED, SIGNER, "tenant"))
    out["metadata"]["creationTimestamp"] = (NOW + timedelta(seconds=1)).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )
    return out


def test_a_scoped_requesters_uid_and_extra_reach_the_controllers_access_reviews() -> None:
    requester = trusted_requester(scoped_admitted(), KEY)
    assert requester is not None
    assert requester.uid == "b6c1e0d2-uid"
    assert requester.extra_dict() == {
        "authentication.kubernetes.io/x": [],
        "scopes.example.com/allowed": ["read-only"],
    }
    check = clone_checks(False, "fedora")[0][0]
    spec = access_review_body(requester, "golden", check)["spec"]  # the controller's review
    assert spec["uid"] == "b6c1e0d2-uid"
    assert spec["extra"]["scopes.example.com/allowed"] == ["read-only"]
    webhook_spec = access_review(SCOPED, "golden", "", "persistentvolumeclaims", "p")["spec"]
    assert webhook_spec["extra"] == spec["extra"] and webhook_spec["uid"] == spec["uid"]


def test_editing_or_dropping_the_recorded_extra_breaks_the_signature() -> None:
    good = scoped_admitted()
    assert trusted_requester(good, KEY) is not None
    dropped = copy.deepcopy(good)
    dropped["metadata"]["annotations"].pop(EXTRA)  # judged as the unscoped user: no
    assert trusted_requester(dropped, KEY) is None
    widened = copy.deepcopy(good)
    widened["metadata"]["annotations"][EXTRA] = '{"scopes.example.com/allowed":["admin"]}'
    assert trusted_requester(widened, KEY) is None
    added = admitted(submitted())  # signed without extra: one added later does not verify
    added["metadata"]["annotations"][EXTRA] = '{"scopes.example.com/allowed":["admin"]}'
    assert trusted_requester(added, KEY) is None


def test_a_v1_record_is_refused() -> None:
    # What the webhook before issue 23 wrote: it signed any review POSTed to it (N2), so a v1
    # signature does not show that the API server admitted the DataVolume.
    stamp = NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    groups = '["system:masters"]'
    message = json.dumps(
        ["v1", "tenant", "dv", "system:admin", groups, stamp], separators=(",", ":")
    )
    mac = hmac.new(KEY, message.encode(), hashlib.sha256).hexdigest()
    obj = submitted(
        annotations={
            USERNAME: "system:admin",
            "cdi.kubevirt.io/storage.requester.groups": groups,
            ANN_REQUESTER_SIGNATURE: f"v1:{stamp}:{mac}",
        },
        creationTimestamp=stamp,
    )
    assert trusted_requester(obj, KEY) is None
