"""An upload server whose deadline passes is replaced with a fresh certificate: the upload
engine (``UploadWorker``) driven step by step against the real control plane, with a server
certificate that lives 6 s (the deployed controller's is 24 h), and the real upload server pod
(``uploader/``) on the testkit node, which exits ``DeadlinePassed`` at 80 % of that.

The claim is marked as created for a DataVolume, so the deployed controller (if the session
installed it) leaves it to this test."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import time
from typing import Any

import pytest

from cdi.controller.flavours import FlavourDeps
from cdi.controller.flavours.upload import Action, Target, UploadSettings, UploadWorker
from cdi.controller.record import ClaimRecord
from cdi.kube.client import PODS, PVCS, SECRETS, AsyncKube, Kube
from cdi.kube.events import EventRecorder
from testkit.cluster import Cluster

pytestmark = pytest.mark.integration


async def no_metrics(pod_ip: str, port: int) -> str | None:
    return None


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": name,
            "annotations": {"cdi.kubevirt.io/createdForDataVolume": "this-test"},
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "testkit-fs",
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }


def test_a_server_past_its_deadline_is_recreated_with_a_fresh_certificate(
    cluster: Cluster, namespace: str
) -> None:
    gateway = Kube(cluster.api_client())
    gateway.create(PVCS, claim("renewed"), namespace)
    settings = UploadSettings(
        namespace=namespace, cert_lifetime=dt.timedelta(seconds=6), poll_interval=0.5
    )

    async def run() -> list[tuple[Action, str | None, bytes]]:
        kube = AsyncKube(gateway)
        worker = UploadWorker(FlavourDeps(kube, EventRecorder(kube, "test"), no_metrics), settings)
        seen: list[tuple[Action, str | None, bytes]] = []
        deadline = time.monotonic() + 90
        try:
            while time.monotonic() < deadline and [s[0] for s in seen].count(Action.READY) < 2:
                pvc = await kube.get(PVCS, "renewed", namespace)
                if (pvc.get("status") or {}).get("phase") != "Bound":
                    await asyncio.sleep(0.2)
                    continue
                step = await worker.step(Target(pvc, ClaimRecord.from_pvc(pvc)), pvc)
                pod = await kube.get_or_none(PODS, "cdi-upload-renewed", namespace)
                secret = await kube.get_or_none(SECRETS, "cdi-upload-renewed-tls", namespace)
                cert = base64.b64decode(((secret or {}).get("data") or {}).get("tls.crt", ""))
                uid = ((pod or {}).get("metadata") or {}).get("uid")
                if not seen or seen[-1][0] != step.assessment.action:
                    seen.append((step.assessment.action, uid, cert))
                await asyncio.sleep(0.5)
        finally:
            kube.close()
        return seen

    seen = asyncio.run(run())
    actions = [s[0] for s in seen]
    assert actions.count(Action.READY) == 2, actions
    assert Action.RENEW in actions, actions
    first = next(s for s in seen if s[0] == Action.READY)
    second = [s for s in seen if s[0] == Action.READY][-1]
    assert first[1] != second[1], "a new pod"
    assert first[2] and second[2] and first[2] != second[2], "a fresh certificate"
    annotations = gateway.get(PVCS, "renewed", namespace)["metadata"]["annotations"]
    assert annotations["cdi.kubevirt.io/storage.pod.ready"] == "true"
    assert "cdi.kubevirt.io/storage.pod.phase" not in annotations  # the upload is not over
