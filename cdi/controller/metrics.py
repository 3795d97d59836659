"""The controller's Prometheus metrics, served at ``/metrics`` on the metrics port.

Two kinds, kept apart so nothing in a reconciler holds metric state:

- **Derived from the caches at scrape time** (``ClusterCollector``): a custom collector reads the
  informer stores when Prometheus scrapes, so the numbers are level-based like the reconcilers
  and never drift from the cluster (a deleted StorageProfile's series simply stops appearing,
  where CDI has to delete labelled gauges by hand). Names are CDI's where CDI has them:

  ``kubevirt_cdi_storageprofile_info``     1 per profile; labels storageclass, provisioner,
                                            complete, default, virtdefault, rwx, smartclone,
                                            degraded (CDI's meaning: no RWX or no smart clone)
  ``kubevirt_cdi_datavolume_pending``       DataVolumes Pending with no storage class to use
  ``kubevirt_cdi_import_progress_total``    percent, per DataVolume (``ownerUID``) importing
  ``kubevirt_cdi_clone_progress_total``     same, while cloning
  ``kubevirt_cdi_upload_progress_total``    same, while uploading (not a CDI name)
  ``kubevirt_cdi_dataimportcron_outdated``  1 per DataImportCron whose ``UpToDate`` is False,
                                            else 0; labels namespace (CDI's since 1.64, was
                                            ns), cron_name, pending ("true": it cannot
                                            import for want of a storage class)
  ``kubevirt_cdi_{import,upload,clone}_pods_high_restart``  DataVolumes of that kind whose
                                            worker restarted more than 3 times (CDI derives
                                            these from kube-state-metrics in recording rules;
                                            the controller knows the counts, so no
                                            kube-state-metrics is needed)
  ``kubevirt_cdi_cr_ready``                 1 while this replica leads with synced caches,
                                            else 0 (a standby; CDI's is the operator's view
                                            of its CR: alert on the max over replicas)
  ``cdi_datavolumes``                       DataVolumes per ``phase`` (not a CDI name)

The alerts on these are CDI's, in ``deploy/monitoring/prometheus-rules.yaml`` (a
PrometheusRule for the Prometheus Operator), checked by ``promtool test rules`` against what
this collector exposes (``tests/component/test_alert_rules.py``).

- **Observed around each reconcile** (``timed``), under controller-runtime's names, which CDI's
  controller also exports: ``controller_runtime_reconcile_time_seconds{controller}`` (histogram)
  and ``controller_runtime_reconcile_total{controller,result}`` (success, requeue_after, error).

Only a scrape with a bearer token the API server accepts and allows ``get /metrics`` is
answered (``cdi.controller.metrics_auth``, CDI's #4121).

Every metric lives in this object's own ``CollectorRegistry`` (no process-global registry), so
tests build one and read it without a server.
"""

from __future__ import annotations

import ssl
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from cdi.api.codec import SchemaError
from cdi.api.config import StorageProfile
from cdi.api.constants import AccessMode
from cdi.controller.metrics_auth import Verdict
from cdi.kube.workqueue import Reconcile, Result
from cdi.render.storageprofile import profile_complete

ANN_DEFAULT_CLASS = "storageclass.kubernetes.io/is-default-class"
ANN_DEFAULT_VIRT_CLASS = "storageclass.kubevirt.io/is-default-virt-class"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PROGRESS_BY_PHASE_PREFIX = (
    ("Import", "import"),
    ("Clone", "clone"),
    ("CSIClone", "clone"),
    ("Upload", "upload"),
)


class Store(Protocol):
    def get(self, key: str) -> dict[str, Any] | None: ...

    def items(self) -> list[dict[str, Any]]: ...


class _Empty:
    def get(self, key: str) -> dict[str, Any] | None:
        return None

    def items(self) -> list[dict[str, Any]]:
        return []


@dataclass(frozen=True)
class Sources:
    datavolumes: Store
    storage_classes: Store
    storage_profiles: Store
    dataimportcrons: Store = field(default_factory=_Empty)  # as ``cron_view`` keeps them
    ready: Callable[[], bool] = lambda: False  # leading, caches synced


HIGH_RESTARTS = 3  # CDI's UnusualRestartCountThreshold: more than this is unusual
CLONE_SOURCES = ("pvc", "snapshot")
UPLOAD_SOURCES = ("upload",)


def cron_view(obj: dict[str, Any]) -> dict[str, Any]:
    """What the cron cache keeps: identity, conditions, the template's storage class."""
    meta = obj.get("metadata") or {}
    template = (((obj.get("spec") or {}).get("template") or {}).get("spec")) or {}
    claim = template.get("storage") or template.get("pvc") or {}
    conditions = [
        {k: c.get(k) for k in ("type", "status", "reason")}
        for c in (obj.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    ]
    return {
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion") if k in meta
        },
        "spec": {"storageClassName": claim.get("storageClassName")},
        "status": {"conditions": conditions},
    }


def work_kind(dv: Mapping[str, Any]) -> str:
    """import, upload or clone: what the DataVolume's worker does."""
    spec = dv.get("spec") or {}
    source = spec.get("source") or {}
    if any(k in source for k in UPLOAD_SOURCES):
        return "upload"
    if spec.get("sourceRef") or any(k in source for k in CLONE_SOURCES):
        return "clone"
    return "import"


def _flag(value: bool) -> str:
    return str(value).lower()


def _annotated(obj: Mapping[str, Any] | None, key: str) -> bool:
    return ((obj or {}).get("metadata") or {}).get("annotations", {}).get(key) == "true"


def profile_labels(profile: StorageProfile, sc: Mapping[str, Any] | None) -> dict[str, str]:
    status = profile.status
    sets = status.claim_property_sets if status else ()
    rwx = any(AccessMode.READ_WRITE_MANY in s.access_modes for s in sets)
    smart = bool(status and status.clone_strategy in ("snapshot", "csi-clone"))
    return {
        "storageclass": profile.storage_class,
        "provisioner": (status.provisioner if status else None) or "",
        "complete": _flag(profile_complete(profile)),
        "default": _flag(_annotated(sc, ANN_DEFAULT_CLASS)),
        "virtdefault": _flag(_annotated(sc, ANN_DEFAULT_VIRT_CLASS)),
        "rwx": _flag(rwx),
        "smartclone": _flag(smart),
        "degraded": _flag(not rwx or not smart),
    }


def _restarts(dv: Mapping[str, Any]) -> int:
    try:
        return int((dv.get("status") or {}).get("restartCount") or 0)
    except (TypeError, ValueError):
        return 0


def progress_value(text: str | None) -> float | None:
    if not text or not text.endswith("%"):
        return None
    try:
        return float(text[:-1])
    except ValueError:
        return None


class ClusterCollector(Collector):
    """Metrics computed from the informer caches when scraped."""

    def __init__(self, sources: Sources) -> None:
        self.sources = sources

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "kubevirt_cdi_cr_ready",
            "CDI install ready (this controller replica leads with synced caches)",
            value=1.0 if self.sources.ready() else 0.0,
        )
        yield self._profiles()
        yield from self._datavolumes()
        yield self._crons()

    def _default_class(self) -> bool:
        classes = self.sources.storage_classes.items()
        return any(
            _annotated(sc, ANN_DEFAULT_CLASS) or _annotated(sc, ANN_DEFAULT_VIRT_CLASS)
            for sc in classes
        )

    def _crons(self) -> Metric:
        outdated = GaugeMetricFamily(
            "kubevirt_cdi_dataimportcron_outdated",
            "DataImportCron has an outdated import",
            labels=["namespace", "cron_name", "pending"],
        )
        default_class = self._default_class()
        for cron in self.sources.dataimportcrons.items():
            meta = cron.get("metadata") or {}
            conditions = (cron.get("status") or {}).get("conditions") or []
            stale = any(c.get("type") == "UpToDate" and c.get("status") == "False"
                        for c in conditions)  # fmt: skip
            named = (cron.get("spec") or {}).get("storageClassName")
            pending = stale and not named and not default_class
            labels = [str(meta.get("namespace", "")), str(meta.get("name", "")), _flag(pending)]
            outdated.add_metric(labels, 1.0 if stale else 0.0)
        return outdated

    def _profiles(self) -> Metric:
        labels = list(profile_labels(StorageProfile(), None))
        info = GaugeMetricFamily(
            "kubevirt_cdi_storageprofile_info", "StorageProfiles info labels", labels=labels
        )
        for raw in self.sources.storage_profiles.items():
            try:
                profile = StorageProfile.from_dict(raw)
            except SchemaError:
                continue
            sc = self.sources.storage_classes.get(profile.storage_class)
            info.add_metric(list(profile_labels(profile, sc).values()), 1.0)
        return info

    def _datavolumes(self) -> Iterator[Metric]:
        dvs = self.sources.datavolumes.items()
        phases = Tally(str((dv.get("status") or {}).get("phase") or "") for dv in dvs)
        by_phase = GaugeMetricFamily("cdi_datavolumes", "DataVolumes by phase", labels=["phase"])
        for phase, count in sorted(phases.items()):
            by_phase.add_metric([phase], float(count))
        yield by_phase
        yield GaugeMetricFamily(
            "kubevirt_cdi_datavolume_pending",
            "Number of DataVolumes pending for default storage class to be configured",
            value=float(sum(1 for dv in dvs if self._pending_for_class(dv))),
        )
        yield from self._progress(dvs)
        restarted = Tally(work_kind(dv) for dv in dvs if _restarts(dv) > HIGH_RESTARTS)
        for kind in ("import", "upload", "clone"):
            yield GaugeMetricFamily(
                f"kubevirt_cdi_{kind}_pods_high_restart",
                f"DataVolumes whose {kind} pod restarted more than {HIGH_RESTARTS} times",
                value=float(restarted[kind]),
            )

    def _pending_for_class(self, dv: Mapping[str, Any]) -> bool:
        if (dv.get("status") or {}).get("phase") not in (None, "", "Pending"):
            return False
        spec = dv.get("spec") or {}
        claim = spec.get("storage") or spec.get("pvc") or {}
        if claim.get("storageClassName"):
            return False
        classes = self.sources.storage_classes.items()
        return not any(_annotated(sc, ANN_DEFAULT_CLASS) for sc in classes)

    def _progress(self, dvs: list[dict[str, Any]]) -> Iterator[Metric]:
        families = {
            kind: CounterMetricFamily(
                f"kubevirt_cdi_{kind}_progress",
                f"The {kind} progress in percentage",
                labels=["ownerUID"],
            )
            for kind in ("import", "clone", "upload")
        }
        for dv in dvs:
            status = dv.get("status") or {}
            phase = str(status.get("phase") or "")
            value = progress_value(status.get("progress"))
            kind = next((k for p, k in PROGRESS_BY_PHASE_PREFIX if phase.startswith(p)), None)
            if kind and value is not None:
                families[kind].add_metric([str(dv["metadata"].get("uid", ""))], value)
        yield from families.values()


class Guard(Protocol):
    """Who may read ``/metrics`` (``cdi.controller.metrics_auth.MetricsGuard``)."""

    async def check(self, authorization: str | None) -> Verdict: ...


class ControllerMetrics:
    def __init__(self, sources: Sources, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = CollectorRegistry()
        self.clock = clock
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            registry=self.registry,
        )
        self.reconcile_total = Counter(
            "controller_runtime_reconcile",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=self.registry,
        )
        self.registry.register(ClusterCollector(sources))

    def timed(self, controller: str, reconcile: Reconcile) -> Reconcile:
        """``reconcile`` with its latency and outcome recorded under ``controller``."""

        async def run(key: str) -> Result:
            start = self.clock()
            result_label = "error"
            try:
                result = await reconcile(key)
                result_label = "success" if result.requeue_after is None else "requeue_after"
                return result
            finally:
                self.reconcile_time.labels(controller).observe(self.clock() - start)
                self.reconcile_total.labels(controller, result_label).inc()

        return run

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def app(self, guard: Guard) -> web.Application:
        """``/metrics`` for whoever ``guard`` admits (a bearer token with ``get /metrics``)."""

        async def handle(request: web.Request) -> web.Response:
            verdict = await guard.check(request.headers.get("Authorization"))
            if not verdict.allowed:
                headers = {"WWW-Authenticate": "Bearer"} if verdict.status == 401 else None
                return web.Response(status=verdict.status, text=verdict.reason, headers=headers)
            return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE})

        app = web.Application()
        app.router.add_get("/metrics", handle)
        return app


async def serve_metrics(
    metrics: ControllerMetrics,
    guard: Guard,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Start serving ``/metrics`` (over TLS with ``ssl_context``); the caller cleans the runner
    up at shutdown."""
    runner = web.AppRunner(metrics.app(guard), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    return runner
