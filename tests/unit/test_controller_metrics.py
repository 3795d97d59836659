"""Controller metrics: computed from the caches when scraped, timed around reconciles, served
over real loopback HTTP."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cdi.controller.metrics import ControllerMetrics, Sources, serve_metrics
from cdi.controller.metrics_auth import Verdict, bearer_token
from cdi.kube.workqueue import Result


class DictStore:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = {o["metadata"]["name"]: o for o in objs}

    def get(self, key: str) -> dict[str, Any] | None:
        return self.objs.get(key)

    def items(self) -> list[dict[str, Any]]:
        return list(self.objs.values())


def dv(name: str, phase: str | None, progress: str | None = None, **spec: Any) -> dict[str, Any]:
    status = {"phase": phase, "progress": progress} if phase else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": spec,
        "status": status,
    }


def profile(name: str, sets: list[dict[str, Any]], strategy: str = "copy") -> dict[str, Any]:
    status = {
        "storageClass": name,
        "provisioner": "p.io",
        "claimPropertySets": sets,
        "cloneStrategy": strategy,
    }
    return {"metadata": {"name": name}, "spec": {}, "status": status}


def sc(name: str, default: bool = False) -> dict[str, Any]:
    ann = {"storageclass.kubernetes.io/is-default-class": "true"} if default else {}
    return {"metadata": {"name": name, "annotations": ann}, "provisioner": "p.io"}


def samples(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = metrics.exposition().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def metrics_for(dvs: DictStore, classes: DictStore, profiles: DictStore) -> ControllerMetrics:
    return ControllerMetrics(Sources(dvs, classes, profiles))


RWX_BLOCK = {"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}


def test_storage_profile_info_labels_follow_cdi() -> None:
    m = metrics_for(
        DictStore(),
        DictStore(sc("fast", default=True), sc("local")),
        DictStore(
            profile("fast", [RWX_BLOCK], "csi-clone"),
            profile("local", [{"volumeMode": "Filesystem"}]),
        ),
    )
    got = samples(m)
    fast = dict(
        storageclass="fast",
        provisioner="p.io",
        complete="true",
        default="true",
        virtdefault="false",
        rwx="true",
        smartclone="true",
        degraded="false",
    )
    local = dict(
        storageclass="local",
        provisioner="p.io",
        complete="false",
        default="false",
        virtdefault="false",
        rwx="false",
        smartclone="false",
        degraded="true",
    )
    assert got[("kubevirt_cdi_storageprofile_info", tuple(sorted(fast.items())))] == 1.0
    assert got[("kubevirt_cdi_storageprofile_info", tuple(sorted(local.items())))] == 1.0
    profiles_seen = [k for k in got if k[0] == "kubevirt_cdi_storageprofile_info"]
    assert len(profiles_seen) == 2


def test_datavolumes_by_phase_pending_and_progress() -> None:
    dvs = DictStore(
        dv("a", "ImportInProgress", "42.50%"),
        dv("b", "Succeeded", "100.0%"),
        dv("c", "Pending", storage={"resources": {}}),
        dv("d", None),
        dv("e", "CloneInProgress", "10.00%"),
        dv("f", "Pending", storage={"storageClassName": "x"}),
    )
    got = samples(metrics_for(dvs, DictStore(sc("local")), DictStore()))
    assert got[("cdi_datavolumes", (("phase", "ImportInProgress"),))] == 1
    assert got[("cdi_datavolumes", (("phase", "Pending"),))] == 2
    assert got[("cdi_datavolumes", (("phase", ""),))] == 1
    # c and d name no class and there is no default class; f names one
    assert got[("kubevirt_cdi_datavolume_pending", ())] == 2
    assert got[("kubevirt_cdi_import_progress_total", (("ownerUID", "uid-a"),))] == 42.5
    assert got[("kubevirt_cdi_clone_progress_total", (("ownerUID", "uid-e"),))] == 10.0
    assert not any(
        k[0] == "kubevirt_cdi_import_progress_total" and ("ownerUID", "uid-b") in k[1] for k in got
    )
    with_default = metrics_for(dvs, DictStore(sc("local", default=True)), DictStore())
    assert samples(with_default)[("kubevirt_cdi_datavolume_pending", ())] == 0


async def test_reconciles_are_timed_and_counted_by_result() -> None:
    ticks = iter([0.0, 0.25, 1.0, 1.5, 2.0, 2.125])
    m = ControllerMetrics(Sources(DictStore(), DictStore(), DictStore()), clock=lambda: next(ticks))
    outcomes: list[Any] = [Result(), Result(requeue_after=1.0), RuntimeError("boom")]

    async def reconcile(_key: str) -> Result:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    timed = m.timed("storageprofile", reconcile)
    await timed("a")
    await timed("a")
    try:
        await timed("a")
    except RuntimeError:
        pass
    got = samples(m)
    for result in ("success", "requeue_after", "error"):
        key = (("controller", "storageprofile"), ("result", result))
        assert got[("controller_runtime_reconcile_total", key)] == 1
    time_key = (("controller", "storageprofile"),)
    assert got[("controller_runtime_reconcile_time_seconds_count", time_key)] == 3
    assert got[("controller_runtime_reconcile_time_seconds_sum", time_key)] == 0.875


class OneToken:
    """Admits ``Bearer good``, refuses ``Bearer known`` (403), nothing else (401): the guard's
    verdicts as the API server's reviews give them (tests/integration/datavolumes/
    test_metrics_auth.py asks the real one)."""

    async def check(self, authorization: str | None) -> Verdict:
        if authorization == "Bearer good":
            return Verdict(200, "")
        if authorization == "Bearer known":
            return Verdict(403, "Forbidden: known may not get /metrics")
        return Verdict(401, "Unauthorized")


async def test_metrics_are_served_over_http_to_whom_the_guard_admits() -> None:
    m = metrics_for(DictStore(dv("a", "Succeeded", "100.0%")), DictStore(), DictStore())
    runner = await serve_metrics(m, OneToken(), "127.0.0.1", 0)
    try:
        host, port = runner.addresses[0][:2]
        url = f"http://{host}:{port}/metrics"
        async with aiohttp.ClientSession() as session:
            async with session.get(url, headers={"Authorization": "Bearer good"}) as resp:
                assert resp.status == 200
                assert resp.headers["Content-Type"].startswith("text/plain")
                body = await resp.text()
            async with session.get(url) as resp:
                assert resp.status == 401
                assert resp.headers["WWW-Authenticate"] == "Bearer"
                assert "cdi_datavolumes" not in await resp.text()
            async with session.get(url, headers={"Authorization": "Bearer known"}) as resp:
                assert resp.status == 403
                assert "cdi_datavolumes" not in await resp.text()
        assert 'cdi_datavolumes{phase="Succeeded"} 1.0' in body
    finally:
        await asyncio.wait_for(runner.cleanup(), 5)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc.def", "abc.def"),
        ("bearer abc", "abc"),
        ("Bearer   abc  ", "abc"),
        ("Bearer", None),
        ("Bearer ", None),
        ("Basic dXNlcjpwYXNz", None),
        ("Bearer a b", None),
        (None, None),
        ("", None),
    ],
)
def test_only_a_bearer_token_is_taken_from_the_header(
    header: str | None, token: str | None
) -> None:
    assert bearer_token(header) == token


def test_the_outdated_cron_metric_uses_cdis_labels() -> None:
    from cdi.controller.metrics import cron_view

    def cron(name: str, up_to_date: str, cls: str | None) -> dict[str, Any]:
        storage = {"storageClassName": cls} if cls else {}
        return cron_view({
            "metadata": {"name": name, "namespace": "golden"},
            "spec": {"template": {"spec": {"storage": storage}}},
            "status": {"conditions": [{"type": "UpToDate", "status": up_to_date}]},
        })  # fmt: skip

    crons = DictStore(cron("fresh", "True", None), cron("stale", "False", "local"),
                      cron("waiting", "False", None))  # fmt: skip
    m = ControllerMetrics(Sources(DictStore(), DictStore(sc("local")), DictStore(), crons))
    got = samples(m)

    def value(name: str, pending: str) -> float:
        labels = (("cron_name", name), ("namespace", "golden"), ("pending", pending))
        return got[("kubevirt_cdi_dataimportcron_outdated", labels)]

    assert value("fresh", "false") == 0.0
    assert value("stale", "false") == 1.0  # names its class: outdated, not pending
    assert value("waiting", "true") == 1.0  # no class named, no default class: pending
