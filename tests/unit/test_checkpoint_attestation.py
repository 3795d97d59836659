"""The resume attestation's path outside the tenant's volume: the importer publishes its last
durable checkpoint on the metrics page, the controller parses it from the recorded pod's page
and renders it into the next attempt's environment, and the importer reads it back. A malformed
or missing value is no attestation (the pod then restarts from byte 0)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from cdi.controller.progress import parse_metrics
from cdi.render.importer_pod import ImporterPodConfig
from datapath.metrics import ProgressCollector
from datapath.taps import Progress
from importer.config import attested_checkpoint, from_env
from tests.unit.test_render import env_of, pod_for, storage

DIGEST = "ab" * 32


def _page(progress: Progress) -> str:
    registry = CollectorRegistry()
    registry.register(ProgressCollector(progress, "dv-uid"))
    return generate_latest(registry).decode()


def test_the_published_checkpoint_is_what_the_controller_parses() -> None:
    page = _page(Progress(total=100, done=40, checkpoint=(32 << 20, DIGEST)))
    scraped = parse_metrics(page, "dv-uid")
    assert scraped is not None and scraped.checkpoint == (32 << 20, DIGEST)


def test_no_checkpoint_yet_or_a_bad_digest_attests_nothing() -> None:
    scraped = parse_metrics(_page(Progress(total=100, done=40)), "dv-uid")
    assert scraped is not None and scraped.checkpoint is None
    bad = _page(Progress(total=100, done=40, checkpoint=(5, "not-a-digest")))
    assert parse_metrics(bad, "dv-uid").checkpoint is None  # type: ignore[union-attr]


def test_the_next_attempt_gets_the_attestation_and_reads_it_back() -> None:
    config = ImporterPodConfig(image="importer:dev", checkpoint_attested=(4096, DIGEST))
    env = env_of(pod_for(storage(), config=config))
    assert env["IMPORTER_CHECKPOINT_ATTESTED"] == f"4096:{DIGEST}"
    plan = from_env({**env, "IMPORTER_DATA_DIR": "/data"}).plan.checkpoint
    assert plan is not None and plan.attested == (4096, DIGEST) and plan.require_attested
    assert "IMPORTER_CHECKPOINT_ATTESTED" not in env_of(pod_for(storage()))


def test_malformed_attestations_are_none() -> None:
    for text in (None, "", "12", f"-1:{DIGEST}", "12:abc", f"12:{DIGEST.upper()}", f"x:{DIGEST}"):
        assert attested_checkpoint(text) is None
    assert attested_checkpoint(f"12:{DIGEST}") == (12, DIGEST)
