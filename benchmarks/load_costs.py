"""Where a load benchmark's time goes: the kube-apiserver's own latency metrics and the CPU
each component of the testkit cluster burned, as differences between two snapshots.

``benchmarks/load_datavolumes.py`` takes a ``Snapshot`` before it creates the DataVolumes and
another when they are done; ``report(before, after)`` turns the differences into tables:

- API requests per verb and resource (``apiserver_request_duration_seconds``: count, mean,
  total seconds spent serving them), the slowest first, so "what does each DataVolume cost and
  which requests wait" is answered by the server, not guessed from the client;
- admission webhooks (``apiserver_admission_webhook_admission_duration_seconds``: the round
  trip the API server waits for our webhook, TLS and the service proxy included), API Priority
  and Fairness queueing (``apiserver_flowcontrol_request_wait_duration_seconds``) and etcd
  (``etcd_request_duration_seconds``);
- CPU seconds per process group (control-plane processes, the controller and webhook pods) from
  ``/proc``: on a shared two-core machine the question is often who had the CPU.

Only means are derived (sum / count): histogram buckets are too coarse at these latencies to
say more, and the same definition is used before and after a change.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

Series = tuple[str, tuple[tuple[str, str], ...]]  # (sample name, sorted labels)
CLK_TCK = os.sysconf("SC_CLK_TCK")
FAMILIES = {
    "apiserver_request_duration_seconds": ("verb", "resource", "subresource"),
    "apiserver_admission_webhook_admission_duration_seconds": ("name", "operation", "type"),
    "apiserver_flowcontrol_request_wait_duration_seconds": ("priority_level", "execute"),
    "etcd_request_duration_seconds": ("operation", "type"),
}


@dataclass(frozen=True)
class Snapshot:
    samples: dict[Series, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)  # process group name -> CPU seconds


def apiserver_metrics(api: client.ApiClient) -> dict[Series, float]:
    """The ``_sum`` and ``_count`` samples of ``FAMILIES`` from the API server's /metrics."""
    method, url, headers, body, post = api.param_serialize(
        method="GET",
        resource_path="/metrics",
        header_params={"Accept": "text/plain"},
        auth_settings=["BearerToken"],
    )
    resp = api.call_api(method, url, header_params=headers, body=body, post_params=post)
    text = resp.read().decode()
    out: dict[Series, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in FAMILIES:
            continue
        for sample in family.samples:
            if sample.name.endswith(("_sum", "_count")):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU of every live process in the group, reaped children included."""
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:  # field 5 of stat: pgrp
            total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total / CLK_TCK


def snapshot(api: client.ApiClient, groups: dict[str, int]) -> Snapshot:
    cpu = {name: group_cpu_seconds(pgid) for name, pgid in groups.items()}
    return Snapshot(apiserver_metrics(api), cpu)


def _by(delta: dict[Series, float], family: str) -> dict[tuple[str, ...], tuple[float, float]]:
    """(labels of interest) -> (count, sum) for one histogram family."""
    keys = FAMILIES[family]
    acc: dict[tuple[str, ...], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for (name, labels), value in delta.items():
        if name not in (f"{family}_count", f"{family}_sum"):
            continue
        found = dict(labels)
        key = tuple(found.get(k, "") for k in keys)
        acc[key][0 if name.endswith("_count") else 1] += value
    return {k: (c, s) for k, (c, s) in acc.items() if c > 0}


def _table(title: str, rows: Iterable[tuple[str, float, float]], limit: int) -> list[str]:
    ordered = sorted(rows, key=lambda r: -r[2])[:limit]
    lines = [f"{title}", f"  {'':<52} {'count':>7} {'mean ms':>9} {'total s':>9}"]
    for label, count, total in ordered:
        lines.append(f"  {label[:52]:<52} {count:>7.0f} {1000 * total / count:>9.1f} {total:>9.1f}")
    return lines


def report(before: Snapshot, after: Snapshot, limit: int = 30) -> str:
    delta = {k: v - before.samples.get(k, 0.0) for k, v in after.samples.items()}
    out: list[str] = []
    for family, title in (
        ("apiserver_request_duration_seconds", "API requests (verb resource/subresource)"),
        ("apiserver_admission_webhook_admission_duration_seconds", "admission webhooks"),
        ("apiserver_flowcontrol_request_wait_duration_seconds", "APF queue wait (level, ran)"),
        ("etcd_request_duration_seconds", "etcd requests (operation type)"),
    ):
        rows = [
            (" ".join(p for p in key if p), count, total)
            for key, (count, total) in _by(delta, family).items()
        ]
        out += _table(title, rows, limit)
    out.append("CPU seconds during the run (process group)")
    for name in sorted(after.cpu, key=lambda n: -(after.cpu[n] - before.cpu.get(n, 0.0))):
        out.append(f"  {name:<52} {after.cpu[name] - before.cpu.get(name, 0.0):>9.1f}")
    return "\n".join(out)
