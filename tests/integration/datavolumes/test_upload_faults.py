"""The upload server pod SIGKILLed mid-upload, on the real control plane with the product
installed from deploy/: the user uploads through the deployed proxy with ``commands.upload.client``
(through a loopback relay that paces the bytes, so the kill lands mid-body); the node restarts
the container, the controller counts the restart, and the client carries on.

- raw: the server left a durable checkpoint on the volume before it died (the data path
  fsyncs and records one every ``UPLOAD_CHECKPOINT_INTERVAL``, 256 MiB, so this image is a
  sparse 320 MiB raw: the only size that can show it); after the restart HEAD reports that
  offset and the client PATCHes from there: the relay carries the file about once.
- qcow2: its decoder state died with the process: the server says so (``Cdi-Upload-Restart``,
  offset 0) and the client sends the file again from byte 0.

Both DataVolumes Succeed with the image's exact content.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from commands.upload.client import ClientSettings, UploadResult, upload_file
from datapath import checkpoint
from testkit.kubeclient import Kube
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import (
    Images,
    datavolume,
    dv_path,
    pv_of,
    same_prefix_then_zeros,
    wait_phase,
)
from tests.integration.datavolumes.test_upload import User, user  # noqa: F401
from tests.integration.test_cli_upload_e2e import CuttingRelay, relay_to_proxy  # noqa: F401

pytestmark = pytest.mark.integration
MiB = 1 << 20
RAW_SIZE = 320 * MiB  # past the first 256 MiB checkpoint, sparse on disk


def big_raw(folder: Path) -> Path:
    """A sparse raw image with data before and after the first checkpoint."""
    path = folder / "big.raw"
    rng = random.Random(12)
    with open(path, "wb") as fh:
        fh.truncate(RAW_SIZE)
        for offset in (0, 200 * MiB, 300 * MiB):
            fh.seek(offset)
            fh.write(rng.randbytes(MiB))
    return path


def kill_upload_server(kube: Kube, namespace: str, pvc: str) -> None:
    pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/cdi-upload-{pvc}")
    (status,) = pod["status"]["containerStatuses"]
    os.killpg(int(str(status["containerID"]).removeprefix("testkit://")), signal.SIGKILL)


def ready_upload_dv(kube: Kube, namespace: str, size: str) -> Path:
    """DataVolume ``up`` (upload, filesystem) in UploadReady; the folder of its volume."""
    dv = datavolume("up", {"upload": {}}, size=size, storage_class="testkit-fs")
    kube.create(dv_path(namespace), dv)
    wait_phase(kube, namespace, "up", ("UploadReady",), 120)
    return Path(pv_of(kube, namespace, "up")["spec"]["local"]["path"])


def upload_in_background(url: str, path: Path, token: Any) -> tuple[threading.Thread, list[Any]]:
    """``upload_file`` in its own thread; the result (or the error) lands in the list."""
    out: list[Any] = []
    settings = ClientSettings(url, ssl=False, attempts=30, backoff_max=3.0)

    def run() -> None:
        try:
            out.append(asyncio.run(upload_file(str(path), settings, token=token)))
        except Exception as exc:  # the test asserts on it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def upload_with_a_kill(
    kube: Kube,
    namespace: str,
    uploader: User,
    relay: CuttingRelay,
    image: Path,
    killed_when: Any,
) -> UploadResult:
    token = uploader.token("up")
    thread, out = upload_in_background(f"https://127.0.0.1:{relay.port}", image, lambda: token)
    wait_until(killed_when, "the upload mid-way", 120)
    kill_upload_server(kube, namespace, "up")
    thread.join(300)
    assert out, "the upload did not finish"
    (result,) = out
    assert isinstance(result, UploadResult), repr(result)
    return result


def test_a_raw_upload_resumes_from_its_checkpoint_after_the_pod_is_killed(
    kube: Kube,
    namespace: str,
    user: User,  # noqa: F811
    relay_to_proxy: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    image = big_raw(tmp_path)
    folder = ready_upload_dv(kube, namespace, "400Mi")
    relay = relay_to_proxy(1 << 62, 40 * MiB)  # paced: about 8 s of sending, never cut

    def checkpointed() -> bool:  # the file is written at offset 0 first; wait for a real one
        saved = checkpoint.load(str(folder / ".cdi-upload-checkpoint"))
        return saved is not None and saved.offset > 0 and relay.sent < RAW_SIZE

    result = upload_with_a_kill(kube, namespace, user, relay, image, checkpointed)
    assert result.resumed >= 1 and not result.restarted, result
    assert relay.sent < RAW_SIZE * 1.5, (relay.sent, RAW_SIZE)  # resumed, not sent twice
    dv = wait_phase(kube, namespace, "up", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    assert dv["status"].get("restartCount", 0) >= 1
    same_prefix_then_zeros(folder / "disk.img", image)


def test_a_qcow2_upload_is_told_to_start_over_after_the_pod_is_killed_and_succeeds(
    kube: Kube,
    namespace: str,
    user: User,  # noqa: F811
    relay_to_proxy: Any,  # noqa: F811
    images: Images,
) -> None:
    image = images.path("disk.qcow2")
    size = image.stat().st_size
    folder = ready_upload_dv(kube, namespace, "32Mi")
    relay = relay_to_proxy(1 << 62, max(size // 8, 256 * 1024))  # about 8 s of sending
    result = upload_with_a_kill(kube, namespace, user, relay, image, lambda: relay.sent > size // 3)
    assert result.restarted and "start again from byte 0" in result.restarted[0], result
    assert relay.sent > size, (relay.sent, size)  # the file went again from the start
    dv = wait_phase(kube, namespace, "up", ("Succeeded", "Failed"), 120)
    assert dv["status"]["phase"] == "Succeeded", dv["status"]
    same_prefix_then_zeros(folder / "disk.img", images.reference)
