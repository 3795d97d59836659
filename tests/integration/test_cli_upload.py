"""``cdi upload``'s Kubernetes half against the real kube-apiserver: the DataVolume and PVC it
creates, its refusals of existing PVCs, the WaitForFirstConsumer message, the readiness wait
and its timeout, the provisioning errors it surfaces from events, and the proxy URL it finds
in CDIConfig. The command runs through the real ``cdi`` entry point with the cluster's
kubeconfig.

Where the controller's part is needed (a phase, an annotation, an event) the test writes it,
as the upload flavour or a provisioner would, through the same API; each such write is one a
running controller would make the same way, so the tests hold with or without the product
installed in the session.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cdi.kube.client import Kube as Gateway
from commands.main import main
from commands.upload.options import UploadOptions
from commands.upload.target import UploadTarget
from testkit.cluster import Cluster
from testkit.kubeclient import Kube, ns_path
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import DV_API, cdi_crds  # noqa: F401
from tests.integration.test_tryout import REPO, Terminal

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("cdi_crds")]
ANN = "cdi.kubevirt.io/storage."
JSON = dict[str, Any]


@pytest.fixture
def image(tmp_path: Path) -> Path:
    path = tmp_path / "disk.img"
    path.write_bytes(b"\0" * 4096)
    return path


@pytest.fixture
def cdi(
    cluster: Cluster, namespace: str, image: Path, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int, str, str]]:
    """Run ``cdi upload ARGS`` in the test namespace; (status, stdout, stderr)."""

    def run(*args: str) -> tuple[int, str, str]:
        argv = ["upload", *args, f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}"]
        if not any(a.startswith(("--image-path", "--archive-path")) for a in args):
            argv.append(f"--image-path={image}")
        code = main(argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def pvc_manifest(name: str, annotations: dict[str, str], sc: str = "testkit-fs") -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": sc,
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }


def create_pvc(kube: Kube, ns: str, name: str, annotations: dict[str, str]) -> JSON:
    return kube.create(ns_path(ns, "persistentvolumeclaims"), pvc_manifest(name, annotations))


@pytest.fixture
def unprovisioned(kube: Kube, namespace: str) -> Iterator[str]:
    """An Immediate class nobody provisions: the installed controller (other tests of the
    session install the product) can never make a claim of it ready, so these tests see only
    what they write themselves."""
    name = f"unprovisioned-{namespace}"
    path = "/apis/storage.k8s.io/v1/storageclasses"
    body = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "example.com/nobody",
        "volumeBindingMode": "Immediate",
    }
    kube.create(path, body)
    yield name
    kube.delete(f"{path}/{name}")


@pytest.fixture
def controller_part(kube: Kube) -> Iterator[Callable[[Callable[[], bool]], None]]:
    """Play a controller's part in a thread: ``act`` is retried until it returns True."""
    threads: list[threading.Thread] = []
    stop = threading.Event()

    def start(act: Callable[[], bool]) -> None:
        def loop() -> None:
            while not stop.is_set() and not act():
                time.sleep(0.1)

        threads.append(threading.Thread(target=loop, daemon=True))
        threads[-1].start()

    yield start
    stop.set()
    for t in threads:
        t.join(10)


# -- what is created ---------------------------------------------------------------------------


def test_upload_dv_creates_virtctls_datavolume(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    code, out, err = cdi(
        "dv",
        "up",
        "--size=64Mi",
        "--storage-class=testkit-fs",
        "--access-mode=ReadWriteOnce",
        "--volume-mode=filesystem",
        "--force-bind",
        "--wait-secs=0",
    )
    assert code == 1
    assert out.splitlines()[:3] == [
        f"PVC {namespace}/up not found ",
        f"DataVolume {namespace}/up created",
        "Waiting for PVC up upload pod to be ready...",
    ]
    assert err == "cdi upload: UploadNotReady: timed out waiting for the condition\n"
    dv = kube.get(f"{DV_API}/namespaces/{namespace}/datavolumes/up")
    assert dv["spec"]["source"] == {"upload": {}}
    assert dv["spec"]["contentType"] == "kubevirt"
    assert dv["spec"]["storage"] == {
        "resources": {"requests": {"storage": "64Mi"}},
        "storageClassName": "testkit-fs",
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
    }
    assert dv["metadata"]["annotations"][ANN + "bind.immediate.requested"] == ""


def test_upload_pvc_creates_an_annotated_pvc_and_waits_only_wait_secs(
    kube: Kube,
    namespace: str,
    cdi: Callable[..., tuple[int, str, str]],
    image: Path,
    unprovisioned: str,
) -> None:
    started = time.monotonic()
    sc = f"--storage-class={unprovisioned}"
    code, out, err = cdi("pvc", "up", "--size=16Mi", f"--archive-path={image}", "--wait-secs=3", sc)
    elapsed = time.monotonic() - started
    assert code == 1 and 3 <= elapsed < 8, elapsed
    assert f"PersistentVolumeClaim {namespace}/up created" in out
    assert err == "cdi upload: UploadNotReady: timed out waiting for the condition\n"
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "up"))
    assert pvc["metadata"]["annotations"][ANN + "upload.target"] == ""
    assert pvc["metadata"]["annotations"][ANN + "contentType"] == "archive"
    assert pvc["metadata"]["labels"] == {"cdi.kubevirt.io/applyStorageProfile": "true"}
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["resources"]["requests"]["storage"] == "16Mi"


def test_a_storage_class_that_does_not_exist_creates_nothing(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    code, _, err = cdi("dv", "up", "--size=16Mi", "--storage-class=nope")
    assert code == 1
    assert err == 'cdi upload: NotFound: storageclasses.storage.k8s.io "nope" not found\n'
    assert kube.get_or_none(f"{DV_API}/namespaces/{namespace}/datavolumes/up") is None


# -- existing PVCs -------------------------------------------------------------------------------


def test_a_pvc_already_imported_is_refused(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    create_pvc(kube, namespace, "done", {ANN + "upload.target": "", ANN + "pod.phase": "Succeeded"})
    code, out, err = cdi("pvc", "done", "--size=16Mi")
    assert code == 1 and "created" not in out
    assert err == (
        "cdi upload: TargetNotUsable: PVC done already successfully imported/cloned/updated\n"
    )


def test_a_pvc_that_is_not_an_upload_target_is_refused(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    create_pvc(kube, namespace, "plain", {})
    code, _, err = cdi("pvc", "plain", "--size=16Mi")
    assert code == 1
    assert err == "cdi upload: TargetNotUsable: PVC plain not available for upload\n"


def test_no_create_makes_an_existing_pvc_an_upload_target(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    create_pvc(kube, namespace, "plain", {})
    code, out, _ = cdi("pvc", "plain", "--no-create", "--wait-secs=0")
    assert code == 1  # nobody makes it ready here
    assert f"Using existing PVC {namespace}/plain" in out
    pvc = kube.get(ns_path(namespace, "persistentvolumeclaims", "plain"))
    assert pvc["metadata"]["annotations"][ANN + "upload.target"] == ""


def test_no_create_without_a_pvc_says_it_is_not_found(
    namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    code, out, err = cdi("dv", "none", "--no-create")
    assert code == 1
    assert out == f"PVC {namespace}/none not found \n"
    assert err == 'cdi upload: NotFound: persistentvolumeclaims "none" not found\n'


def test_an_archive_into_a_pvc_without_archive_content_type_is_refused(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]], image: Path
) -> None:
    create_pvc(kube, namespace, "img", {ANN + "upload.target": "", ANN + "contentType": "kubevirt"})
    code, _, err = cdi("pvc", "img", f"--archive-path={image}")
    assert code == 1
    assert err == (
        "cdi upload: TargetNotUsable: PVC img doesn't have archive contentType annotation\n"
    )


def test_dv_mode_refuses_a_pvc_without_a_datavolume(
    kube: Kube, namespace: str, cdi: Callable[..., tuple[int, str, str]]
) -> None:
    create_pvc(kube, namespace, "orphan", {ANN + "upload.target": ""})
    code, _, err = cdi("dv", "orphan", "--size=16Mi")
    assert code == 1
    assert err == (
        "cdi upload: TargetNotUsable: No DataVolume is associated with the existing PVC "
        f"{namespace}/orphan\n"
    )


# -- waiting for the upload pod ----------------------------------------------------------------


def test_a_datavolume_waiting_for_its_first_consumer_needs_force_bind(
    kube: Kube,
    namespace: str,
    cdi: Callable[..., tuple[int, str, str]],
    controller_part: Callable[[Callable[[], bool]], None],
) -> None:
    path = f"{DV_API}/namespaces/{namespace}/datavolumes/wffc"

    def wait_for_first_consumer() -> bool:
        if kube.get_or_none(path) is None:
            return False
        kube.patch(f"{path}/status", {"status": {"phase": "WaitForFirstConsumer"}})
        return True

    controller_part(wait_for_first_consumer)
    code, _, err = cdi("dv", "wffc", "--size=16Mi", "--storage-class=testkit-fs-wffc")
    assert code == 1
    assert err == (
        "cdi upload: UploadNotReady: cannot upload to DataVolume in WaitForFirstConsumer phase, "
        "make sure the PVC is Bound, or use force-bind flag\n"
    )


def event_on(obj: JSON, reason: str, message: str) -> JSON:
    meta = obj["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}."},
        "involvedObject": {
            "apiVersion": obj["apiVersion"],
            "kind": obj["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "reason": reason,
        "message": message,
        "type": "Warning",
    }


@pytest.mark.parametrize(
    ("kind", "reason", "said"),
    [
        ("pvc", "ProvisioningFailed", "ProvisioningFailed: Provisioning failed: "),
        ("dv", "ErrClaimNotValid", "ErrClaimNotValid: Claim not valid: "),
    ],
    ids=["provisioning-failed-on-the-pvc", "claim-not-valid-on-the-datavolume"],
)
def test_a_failure_event_ends_the_wait(
    kube: Kube,
    namespace: str,
    cdi: Callable[..., tuple[int, str, str]],
    controller_part: Callable[[Callable[[], bool]], None],
    unprovisioned: str,
    kind: str,
    reason: str,
    said: str,
) -> None:
    """A provisioner's ``ProvisioningFailed`` on the PVC, the controller's ``ErrClaimNotValid``
    on the DataVolume: said at once, not after --wait-secs."""
    path = (
        ns_path(namespace, "persistentvolumeclaims", "bad")
        if kind == "pvc"
        else f"{DV_API}/namespaces/{namespace}/datavolumes/bad"
    )

    def report_failure() -> bool:
        obj = kube.get_or_none(path)
        if obj is None:
            return False
        kube.create(ns_path(namespace, "events"), event_on(obj, reason, "no space in the pool"))
        return True

    controller_part(report_failure)
    started = time.monotonic()
    sc = f"--storage-class={unprovisioned}"  # access mode given: no StorageProfile needed
    code, _, err = cdi(kind, "bad", "--size=16Mi", sc, "--access-mode=ReadWriteOnce")
    assert code == 1 and time.monotonic() - started < 30
    assert err == f"cdi upload: {said}no space in the pool\n"


def test_the_pvc_wait_ends_when_the_upload_pod_is_ready(
    kube: Kube,
    namespace: str,
    cdi: Callable[..., tuple[int, str, str]],
    controller_part: Callable[[Callable[[], bool]], None],
) -> None:
    path = ns_path(namespace, "persistentvolumeclaims", "ready")
    seen: list[float] = []

    def pod_ready() -> bool:  # a moment after the PVC appears, as a pod takes to start
        if kube.get_or_none(path) is None:
            return False
        seen.append(time.monotonic())
        if seen[-1] - seen[0] < 0.5:
            return False
        kube.patch(path, {"metadata": {"annotations": {ANN + "pod.ready": "true"}}})
        return True

    controller_part(pod_ready)
    code, out, err = cdi("pvc", "ready", "--size=16Mi", "--uploadproxy-url=127.0.0.1:9")
    assert out.splitlines()[-3:] == [
        "Waiting for PVC ready upload pod to be ready...",
        "Pod now ready",
        "Uploading data to https://127.0.0.1:9",
    ]
    # What follows depends on the session: no token API (NotFound), or a token and then
    # nothing listening on port 9. Either way the command fails with one typed line.
    assert code == 1 and err.startswith("cdi upload: ") and err.count("\n") == 1


# -- the proxy -------------------------------------------------------------------------------------


@pytest.fixture
def proxy_override(kube: Kube) -> Iterator[Callable[[str | None], None]]:
    path = f"{DV_API}/cdiconfigs/config"
    before = (kube.get(path).get("spec") or {}).get("uploadProxyURLOverride")

    def set_override(url: str | None) -> None:
        kube.patch(path, {"spec": {"uploadProxyURLOverride": url}})

    yield set_override
    set_override(before)


def test_the_proxy_url_comes_from_cdiconfig_unless_given(
    cluster: Cluster, namespace: str, proxy_override: Callable[[str | None], None]
) -> None:
    gateway = Gateway(cluster.api_client())
    opts = UploadOptions(create_pvc=True, name="x", path="a.img")
    proxy_override("uploadproxy.example.test:31001")
    target = UploadTarget(gateway, namespace, opts)
    wait_until(
        lambda: target.proxy_url() == "https://uploadproxy.example.test:31001",
        "the override to be read",
        10,
    )
    given = UploadOptions(create_pvc=True, name="x", path="a.img", proxy_url="http://127.0.0.1:1")
    assert UploadTarget(gateway, namespace, given).proxy_url() == "http://127.0.0.1:1"


def test_ctrl_c_while_waiting_ends_the_command_without_a_traceback(
    cluster: Cluster, namespace: str, image: Path
) -> None:
    argv = [
        sys.executable, "-m", "cdi", "upload", "pvc", "waiting", "--size=16Mi",
        f"--image-path={image}", "--storage-class=testkit-fs-wffc",
        f"--kubeconfig={cluster.kubeconfig}", f"--namespace={namespace}",
    ]  # fmt: skip
    term = Terminal(argv, REPO)
    wait_until(lambda: "Waiting for PVC waiting" in term.text, "the wait to start", 60)
    term.ctrl_c()
    assert term.wait(30) == 130
    assert "cdi upload: Interrupted: stopped by the user" in term.text
    assert "Traceback" not in term.text
