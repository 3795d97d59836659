"""The least a DataVolume controller can do, as a yardstick for ``load_datavolumes.py --floor``.

Issue 11 asks for DataVolume -> worker pod p50 < 0.5 s under a 200-DataVolume burst. Whether a
controller can meet that on a given machine depends first on what the API server, admission
and etcd allow there, so ``--floor`` replaces the real controller (scaled to zero replicas) by
this process: one watch on the namespace's DataVolumes and, for each one ADDED, its claim
created and then its importer pod, from as many threads as the controller has API threads
(``API_CONCURRENCY``), through the same gateway (``cdi.kube.client.Kube``). No status, no
events, no records, no follow-ups, no informers: what is left is the API server's own cost of
the two creates (admission included), the watch delivery and the burst of DataVolume creates
they compete with. The objects are the real renderers' output (``render_pvc``,
``render_importer_pod``), so the node runs the same importer pods as in a normal run.

    python -m benchmarks.load_floor --kubeconfig KUBECONFIG --namespace load

It prints ``ready`` once its watch is established, then one line per failed create; it runs
until killed.
"""

from __future__ import annotations

import argparse
import logging
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.kube.client import API_CONCURRENCY, DATAVOLUMES, PODS, PVCS, Kube, load_api_client
from cdi.kube.errors import KubeError
from cdi.render import RenderError
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.pvc import render_pvc
from cdi.render.worker_pod import Metrics

IMPORTER_IMAGE = "quay.io/cdi-py/cdi-importer:latest"  # as deploy/20-controller.yaml says
log = logging.getLogger("floor")


class FloorController:
    """On each DataVolume ADDED: create its claim, then its pod. Nothing else."""

    def __init__(self, kube: Kube, namespace: str) -> None:
        self.kube = kube
        self.namespace = namespace
        self.pool = ThreadPoolExecutor(API_CONCURRENCY, thread_name_prefix="floor")
        self.pod = ImporterPodConfig(
            image=IMPORTER_IMAGE, command=(), metrics=Metrics(on_pod_ip=True)
        )

    def claim_and_pod(self, obj: dict[str, Any]) -> None:
        try:
            dv = DataVolume.from_dict(obj)
            pvc = self.kube.create(PVCS, render_pvc(dv, None, CDIConfig()), self.namespace)
            self.kube.create(PODS, render_importer_pod(dv, pvc, self.pod), self.namespace)
        except (KubeError, RenderError) as exc:
            print(f"{obj['metadata']['name']}: {exc}", flush=True)

    def run(self) -> None:
        listing = self.kube.list(DATAVOLUMES, self.namespace)
        rv = str(listing["metadata"]["resourceVersion"])
        print("ready", flush=True)
        while True:
            for kind, obj in self.kube.watch(
                DATAVOLUMES, self.namespace, resource_version=rv, timeout_seconds=300
            ):
                rv = str(obj["metadata"].get("resourceVersion") or rv)
                if kind == "ADDED":
                    self.pool.submit(self.claim_and_pod, obj)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", type=Path, required=True)
    p.add_argument("--namespace", default="load")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    FloorController(Kube(load_api_client(args.kubeconfig)), args.namespace).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
