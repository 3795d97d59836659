"""The controller's and the webhook's memory with a tenant's many claims (security review N8).

Starts a testkit API server (no node), applies ``crds/``, creates ``--claims`` claims carrying
``--annotation-kib`` KiB of annotations each (a tenant's, none of them CDI's), then measures,
each in a fresh process, the RSS of the informers the controller runs
(``cdi.controller.manager.controller_informers``) and of the webhook's claim cache
(``cdi.kube.informer.keys_cache``) once they have synced: as they are now (``slim``) and as
they were before N8 (``whole``: the same informers without transform, pages of 500). Prints one
row per process: RSS before the informers start (imports done), after they synced, the peak
(``VmHWM``), and the limit of the deployment (deploy/20-controller.yaml, 30-webhook.yaml).

    .venv/bin/python -m benchmarks.cache_memory [--claims 20000] [--annotation-kib 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cdi.kube.client import NAMESPACES, PVCS, Kube, load_api_client

MiB = 1 << 20
LIMITS = {"controller": 384 * MiB, "webhook": 256 * MiB}
NAMESPACE = "bulk"


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


async def _synced(informers: list[Any]) -> float:
    from cdi.kube.informer import wait_all_synced

    t0 = time.monotonic()
    for informer in informers:
        informer.start()
    await wait_all_synced(informers)
    return time.monotonic() - t0


def measure(component: str, mode: str, kubeconfig: Path) -> dict[str, Any]:
    """In this process: the component's informers, started and synced; its memory."""
    import gc

    from cdi.controller.manager import controller_informers
    from cdi.kube.informer import Informer, keys_cache

    kube = Kube(load_api_client(kubeconfig))
    if component == "controller":
        informers = list(controller_informers(kube, 300.0).values())
        if mode == "whole":
            informers = [
                Informer(kube, i.resource, label_selector=i.label_selector) for i in informers
            ]
    else:
        informers = [keys_cache(kube, PVCS) if mode == "slim" else Informer(kube, PVCS)]
    gc.collect()
    start = _status("VmRSS")
    took = asyncio.run(_synced(informers))
    gc.collect()
    claims = next(i for i in informers if i.resource == PVCS)
    return {
        "component": component,
        "mode": mode,
        "cached_claims": len(claims.store),
        "sync_s": round(took, 1),
        "rss_start": start,
        "rss_synced": _status("VmRSS"),
        "rss_peak": _status("VmHWM"),
    }


def create_claims(kube: Kube, count: int, annotation_kib: int) -> float:
    kube.create(
        NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    notes = {f"tenant.example/note-{i}": "n" * 1000 for i in range(annotation_kib)}

    def one(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"c{i}", "annotations": notes},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Mi"}},
            },
        }
        kube.create(PVCS, body, NAMESPACE)

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(one, range(count)))
    return time.monotonic() - t0


def run(claims: int, annotation_kib: int) -> list[dict[str, Any]]:
    from testkit.cluster import Cluster, ClusterConfig
    from testkit.product import Product

    state = Path(tempfile.mkdtemp(prefix="cache-memory-"))
    with Cluster(ClusterConfig(state_dir=state, with_node=False)) as cluster:
        Product.on(cluster).apply_crds()
        took = create_claims(Kube(cluster.api_client()), claims, annotation_kib)
        print(f"created {claims} claims with {annotation_kib} KiB of annotations in {took:.0f} s")
        rows = []
        for component in ("controller", "webhook"):
            for mode in ("whole", "slim"):
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks.cache_memory", "--measure", component,
                     "--mode", mode, "--kubeconfig", str(cluster.kubeconfig)],
                    capture_output=True, text=True, check=True,
                )  # fmt: skip
                rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        return rows


def report(rows: list[dict[str, Any]]) -> None:
    print("| process | cache | claims cached | sync s | RSS before | RSS synced | peak | limit |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        mib = {k: f"{r[k] / MiB:.0f} MiB" for k in ("rss_start", "rss_synced", "rss_peak")}
        limit = LIMITS[r["component"]] / MiB
        print(
            f"| {r['component']} | {r['mode']} | {r['cached_claims']} | {r['sync_s']} | "
            f"{mib['rss_start']} | {mib['rss_synced']} | {mib['rss_peak']} | {limit:.0f} MiB |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--claims", type=int, default=20_000)
    p.add_argument("--annotation-kib", type=int, default=4)
    p.add_argument("--measure", choices=("controller", "webhook"), help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("whole", "slim"), default="slim", help=argparse.SUPPRESS)
    p.add_argument("--kubeconfig", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure:
        print(json.dumps(measure(args.measure, args.mode, args.kubeconfig)))
        return 0
    report(run(args.claims, args.annotation_kib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
