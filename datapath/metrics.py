"""Prometheus endpoint of a worker: CDI-compatible progress, plus bytes, rate and phase.

``kubevirt_cdi_import_progress_total{ownerUID}`` is what CDI's controller scrapes (a percentage,
exposed as a counter). The richer series let our controller show bytes and rate. Values are read
from ``Progress`` at scrape time by a custom collector, so the hot path pays nothing per chunk.
A private registry keeps process-global state out of the library's default one. The page is
served by ``datapath.metrics_server`` (bounded connections and timeouts), not by
prometheus_client's unbounded ``start_http_server``. ``cdi_import_checkpoint_bytes{digest}`` is
the last durable resume checkpoint, which the controller keeps (outside the tenant's volume)
to attest the next attempt's resume (``datapath.checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from datapath.metrics_server import BoundedMetricsServer, ServerLimits, start_metrics_server
from datapath.taps import Progress

PHASES = ("Pending", "Transferring", "Validating", "Converting", "Resizing", "Complete", "Failed")


class ProgressCollector(Collector):
    def __init__(self, progress: Progress, owner_uid: str, kind: str = "import") -> None:
        self.progress = progress
        self.owner_uid = owner_uid
        self.kind = kind

    def collect(self) -> Iterator[Metric]:
        p, uid, kind = self.progress, [self.owner_uid], self.kind
        percent = CounterMetricFamily(
            f"kubevirt_cdi_{kind}_progress",
            f"The {kind} progress in percentage",
            labels=["ownerUID"],
        )
        percent.add_metric(uid, p.percent or 0.0)
        yield percent
        for name, doc, value in (
            ("bytes_done", "Source bytes transferred so far", p.done),
            ("bytes_total", "Source bytes in total (0 if unknown)", p.total or 0),
            ("rate_bytes_per_second", "Mean transfer rate since start", p.rate),
        ):
            gauge = GaugeMetricFamily(f"cdi_{kind}_{name}", doc, labels=["ownerUID"])
            gauge.add_metric(uid, value)
            yield gauge
        phase = GaugeMetricFamily(
            f"cdi_{kind}_phase", "1 for the worker's current phase", labels=["ownerUID", "phase"]
        )
        for name in PHASES:
            phase.add_metric([self.owner_uid, name], 1.0 if p.phase == name else 0.0)
        yield phase
        if p.checkpoint is not None:  # what the controller attests for the next attempt
            offset, digest = p.checkpoint
            mark = GaugeMetricFamily(
                f"cdi_{kind}_checkpoint_bytes",
                "Bytes durably written at the last resume checkpoint; digest: their BLAKE3",
                labels=["ownerUID", "digest"],
            )
            mark.add_metric([self.owner_uid, digest], offset)
            yield mark


def serve_metrics(
    progress: Progress, owner_uid: str, port: int, addr: str, limits: ServerLimits | None = None
) -> BoundedMetricsServer:
    """Serve the worker's progress on ``addr:port`` from a daemon thread."""
    registry = CollectorRegistry()
    registry.register(ProgressCollector(progress, owner_uid))
    return start_metrics_server(registry, addr, port, limits)
