"""The CDI resource's pure rules: Go durations and certificate lifetimes, which resource is in
force, its status, what it adds to CDIConfig's status, the uninstall refusal, and a
StorageProfile's strategy overridden."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from cdi.api.cdiresource import (
    CDI,
    DEFAULT_SERVER,
    DEFAULT_UPLOAD_SERVER,
    UNINSTALL_REFUSED,
    DurationError,
    Lifetime,
    active,
    lifetimes,
    parse_duration,
)
from cdi.api.config import CDICertConfig, CDIConfig, CertConfig
from cdi.pki.certs import issue_client, new_ca
from cdi.pki.upload import _due, issue_server_credentials, server_lifetime
from cdi.pki.uploadca import CAState
from cdi.render import cdiresource as status
from cdi.render.cdiconfig import from_cdi_resource
from cdi.webhooks.cdiresource import uninstall_refusal

H = dt.timedelta(hours=1)
NOW = dt.datetime(2026, 12, 5, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("48h", 48 * 3600), ("1h30m", 5400), ("2h0m0s", 7200), ("90s", 90), ("1.5h", 5400),
     ("500ms", 0.5), ("0", 0)],
)  # fmt: skip
def test_go_durations(text: str, seconds: float) -> None:
    assert parse_duration(text).total_seconds() == seconds


@pytest.mark.parametrize("text", ["", "48", "h", "-1h", "1d", "1h 30m"])
def test_what_is_not_a_go_duration(text: str) -> None:
    with pytest.raises(DurationError):
        parse_duration(text)


def test_cert_config_sets_lifetimes_and_ignores_what_cannot_work() -> None:
    given = CDICertConfig(
        server=CertConfig("24h", "12h"),
        client=CertConfig("1h", "2h"),  # renewBefore longer than the certificate: ignored
        ca=CertConfig("a week"),
    )
    got = lifetimes(given)
    assert got.server == Lifetime(24 * H, 12 * H)
    assert got.upload_server == got.server  # certConfig.server is the upload servers' too
    assert got.client.duration == dt.timedelta(days=30)
    assert any("certConfig.client" in p for p in got.problems)
    assert any("certConfig.ca" in p for p in got.problems)
    assert lifetimes(None).upload_server == DEFAULT_UPLOAD_SERVER
    # only a duration: renewed at the default's share of it
    assert lifetimes(CDICertConfig(server=CertConfig("10h"))).server.renew_before == (
        10 * H * (DEFAULT_SERVER.renew_before / DEFAULT_SERVER.duration)
    )


def test_an_upload_server_certificate_follows_cert_config_server() -> None:
    server = {"duration": "2h", "renewBefore": "30m"}
    config = CDIConfig.from_dict({"status": {"certConfig": {"server": server}}})
    life = server_lifetime(config, 24 * H)
    assert (life.duration, life.renew_before) == (2 * H, dt.timedelta(minutes=30))
    server_ca, client_ca = CAState(new_ca("s", NOW - H)), CAState(new_ca("c", NOW - H))
    creds = issue_server_credentials(server_ca, client_ca, "cdi-upload-d", "ns", NOW, life)
    assert creds.deadline == NOW + 90 * dt.timedelta(minutes=1)
    flag = server_lifetime(CDIConfig(), 10 * H)  # no certConfig: the flag, deadline at 80 %
    creds = issue_server_credentials(server_ca, client_ca, "cdi-upload-d", "ns", NOW, flag)
    assert creds.deadline == NOW + 8 * H


def test_a_client_certificate_longer_than_cert_config_client_is_reissued() -> None:
    ca = new_ca("client-ca", NOW)
    month = issue_client(ca, "proxy", NOW, dt.timedelta(days=30))
    assert not _due(month.cert_pem, ca, NOW + H)  # no certConfig: 80 % rule
    assert _due(month.cert_pem, ca, NOW + H, Lifetime(2 * H, H))  # shortened: re-issued
    short = issue_client(ca, "proxy", NOW, 2 * H)
    assert not _due(short.cert_pem, ca, NOW + dt.timedelta(minutes=30), Lifetime(2 * H, H))
    assert _due(short.cert_pem, ca, NOW + dt.timedelta(minutes=61), Lifetime(2 * H, H))


def cdi(name: str, created: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def test_the_oldest_cdi_resource_is_in_force() -> None:
    first, second = cdi("b", "2026-01-01T00:00:00Z"), cdi("a", "2026-02-01T00:00:00Z")
    assert active([second, first]) == first
    gone = {**first, "metadata": {**first["metadata"], "deletionTimestamp": "x"}}
    assert active([gone, second]) == second
    assert active([]) is None


def deployment(name: str, available: bool) -> dict[str, Any]:
    cond = {"type": "Available", "status": "True" if available else "False"}
    return {"metadata": {"name": name}, "status": {"conditions": [cond]}}


def conditions(got: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in got["conditions"]}


def test_status_follows_the_deployments() -> None:
    up = [deployment("cdi-controller", True), deployment("cdi-webhook", True)]
    got = status.desired_status("cdi", "cdi", up, [], {}, "t0", "v1")
    assert got["phase"] == "Deployed"
    assert conditions(got) == {
        "Available": ("True", "DeployCompleted"),
        "Progressing": ("False", "DeployCompleted"),
        "Degraded": ("False", "AsExpected"),
    }
    down = [deployment("cdi-controller", True), deployment("cdi-webhook", False)]
    later = status.desired_status("cdi", "cdi", down, [], got, "t1", "v1")
    assert later["phase"] == "Deploying"
    assert conditions(later)["Available"] == ("False", "DeploymentsNotAvailable")
    assert "cdi-webhook" in later["conditions"][0]["message"]
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times == {"Available": "t1", "Progressing": "t1", "Degraded": "t0"}  # moved only


def test_a_second_resource_is_in_error_and_ignored_settings_degrade() -> None:
    got = status.desired_status("cdi", "other", [], [], {}, "t0", "v1")
    assert got["phase"] == "Error" and conditions(got)["Degraded"][0] == "True"
    problems = status.spec_problems(
        CDI.from_dict(cdi("cdi", "t", certConfig={"server": {"duration": "soon"}}))
    )
    got = status.desired_status("cdi", "cdi", [], problems, {}, "t0", "v1")
    assert got["phase"] == "Deployed"
    assert conditions(got)["Degraded"] == ("True", "SettingsIgnored")


def test_what_the_resource_adds_to_cdiconfigs_status() -> None:
    resource = cdi(
        "cdi", "t",
        workload={"nodeSelector": {"a": "b"}, "tolerations": [{"operator": "Exists"}]},
        cloneStrategyOverride="copy",
        certConfig={"server": {"duration": "24h"}},
        infra={"nodeSelector": {"infra": "yes"}},
    )  # fmt: skip
    added = from_cdi_resource(resource)
    assert added == {
        "workload": {"nodeSelector": {"a": "b"}, "tolerations": [{"operator": "Exists"}]},
        "cloneStrategyOverride": "copy",
        "certConfig": {"server": {"duration": "24h"}},
    }
    config = CDIConfig.from_dict({"status": added})
    assert config.workload.node_selector == {"a": "b"}
    assert config.clone_strategy_override == "copy"
    assert from_cdi_resource(None) == {}


def review(op: str, phase: str | None, strategy: str | None) -> dict[str, Any]:
    old: dict[str, Any] = {"spec": {"uninstallStrategy": strategy} if strategy else {}}
    if phase:
        old["status"] = {"phase": phase}
    return {"operation": op, "oldObject": old}


def test_uninstall_is_refused_only_while_datavolumes_exist_and_the_resource_says_so() -> None:
    block = "BlockUninstallIfWorkloadsExist"
    assert uninstall_refusal(review("DELETE", "Deployed", block), lambda: True) == (
        UNINSTALL_REFUSED
    )
    assert uninstall_refusal(review("DELETE", "Deployed", block), lambda: False) is None
    assert uninstall_refusal(review("DELETE", "Deployed", "RemoveWorkloads"), lambda: True) is None
    assert uninstall_refusal(review("DELETE", None, block), lambda: True) is None  # never deployed
    assert uninstall_refusal(review("DELETE", "Error", block), lambda: True) is None
    assert uninstall_refusal(review("UPDATE", "Deployed", block), lambda: True) is None
