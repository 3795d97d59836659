"""A host-assisted clone's progress: the page the clone source serves (``datapath.metrics`` with
kind ``clone``, CDI's ``kubevirt_cdi_clone_progress_total``), read by the controller's parser,
shown on the DataVolume while CloneInProgress; and the source pod rendered to serve it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from cdi.api.types import DataVolume
from cdi.controller.flavours.clone.flavour import CLONE_PHASES
from cdi.controller.progress import parse_metrics
from cdi.controller.status import View, compute_status
from cdi.render.clone_pod import CloneSourcePod, render_clone_source_pod
from cdi.render.worker_pod import Metrics, WorkerPod
from datapath.metrics import ProgressCollector
from datapath.taps import Progress

GiB = 1 << 30


def page(progress: Progress, owner: str) -> str:
    registry = CollectorRegistry()
    registry.register(ProgressCollector(progress, owner, kind="clone"))
    return generate_latest(registry).decode()


def test_the_clone_sources_page_reads_as_the_share_of_the_volume_covered() -> None:
    text = page(Progress(total=2 * GiB, done=GiB // 2, phase="Transferring"), "t-uid")
    assert "kubevirt_cdi_clone_progress_total" in text
    seen = parse_metrics(text, "t-uid", kind="clone")
    assert seen is not None
    assert (seen.text, seen.bytes_done, seen.bytes_total) == ("25.00%", GiB // 2, 2 * GiB)
    assert parse_metrics(text, "t-uid") is None  # not an import's page
    assert parse_metrics(text, "someone-else", kind="clone") is None
    done = parse_metrics(page(Progress(total=10, done=12), "t-uid"), "t-uid", kind="clone")
    assert done is not None and done.text == "100.00%"  # never past 100


def test_the_datavolume_shows_it_while_clone_in_progress() -> None:
    progress = parse_metrics(page(Progress(total=400, done=181), "u"), "u", kind="clone")
    view = View(
        claim_name="mine",
        phases=CLONE_PHASES,
        pvc_phase="Bound",
        pod_phase="Running",
        progress=progress,
    )
    status = compute_status(view, None, "2026-12-02T04:00:00Z")
    assert (status["phase"], status["progress"]) == ("CloneInProgress", "45.25%")
    running = next(c for c in status["conditions"] if c["type"] == "Running")
    assert running["message"].startswith("Clone in progress: 181 B of 400 B"), running


def test_the_source_pod_serves_its_progress_on_its_own_address() -> None:
    dv = DataVolume.from_dict({"metadata": {"name": "mine", "namespace": "t", "uid": "d1"}})
    source = {"metadata": {"name": "golden", "namespace": "g"}, "spec": {}}
    target = {"metadata": {"name": "mine", "namespace": "t", "uid": "t1"}, "spec": {}}
    settings = WorkerPod(image="cloner", metrics=Metrics(on_pod_ip=True))
    pod = render_clone_source_pod(dv, source, target, CloneSourcePod(settings, "s"))
    container = pod["spec"]["containers"][0]
    env = {e["name"]: e.get("value") or e.get("valueFrom") for e in container["env"]}
    assert env["CLONER_METRICS_PORT"] == "8443" and env["OWNER_UID"] == "t1"
    assert env["CLONER_METRICS_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert container["ports"] == [{"name": "metrics", "containerPort": 8443, "protocol": "TCP"}]
