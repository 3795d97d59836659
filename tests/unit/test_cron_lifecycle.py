"""Pure parts of a DataImportCron's life as CDI lives it: a pvc source's identity and import,
the snapshot source format (the snapshot, the DataSource at it), ``lastUseTime`` ordering of
garbage collection with ``importsToKeep``, the ``Progressing`` / ``UpToDate`` wording, the
conditions' timestamps, and admission of pvc sources."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.controller.dataimportcron import use_time
from cdi.controller.dataimportcron_desired import (
    ANN_ADVISED_RESTORE_SIZE,
    ANN_DESIRED_DIGEST,
    ANN_LAST_USE_TIME,
    ANN_SOURCE_VOLUME_MODE,
    FORMAT_PVC,
    FORMAT_SNAPSHOT,
    IMPORTING,
    LABEL_CLEANUP,
    LABEL_CRON,
    OUTDATED,
    Cron,
    beyond_keep,
    condition,
    desired_data_source,
    desired_import,
    desired_snapshot,
    import_name,
    import_progressing,
    import_up_to_date,
    pvc_digest,
    source_format,
    unfinished,
)
from cdi.webhooks.dataimportcron import validate_dataimportcron
from cdi.webhooks.syntax import DNS1123_SUBDOMAIN_MSG

UID = "3f2a1b4c-1234-4abc-8def-0123456789ab"


def cron_obj(source: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "golden-cron", "namespace": "golden", "uid": "c" * 36},
        "spec": {
            "schedule": "0 * * * *",
            "managedDataSource": "golden",
            "template": {
                "spec": {
                    "source": source,
                    "storage": {"resources": {"requests": {"storage": "1Gi"}}},
                }
            },
            **spec,
        },
    }


PVC_SOURCE = {"pvc": {"name": "published"}}


def test_a_pvc_source_is_known_by_its_claims_uid_and_cloned_into_a_named_import() -> None:
    cron = Cron.from_obj(cron_obj(PVC_SOURCE))
    assert cron.kind == "pvc" and cron.usable
    assert cron.source_claim == ("golden", "published")
    digest = pvc_digest(UID)
    assert digest == f"uid:{UID}"
    assert import_name("golden", digest) == "golden-3f2a1b4c-123"  # CDI's createDvName
    dv = desired_import(cron, digest, now="2026-01-01T00:00:00.000000Z")
    assert dv["spec"]["source"] == {"pvc": {"namespace": "golden", "name": "published"}}
    meta = dv["metadata"]
    assert meta["name"] == "golden-3f2a1b4c-123"
    assert meta["labels"][LABEL_CRON] == "golden-cron"
    assert meta["annotations"][ANN_DESIRED_DIGEST] == digest
    assert meta["annotations"][ANN_LAST_USE_TIME] == "2026-01-01T00:00:00.000000Z"
    assert meta["annotations"]["cdi.kubevirt.io/storage.bind.immediate.requested"] == "true"


def test_a_profile_asking_for_read_write_once_sets_it_only_where_the_template_sets_none() -> None:
    cron = Cron.from_obj(cron_obj(PVC_SOURCE))
    rwo = desired_import(cron, pvc_digest(UID), read_write_once=True)
    assert rwo["spec"]["storage"]["accessModes"] == ["ReadWriteOnce"]
    assert "accessModes" not in desired_import(cron, pvc_digest(UID))["spec"]["storage"]
    shared = cron_obj(PVC_SOURCE)
    shared["spec"]["template"]["spec"]["storage"]["accessModes"] = ["ReadWriteMany"]
    kept = desired_import(Cron.from_obj(shared), pvc_digest(UID), read_write_once=True)
    assert kept["spec"]["storage"]["accessModes"] == ["ReadWriteMany"]


def test_a_pvc_source_without_a_name_is_not_usable() -> None:
    assert not Cron.from_obj(cron_obj({"pvc": {"namespace": "golden"}})).usable


def claim(name: str, used: str | None, mode: str = "Filesystem") -> dict[str, Any]:
    annotations = {ANN_LAST_USE_TIME: used} if used else {}
    return {
        "metadata": {"name": name, "namespace": "golden", "annotations": annotations},
        "spec": {"volumeMode": mode, "resources": {"requests": {"storage": "2Gi"}}},
    }


def test_collection_keeps_the_most_recently_used_up_to_imports_to_keep() -> None:
    claims = [
        claim("a", "2026-01-01T00:00:00.000000Z"),
        claim("b", "2026-01-03T00:00:00.000000Z"),  # used again after c: kept before c
        claim("c", "2026-01-02T00:00:00.000000Z"),
        claim("legacy", None),  # no stamp sorts oldest, as in CDI
        claim("cur", "2026-01-04T00:00:00.000000Z"),
    ]
    assert beyond_keep(claims, "cur", 3) == ["a", "legacy"]
    assert beyond_keep(claims, "cur", 2) == ["a", "c", "legacy"]
    assert beyond_keep(claims, "cur", 1) == ["a", "b", "c", "legacy"]
    assert beyond_keep(claims, "cur", 5) == []


def test_the_current_import_stays_even_with_imports_to_keep_zero() -> None:
    # CDI's code deletes it too, and then imports the same digest again
    claims = [claim("cur", "2026-01-01T00:00:00.000000Z"), claim("b", "2026-01-02T00:00:00Z")]
    assert beyond_keep(claims, "cur", 0) == ["b"]


def test_unfinished_imports_other_than_the_current_one_are_collected() -> None:
    def dv(name: str, phase: str) -> dict[str, Any]:
        return {"metadata": {"name": name}, "status": {"phase": phase}}

    imports = [dv("a", "Succeeded"), dv("b", "ImportInProgress"), dv("c", "Failed")]
    assert unfinished([*imports, dv("cur", "ImportInProgress")], "cur") == ["b", "c"]


def test_use_time_stamps_sort_as_strings() -> None:
    import datetime as dt

    early = dt.datetime(2026, 1, 1, 0, 0, 0, 5, tzinfo=dt.UTC)
    late = dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.UTC)
    assert use_time(early) == "2026-01-01T00:00:00.000005Z"
    assert use_time(early) < use_time(late)


def test_the_snapshot_of_an_import_is_named_and_labelled_as_cdi_does() -> None:
    cron = Cron.from_obj(cron_obj(PVC_SOURCE, retentionPolicy="None"))
    labels = {"instancetype.kubevirt.io/default-instancetype": "u1.small"}
    snap = desired_snapshot(cron, claim("golden-abc", None, "Block"), "csi-snap", labels, "T")
    meta = snap["metadata"]
    assert meta["name"] == "golden-abc" and meta["namespace"] == "golden"
    assert meta["labels"] == {
        **labels,
        "app": "containerized-data-importer",
        "cdi.kubevirt.io": "",
        LABEL_CRON: "golden-cron",
        LABEL_CLEANUP: "true",
    }
    assert meta["annotations"] == {
        ANN_LAST_USE_TIME: "T",
        ANN_ADVISED_RESTORE_SIZE: "1Gi",  # the template's size before the claim's
        ANN_SOURCE_VOLUME_MODE: "Block",
    }
    assert meta["ownerReferences"][0]["uid"] == "c" * 36  # retentionPolicy None
    assert snap["spec"] == {
        "source": {"persistentVolumeClaimName": "golden-abc"},
        "volumeSnapshotClassName": "csi-snap",
    }
    plain = desired_snapshot(Cron.from_obj(cron_obj(PVC_SOURCE)), claim("x", None), "", {}, "T")
    assert "volumeSnapshotClassName" not in plain["spec"]
    assert "ownerReferences" not in plain["metadata"]


def test_the_data_source_follows_the_profiles_source_format() -> None:
    cron = Cron.from_obj(cron_obj(PVC_SOURCE))
    snapshot_profile = {"status": {"dataImportCronSourceFormat": "snapshot"}}
    assert source_format(snapshot_profile) == FORMAT_SNAPSHOT
    assert source_format({"status": {}}) == FORMAT_PVC
    assert source_format(None) == FORMAT_PVC
    at_snapshot = desired_data_source(cron, "golden-abc", {}, None, FORMAT_SNAPSHOT)
    assert at_snapshot["spec"] == {
        "source": {"snapshot": {"name": "golden-abc", "namespace": "golden"}}
    }
    at_claim = desired_data_source(cron, "golden-abc", {}, None, FORMAT_PVC)
    assert at_claim["spec"] == {"source": {"pvc": {"name": "golden-abc", "namespace": "golden"}}}


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("ImportScheduled", (False, "ImportScheduled", "Import is scheduled")),
        ("ImportInProgress", (True, "ImportProgressing", "Import is progressing")),
        ("CloneInProgress", (False, "CloneInProgress", "Import DataVolume phase CloneInProgress")),
        ("", (False, "Pending", "Import DataVolume phase Pending")),
    ],
)
def test_progressing_speaks_of_the_import_as_cdi_does(
    phase: str, expected: tuple[bool, str, str]
) -> None:
    assert import_progressing(phase) == expected


def test_up_to_date_is_outdated_until_the_new_digest_is_the_current_import() -> None:
    shown = [{"dataVolumeName": "golden-old", "Digest": "sha256:old"}]
    assert import_up_to_date("sha256:new", shown) == OUTDATED
    assert OUTDATED == (False, "Outdated", "Source digest updated since last import")
    assert import_up_to_date("sha256:new", []) == OUTDATED
    assert import_up_to_date("sha256:old", shown) == IMPORTING


def test_a_conditions_heartbeat_moves_when_it_changes_and_its_transition_when_status_does() -> None:
    first = condition([], "UpToDate", False, "ImportProgressing", "Import is progressing", "t1")
    same = condition([first], "UpToDate", False, "ImportProgressing", "Import is progressing", "t2")
    assert same["lastHeartbeatTime"] == "t1" and same["lastTransitionTime"] == "t1"
    reworded = condition([same], "UpToDate", False, "Outdated", "Source digest updated", "t3")
    assert reworded["lastHeartbeatTime"] == "t3" and reworded["lastTransitionTime"] == "t1"
    flipped = condition([reworded], "UpToDate", True, "UpToDate", "Latest import", "t4")
    assert flipped["lastHeartbeatTime"] == "t4" and flipped["lastTransitionTime"] == "t4"


def admit(source: dict[str, Any], namespace: str = "golden") -> list[str]:
    obj = cron_obj(source)
    del obj["metadata"]["namespace"]  # at admission, the request's namespace is the word
    return [c.message for c in validate_dataimportcron(obj, None, namespace).causes]


def test_a_pvc_source_in_any_namespace_is_admitted() -> None:
    """Issue 27: another namespace is authorized by the controller (cdi.api.onbehalf)."""
    assert admit({"pvc": {"name": "published"}}) == []
    assert admit({"pvc": {"name": "published", "namespace": "golden"}}) == []
    assert admit({"pvc": {"name": "published", "namespace": "elsewhere"}}) == []


@pytest.mark.parametrize(
    ("pvc", "message"),
    [
        (
            {"name": "published", "namespace": "Not_A_Namespace"},
            f'spec.template.spec.source.pvc.namespace: Invalid value: "Not_A_Namespace": '
            f"{DNS1123_SUBDOMAIN_MSG}",
        ),
        ({"name": "published", "namespace": 7}, "pvc namespace must be a string"),
        ({"namespace": "golden", "name": ""}, "Missing source PVC name"),
        (
            {"name": "Not_A_Name"},
            f'spec.template.spec.source.pvc.name: Invalid value: "Not_A_Name": '
            f"{DNS1123_SUBDOMAIN_MSG}",
        ),
    ],
)
def test_a_misnamed_pvc_source_is_refused(pvc: dict[str, Any], message: str) -> None:
    assert admit({"pvc": pvc}) == [message]
