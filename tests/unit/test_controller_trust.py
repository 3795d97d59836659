"""The controller trusts only what it made: tenant-written CDI annotations never become the
PVC's record, a pod is ours only by recorded UID, and a scraped metrics page is bounded."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.controller.progress import MAX_METRICS_BYTES, HttpScraper
from cdi.controller.record import ClaimRecord
from cdi.controller.workerpod import assess
from cdi.render.pvc import render_pvc

INTERNAL = {
    "cdi.kubevirt.io/storage.pod.phase": "Succeeded",
    "cdi.kubevirt.io/storage.import.fatalError": "true",
    "cdi.kubevirt.io/storage.pod.restarts": "7",
    "cdi.kubevirt.io/storage.condition.running.reason": "Completed",
    "cdi.kubevirt.io/storage.import.importPodName": "mine",
    "cdi.kubevirt.io/storage.import.importPodUID": "forged-uid",
    "cdi.kubevirt.io/storage.requester.username": "system:admin",
    "cdi.kubevirt.io/storage.requester.groups": '["system:masters"]',
    "cdi.kubevirt.io/storage.clone.token": "forged",
    "cdi.kubevirt.io/storage.extended.clone.token": "forged",
    "cdi.kubevirt.io/storage.preallocation": "true",
    "cdi.kubevirt.io/storage.import.secretName": "someone-elses",
    "cdi.kubevirt.io/storage.pod.serviceAccountName": "privileged",
    "cdi.kubevirt.io/createdForDataVolume": "other-uid",
    "upload.cdi.kubevirt.io/anything": "x",
}
USER = {
    "cdi.kubevirt.io/storage.bind.immediate.requested": "true",
    "cdi.kubevirt.io/storage.usePopulator": "false",
    "cdi.kubevirt.io/storage.pod.retainAfterCompletion": "true",
    "cdi.kubevirt.io/storage.deleteAfterCompletion": "false",
    "v1.multus-cni.io/default-network": "ns/net",
    "k8s.v1.cni.cncf.io/networks": "net1",
    "sidecar.istio.io/inject": "false",
    "team.example.com/owner": "ops",
    "notcdi.kubevirt.io.example/key": "kept",
}


def _dv(annotations: dict[str, str]) -> DataVolume:
    meta = {"name": "disk", "namespace": "ns", "uid": "dv-uid", "annotations": annotations}
    spec = {
        "source": {"http": {"url": "https://h/disk.img"}},
        "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    return DataVolume.from_dict({"metadata": meta, "spec": spec})


def test_internal_annotations_on_a_datavolume_never_reach_the_pvc() -> None:
    pvc = render_pvc(_dv({**INTERNAL, **USER}), None, CDIConfig())
    ann = pvc["metadata"]["annotations"]
    for key, value in USER.items():
        assert ann[key] == value
    assert "upload.cdi.kubevirt.io/anything" not in ann
    for key in INTERNAL:
        assert ann.get(key) != INTERNAL[key], key
    assert ann["cdi.kubevirt.io/storage.pod.restarts"] == "0"
    assert ann["cdi.kubevirt.io/createdForDataVolume"] == "dv-uid"
    assert "cdi.kubevirt.io/storage.requester.username" not in ann


def test_a_forged_outcome_on_the_datavolume_is_not_read_back_as_the_record() -> None:
    record = ClaimRecord.from_pvc(render_pvc(_dv(INTERNAL), None, CDIConfig()))
    assert record == ClaimRecord()
    assert not record.done


def _pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "importer-disk", "uid": uid}}


def test_a_pod_is_ours_only_by_the_recorded_uid() -> None:
    pod = _pod("u-1")
    assert assess(pod, "u-1").pod == pod
    impostor = assess(pod, "u-2")
    assert (impostor.pod, impostor.impostor) == (None, pod)
    unrecorded = assess(pod, None)
    assert (unrecorded.pod, unrecorded.impostor) == (None, pod)
    assert assess(None, "u-1").pod is None


# --- the scraper against real loopback servers --------------------------------------------------

Handler = Callable[[web.Request], Any]


def text(body: str) -> Handler:
    async def handler(_: web.Request) -> web.Response:
        return web.Response(text=body)

    return handler


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Any]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> int:
        app = web.Application()
        app.router.add_get("/metrics", handler)
        app.router.add_get("/elsewhere", text("followed"))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    yield start
    for runner in runners:
        await runner.cleanup()


async def test_scraper_reads_a_normal_page(serve: Any) -> None:
    port = await serve(text("ok 1\n"))
    scraper = HttpScraper()
    try:
        assert await scraper("127.0.0.1", port) == "ok 1\n"
    finally:
        await scraper.close()


async def test_scraper_ignores_an_oversized_page_declared_or_streamed(serve: Any) -> None:
    big = "x" * (MAX_METRICS_BYTES + 1)

    async def streamed(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(64):  # 4 MiB in chunks, no Content-Length
            await resp.write(b"y" * 65536)
        return resp

    declared = await serve(text(big))
    chunked = await serve(streamed)
    scraper = HttpScraper()
    try:
        assert await scraper("127.0.0.1", declared) is None
        assert await scraper("127.0.0.1", chunked) is None
    finally:
        await scraper.close()


async def test_scraper_gives_up_on_a_slow_pod_and_follows_no_redirect(serve: Any) -> None:
    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(30)
        return web.Response(text="late")

    slow_port = await serve(slow)

    async def redirect(_: web.Request) -> web.Response:
        raise web.HTTPFound("/elsewhere")

    moved = await serve(redirect)
    scraper = HttpScraper(timeout=0.5)
    try:
        start = time.monotonic()
        assert await scraper("127.0.0.1", slow_port) is None
        assert time.monotonic() - start < 3
        assert await scraper("127.0.0.1", moved) is None
    finally:
        await scraper.close()
