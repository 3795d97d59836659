"""Many DataVolumes at once against the installed product: do they all succeed, how fast does
the controller create each one's worker pod, and how much memory does the controller take?

Issue 11's load target: 200 DataVolumes (half blank, half a small http image) created at once
on the testkit cluster with ``crds/`` and ``deploy/`` applied as a user applies them; every one
``Succeeded``; DataVolume -> worker pod created p50 < 0.5 s and p99 < 3 s; controller RSS
< 200 MB. A benchmark, not a timed test (the figures depend on the machine's load): it prints
a table and exits 1 if a DataVolume did not succeed.

How it measures. DataVolumes are created from a thread pool (16 at a time); the moment each
create returns is its start. A watch on the namespace's pods records when each importer pod is
ADDED (monotonic clock of this process, so both ends share one clock); the latency is the
difference per DataVolume (the pod's owner reference names it). "PVC Bound -> worker pod" is
negative when the controller created the pod before the claim bound (Immediate classes).
The controller replicas' RSS is sampled from /proc every 0.5 s (the node runs pods as
processes; a container's process group is in its containerID ``testkit://<pgid>``), and the
peak of the leader is reported. Where the time goes (``load_costs``: API requests, webhooks,
etcd, CPU per process group) is printed twice: for the burst (first create -> last worker pod
seen, the window the latency target lives in) and for the whole run.

``--floor``: the same cluster, webhooks and burst, but the controller Deployment is scaled to
zero and ``benchmarks/load_floor.py`` (a watch that creates each DataVolume's claim, then its
pod, and nothing else) stands in for it: the DV -> pod latency this machine allows at all. The
run ends when every pod is seen (nobody writes a DataVolume status), so "all Succeeded" and
"Succeeded" then count pods seen.

``--profile OUT``: py-spy samples the leader controller during the burst (a flame graph, or
speedscope JSON when OUT ends in ``.json``); py-spy is not a dependency, install it to use this.

    sudo .venv/bin/python benchmarks/load_datavolumes.py [--count 200] [--http-every 2] [--floor]
        [--profile OUT.svg]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, watch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import load_costs  # noqa: E402
from testkit.cluster import Cluster, ClusterConfig  # noqa: E402
from testkit.product import Product  # noqa: E402
from testkit.tryout import ImageServer, allow_example_server  # noqa: E402

NAMESPACE = "load"
DV_API = "/apis/cdi.kubevirt.io/v1beta1"
IMAGE = "small.raw"
MiB = 1 << 20


def small_image(root: Path, size: int = 2 * MiB) -> Path:
    """A raw disk with some data and some holes."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / IMAGE
    rng = random.Random(11)
    with open(path, "wb") as fh:
        fh.truncate(size)
        for offset in range(0, size, 256 * 1024):
            fh.seek(offset)
            fh.write(rng.randbytes(16 * 1024))
    return path


def datavolume(name: str, source: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "source": source,
            "storage": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "testkit-fs",
                "resources": {"requests": {"storage": "8Mi"}},
            },
        },
    }


class Watcher:
    """When each DataVolume's worker pod was first seen, and when its PVC (named after it) was
    first seen and first seen Bound: watches on the namespace's pods and claims."""

    def __init__(self, api: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api)
        self.pod_at: dict[str, float] = {}  # DataVolume name -> monotonic time
        self.pvc_at: dict[str, float] = {}
        self.bound_at: dict[str, float] = {}
        self.pods: set[str] = set()
        self._watches = [watch.Watch(), watch.Watch()]
        self._threads = [
            threading.Thread(target=self._pods, daemon=True, name="pod-watch"),
            threading.Thread(target=self._claims, daemon=True, name="pvc-watch"),
        ]

    def _stream(self, w: watch.Watch, lister: Any) -> Any:
        try:
            yield from w.stream(lister, NAMESPACE)
        except Exception:  # the cluster is stopping
            return

    def _pods(self) -> None:
        for event in self._stream(self._watches[0], self.core.list_namespaced_pod):
            at, pod = time.monotonic(), event["object"]
            self.pods.add(pod.metadata.uid)
            for ref in pod.metadata.owner_references or []:
                if ref.kind in ("DataVolume", "PersistentVolumeClaim"):
                    self.pod_at.setdefault(ref.name, at)  # the PVC is named after its DV

    def _claims(self) -> None:
        lister = self.core.list_namespaced_persistent_volume_claim
        for event in self._stream(self._watches[1], lister):
            at, pvc = time.monotonic(), event["object"]
            self.pvc_at.setdefault(pvc.metadata.name, at)
            if pvc.status and pvc.status.phase == "Bound":
                self.bound_at.setdefault(pvc.metadata.name, at)

    def start(self) -> Watcher:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        for w in self._watches:
            w.stop()


class RssSampler:
    """Peak RSS (MB) of every controller replica's processes, sampled from /proc."""

    def __init__(self, product: Product) -> None:
        self.product = product
        self.peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss")

    def _groups(self) -> dict[str, int]:
        return pod_groups(self.product, "cdi-controller")

    def _run(self) -> None:
        groups: dict[str, int] = {}
        while not self._stop.wait(0.5):
            try:
                groups = self._groups() or groups
            except Exception:  # the API server is busy: keep the last known groups
                pass
            for name, pgid in groups.items():
                self.peak[name] = max(self.peak.get(name, 0.0), _group_rss_mb(pgid))

    def start(self) -> RssSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def pod_groups(product: Product, app: str) -> dict[str, int]:
    """Pod name -> process group of its container (the node runs pods as process groups)."""
    out = {}
    for pod in product.pods(app):
        for status in pod["status"].get("containerStatuses") or []:
            cid = str(status.get("containerID", ""))
            if cid.startswith("testkit://"):
                out[pod["metadata"]["name"]] = int(cid.removeprefix("testkit://"))
    return out


def cost_groups(cluster: Cluster, product: Product) -> dict[str, int]:
    """Every process group whose CPU the cost report shows: control plane, node, our pods."""
    groups = {proc.name: proc.pid for proc in cluster.processes}
    for app in ("cdi-controller", "cdi-webhook"):
        groups.update(pod_groups(product, app))
    return groups


def _group_rss_mb(pgid: int) -> float:
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            for line in Path(f"/proc/{entry}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total / 1e6


def create_all(
    api: client.ApiClient, count: int, http_every: int, url: str, calls: list[float]
) -> dict[str, float]:
    """Create the DataVolumes (16 client threads); when each create returned. ``calls``
    gets each create call's duration (admission and storage on the API server's side)."""
    custom = client.CustomObjectsApi(api)
    created: dict[str, float] = {}

    def one(i: int) -> None:
        name = f"dv-{i:04d}"
        source = {"http": {"url": url}} if i % http_every == 0 else {"blank": {}}
        started = time.monotonic()
        custom.create_namespaced_custom_object(
            "cdi.kubevirt.io", "v1beta1", NAMESPACE, "datavolumes", datavolume(name, source)
        )
        created[name] = time.monotonic()
        calls.append(created[name] - started)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(count)))
    return created


def wait_done(api: client.ApiClient, count: int, timeout: float) -> dict[str, str]:
    custom = client.CustomObjectsApi(api)
    deadline = time.monotonic() + timeout
    phases: dict[str, str] = {}
    while time.monotonic() < deadline:
        listing = custom.list_namespaced_custom_object(
            "cdi.kubevirt.io", "v1beta1", NAMESPACE, "datavolumes"
        )
        phases = {
            d["metadata"]["name"]: (d.get("status") or {}).get("phase", "")
            for d in listing["items"]
        }
        if len(phases) == count and all(p in ("Succeeded", "Failed") for p in phases.values()):
            break
        time.sleep(1.0)
    return phases


def wait_pods(seen: Watcher, created: dict[str, float], timeout: float) -> dict[str, str]:
    """Until every DataVolume's pod was seen (the burst's end); "Succeeded" for those seen
    (what ``--floor`` counts, as nobody writes a DataVolume status there)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not set(created) <= set(seen.pod_at):
        time.sleep(0.1)
    return {n: "Succeeded" if n in seen.pod_at else "" for n in created}


def controller_kubeconfig(cluster: Cluster, product: Product) -> Path:
    """The cluster's kubeconfig acting as the controller's ServiceAccount (a TokenRequest), so
    the floor's requests meet the same authorizer and admission policy as the controller's."""
    token = product.kubectl("-n", "cdi", "create", "token", "cdi-controller", "--duration=2h")
    doc = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in doc["users"]:
        user["user"] = {"token": token.strip()}
    path = cluster.state / "floor.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    path.chmod(0o600)
    return path


def start_floor(cluster: Cluster, product: Product) -> subprocess.Popen[str]:
    """Scale the controller to zero and start ``load_floor`` in its place (its own process
    group, so the cost report shows its CPU); returns once its watch is established."""
    product.kubectl("-n", "cdi", "scale", "deployment/cdi-controller", "--replicas=0")
    deadline = time.monotonic() + 60
    while product.pods("cdi-controller") and time.monotonic() < deadline:
        time.sleep(0.5)
    kubeconfig = controller_kubeconfig(cluster, product)
    argv = [sys.executable, "-m", "benchmarks.load_floor", "--kubeconfig", str(kubeconfig)]
    floor = subprocess.Popen(
        [*argv, "--namespace", NAMESPACE],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert floor.stdout is not None
    if floor.stdout.readline().strip() != "ready":
        raise RuntimeError("the floor controller did not start")
    threading.Thread(target=lambda: sys.stdout.writelines(floor.stdout or []), daemon=True).start()
    return floor


def start_profiler(product: Product, out: str) -> subprocess.Popen[bytes]:
    """``--profile``: py-spy (not a dependency: install it to use this) samples the leader
    controller's process from now until the burst's last worker pod is seen."""
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy on PATH (pip install py-spy)")
    pgid = pod_groups(product, "cdi-controller")[product.leader()]
    argv = [spy, "record", "--pid", str(pgid), "--output", out, "--rate", "100", "--nonblocking"]
    return subprocess.Popen(
        [*argv, "--format", "speedscope" if out.endswith(".json") else "flamegraph"]
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(figures: dict[str, Any]) -> str:
    rows = [
        (
            "DataVolumes (blank / http)",
            f"{figures['count']} ({figures['blank']} / {figures['http']})",
        ),
        ("Succeeded", f"{figures['succeeded']} of {figures['count']}"),
        ("all created in", f"{figures['create_s']:.1f} s"),
        (
            "create call p50 / p99",
            f"{figures['call_p50']:.3f} / {figures['call_p99']:.3f} s",
        ),
        ("load average before / after", figures["load"]),
        ("all Succeeded after", f"{figures['done_s']:.1f} s"),
        ("first create -> last worker pod", f"{figures['last_pod_s']:.2f} s"),
        ("DV -> worker pod p50", f"{figures['p50']:.3f} s (target < 0.5 s)"),
        ("DV -> worker pod p99", f"{figures['p99']:.3f} s (target < 3 s)"),
        ("DV -> worker pod max", f"{figures['max']:.3f} s"),
        ("DV -> PVC created p50 / p99", f"{figures['pvc_p50']:.3f} / {figures['pvc_p99']:.3f} s"),
        (
            "PVC created -> worker pod p50 / p99",
            f"{figures['made_p50']:.3f} / {figures['made_p99']:.3f} s",
        ),
        (
            "PVC Bound -> worker pod p50 / p99",  # negative: the pod came first (Immediate)
            f"{figures['bound_p50']:.3f} / {figures['bound_p99']:.3f} s",
        ),
        ("worker pods seen", str(figures["pods"])),
        ("controller RSS peak (leader)", f"{figures['rss_leader']:.0f} MB (target < 200 MB)"),
        ("controller RSS peak (standby)", f"{figures['rss_standby']:.0f} MB"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"| {k:<{width}} | {v} |" for k, v in rows)


def run(args: argparse.Namespace) -> int:
    state = Path(tempfile.mkdtemp(prefix="cdi-load-"))
    cluster = Cluster(ClusterConfig(state_dir=state))
    server = ImageServer(small_image(state / "images").parent, 0).start()
    floor: subprocess.Popen[str] | None = None
    try:
        cluster.start()
        product = Product.on(cluster).install()
        allow_example_server(product, cluster)
        product.kubectl("create", "namespace", NAMESPACE)
        floor = start_floor(cluster, product) if args.floor else None
        cfg = cluster.api_client().configuration
        # one kept-alive connection per client thread (the default pool keeps 5 per core)
        cfg.connection_pool_maxsize = 32
        api = client.ApiClient(cfg)
        seen, rss = Watcher(api).start(), RssSampler(product).start()
        time.sleep(2.0)  # the watch is established; the sampler has a baseline
        groups = cost_groups(cluster, product)
        if floor is not None:
            groups["floor-controller"] = floor.pid
        load_before, costs_before = os.getloadavg()[0], load_costs.snapshot(api, groups)
        t0 = time.monotonic()
        url = f"http://{server.hostport}/{IMAGE}"
        calls: list[float] = []
        profiler = start_profiler(product, args.profile) if args.profile else None
        created = create_all(api, args.count, args.http_every, url, calls)
        create_s = time.monotonic() - t0
        pods_seen = wait_pods(seen, created, args.timeout)
        burst_costs = load_costs.report(costs_before, load_costs.snapshot(api, groups))
        if profiler is not None:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            profiler.wait(60)
        if floor is not None:
            phases = pods_seen
        else:
            phases = wait_done(api, args.count, args.timeout)
        done_s = time.monotonic() - t0
        costs = load_costs.report(costs_before, load_costs.snapshot(api, groups))
        leader = "" if floor is not None else product.leader()
        rss.stop()
        seen.stop()
        latencies = [seen.pod_at[n] - at for n, at in created.items() if n in seen.pod_at]
        to_pvc = [seen.pvc_at[n] - at for n, at in created.items() if n in seen.pvc_at]
        after_bound = [seen.pod_at[n] - seen.bound_at[n] for n in seen.pod_at if n in seen.bound_at]
        after_pvc = [seen.pod_at[n] - seen.pvc_at[n] for n in seen.pod_at if n in seen.pvc_at]
        http = len([i for i in range(args.count) if i % args.http_every == 0])
        figures = {
            "pvc_p50": statistics.median(to_pvc) if to_pvc else float("nan"),
            "pvc_p99": percentile(to_pvc, 0.99) if to_pvc else float("nan"),
            "made_p50": statistics.median(after_pvc) if after_pvc else float("nan"),
            "made_p99": percentile(after_pvc, 0.99) if after_pvc else float("nan"),
            "bound_p50": statistics.median(after_bound) if after_bound else float("nan"),
            "bound_p99": percentile(after_bound, 0.99) if after_bound else float("nan"),
            "call_p50": statistics.median(calls) if calls else float("nan"),
            "call_p99": percentile(calls, 0.99) if calls else float("nan"),
            "load": f"{load_before:.1f} / {os.getloadavg()[0]:.1f}",
            "costs": costs,
            "count": args.count,
            "http": http,
            "blank": args.count - http,
            "succeeded": sum(p == "Succeeded" for p in phases.values()),
            "create_s": create_s,
            "done_s": done_s,
            # the burst as a whole: how long until every DataVolume had its pod
            "last_pod_s": max(seen.pod_at.values(), default=t0 + float("nan")) - t0,
            "p50": statistics.median(latencies) if latencies else float("nan"),
            "p99": percentile(latencies, 0.99) if latencies else float("nan"),
            "max": max(latencies, default=float("nan")),
            "pods": len(seen.pods),
            "rss_leader": rss.peak.get(leader, 0.0),
            "rss_standby": max((v for k, v in rss.peak.items() if k != leader), default=0.0),
            "missing_pods": sorted(set(created) - set(seen.pod_at))[:5],
            "not_succeeded": sorted(n for n, p in phases.items() if p != "Succeeded")[:5],
            # per DataVolume, in creation order: created (s after the first create), then its
            # claim and its pod seen (s after it was created); for --json readers
            "timeline": [
                [n, at - t0, seen.pvc_at.get(n, math.nan) - at, seen.pod_at.get(n, math.nan) - at]
                for n, at in sorted(created.items(), key=lambda item: item[1])
            ],
        }
        print(report(figures))
        print("during the burst (first create -> last worker pod seen)")
        print(burst_costs)
        print("the whole run")
        print(costs)
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=2))
        return 0 if figures["succeeded"] == args.count else 1
    finally:
        if floor is not None:
            floor.kill()
            floor.wait()
        server.stop()
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=200, help="DataVolumes created at once")
    p.add_argument("--http-every", type=int, default=2, help="every Nth is http, the rest blank")
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds for all to finish")
    p.add_argument("--json", help="also write the figures here")
    p.add_argument(
        "--floor",
        action="store_true",
        help="replace the controller by benchmarks/load_floor.py (claim + pod, nothing else)",
    )
    p.add_argument(
        "--profile",
        metavar="OUT",
        help="py-spy record the leader during the burst (OUT.svg flame graph, OUT.json speedscope)",
    )
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
