"""The on-behalf record a DataImportCron's cross-namespace import carries (``cdi.api.onbehalf``):
verified only with the key, on the DataVolume it was signed for, for the source it was signed
for, near its creation time; a requester signature is no on-behalf one, and the template's
copy of the record never reaches the import."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

from cdi.api import onbehalf
from cdi.api.onbehalf import ANN_ON_BEHALF, ANN_ON_BEHALF_SIGNATURE, trusted_on_behalf
from cdi.api.requester import ANN_REQUESTER_SIGNATURE, Requester, sign
from cdi.controller.dataimportcron_desired import Cron, desired_import

KEY = b"k" * 32
NOW = datetime(2026, 12, 5, 19, 0, 0, tzinfo=UTC)
SOURCE = ("golden", "published")
SA = onbehalf.default_service_account("tenant")


def signed(**changes: Any) -> dict[str, Any]:
    ann = onbehalf.signed_annotations(KEY, "tenant", "golden-abc", SA, SOURCE, NOW)
    meta = {
        "name": "golden-abc",
        "namespace": "tenant",
        "creationTimestamp": "2026-12-05T19:00:01Z",
        "annotations": ann,
    }
    meta.update(changes)
    return {"metadata": meta}


def test_the_default_service_account_as_the_api_server_authenticates_it() -> None:
    assert SA == Requester(
        "system:serviceaccount:tenant:default",
        ("system:serviceaccounts", "system:serviceaccounts:tenant", "system:authenticated"),
    )


def test_a_record_verifies_for_its_datavolume_and_source() -> None:
    assert trusted_on_behalf(signed(), KEY, SOURCE) == SA


def test_a_record_is_bound_to_the_key_the_datavolume_the_source_and_the_time() -> None:
    assert trusted_on_behalf(signed(), None, SOURCE) is None
    assert trusted_on_behalf(signed(), b"x" * 32, SOURCE) is None
    assert trusted_on_behalf(signed(), KEY, ("golden", "other")) is None
    assert trusted_on_behalf(signed(), KEY, ("elsewhere", "published")) is None
    assert trusted_on_behalf(signed(name="golden-def"), KEY, SOURCE) is None
    assert trusted_on_behalf(signed(namespace="mallory"), KEY, SOURCE) is None
    later = (NOW + timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert trusted_on_behalf(signed(creationTimestamp=later), KEY, SOURCE) is None  # replay


def test_an_edited_identity_does_not_verify() -> None:
    obj = signed()
    obj["metadata"]["annotations"][ANN_ON_BEHALF] = onbehalf.record(
        Requester("system:admin", ("system:masters",))
    )
    assert trusted_on_behalf(obj, KEY, SOURCE) is None
    obj = signed()
    del obj["metadata"]["annotations"][ANN_ON_BEHALF_SIGNATURE]
    assert trusted_on_behalf(obj, KEY, SOURCE) is None


def test_a_requester_signature_is_not_an_on_behalf_one() -> None:
    """The version tag is the MAC's first field: a webhook signature moved over does not verify."""
    obj = signed()
    ann = obj["metadata"]["annotations"]
    requester = sign(KEY, "tenant", "golden-abc", {"x": ann[ANN_ON_BEHALF]}, NOW)
    ann[ANN_ON_BEHALF_SIGNATURE] = requester
    assert trusted_on_behalf(obj, KEY, SOURCE) is None
    ann[ANN_ON_BEHALF_SIGNATURE] = "ob1:" + requester.partition(":")[2]
    assert trusted_on_behalf(obj, KEY, SOURCE) is None


def test_the_templates_copy_of_the_record_never_reaches_the_import() -> None:
    stolen = signed()["metadata"]["annotations"]
    cron = Cron.from_obj(
        {
            "metadata": {"name": "c", "namespace": "tenant", "uid": "u"},
            "spec": {
                "managedDataSource": "golden",
                "schedule": "0 * * * *",
                "template": {
                    "metadata": {"annotations": {**copy.deepcopy(stolen), "keep": "me"}},
                    "spec": {
                        "source": {"pvc": {"namespace": "golden", "name": "published"}},
                        "storage": {"resources": {"requests": {"storage": "1Gi"}}},
                    },
                },
            },
        }
    )
    ann = desired_import(cron, "uid:0123456789abcdef")["metadata"]["annotations"]
    assert ANN_ON_BEHALF not in ann and ANN_ON_BEHALF_SIGNATURE not in ann
    assert ann["keep"] == "me" and ANN_REQUESTER_SIGNATURE not in ann
