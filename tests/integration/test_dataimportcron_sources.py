"""DataImportCron from an HTTP source and from a release stream, end to end on the real control
plane: the deployed controller's poller pod reads the image's ETag (or the stream document
served from loopback, shaped like Fedora CoreOS's ``streams/stable.json``), imports only when it
changes, names the import by that identity, moves the DataSource with the release in its labels,
collects the old import; a server with no validator and a document that does not parse get a
clear condition and no import."""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.registry import Registry
from testkit.waiting import wait_until
from tests.integration.datavolumes.cdi_env import Images, pv_of, same_prefix_then_zeros
from tests.integration.datavolumes.cdi_env import (  # the fixtures this module uses
    cdi_crds as cdi_crds,
)
from tests.integration.datavolumes.cdi_env import (
    controller as controller,
)
from tests.integration.datavolumes.cdi_env import (
    images as images,
)
from tests.integration.datavolumes.cdi_env import (
    product as product,
)
from tests.integration.datavolumes.test_registry_datavolume import registry_access
from tests.integration.test_dataimportcron import PASSWORD, USER, publish
from tests.integration.test_dataimportcron import registry as registry  # the fixture

pytestmark = pytest.mark.integration
CRONS = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/dataimportcrons"
SOURCES = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datasources"
DVS = "/apis/cdi.kubevirt.io/v1beta1/namespaces/{ns}/datavolumes"
FORCE = "2000-01-01T00:00:00Z"
ANN_NEXT = "cdi.kubevirt.io/storage.import.nextCronTime"


class Site:
    """Files over plain HTTP on 127.0.0.1: ``/etag/<name>`` with an ETag (``etags``),
    ``/plain/<name>`` with none, ``/streams/<name>`` the stream documents. Counts every
    request by method and path."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.etags: dict[str, str] = {}
        self.counts: dict[tuple[str, str], int] = {}
        self.lock = threading.Lock()
        site = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:
                self._answer(body=False)

            def do_GET(self) -> None:
                self._answer(body=True)

            def _answer(self, body: bool) -> None:
                with site.lock:
                    key = (self.command, self.path)
                    site.counts[key] = site.counts.get(key, 0) + 1
                    mode, _, name = self.path.lstrip("/").partition("/")
                    data = site.files.get(name)
                    etag = site.etags.get(name)
                if data is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                if mode == "etag" and etag:
                    self.send_header("ETag", etag)
                self.end_headers()
                if body:
                    self.wfile.write(data)

            def log_message(self, *_: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def put(self, name: str, data: bytes) -> None:
        with self.lock:
            self.files[name] = data
            self.etags[name] = f'"{hashlib.sha256(data).hexdigest()[:16]}"'

    def count(self, method: str, path: str) -> int:
        with self.lock:
            return self.counts.get((method, f"/{path}"), 0)


@pytest.fixture
def site() -> Iterator[Site]:
    served = Site()
    yield served
    served.server.shutdown()


def cron(source: dict[str, Any], name: str = "fcos-cron") -> dict[str, Any]:
    return {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataImportCron",
        "metadata": {"name": name},
        "spec": {
            "schedule": "0 0 1 1 *",  # once a year: the polls here are the first and forced ones
            "managedDataSource": "fcos",
            "importsToKeep": 1,
            "template": {
                "spec": {
                    "source": source,
                    "storage": {
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "testkit-fs",
                        "resources": {"requests": {"storage": "64Mi"}},
                    },
                }
            },
        },
    }


def stream_document(release: str, digest_ref: str, disk_url: str, sha256: str) -> bytes:
    """Shaped like builds.coreos.fedoraproject.org/streams/stable.json (one architecture)."""
    return json.dumps(
        {
            "stream": "stable",
            "metadata": {"last-modified": "2026-12-05T10:00:00Z", "generator": "test"},
            "architectures": {
                "x86_64": {
                    "artifacts": {
                        "qemu": {
                            "release": release,
                            "formats": {
                                "qcow2.xz": {
                                    "disk": {
                                        "location": disk_url,
                                        "signature": disk_url + ".sig",
                                        "sha256": sha256,
                                        "uncompressed-sha256": "0" * 64,
                                    }
                                }
                            },
                        }
                    },
                    "images": {
                        "kubevirt": {
                            "release": release,
                            "image": digest_ref.split("@")[0] + ":stable",
                            "digest-ref": digest_ref,
                        }
                    },
                }
            },
        }
    ).encode()


def _state(kube: Kube, ns: str, product: Product) -> str:
    return (
        str(
            {
                "cron": kube.get_or_none(f"{CRONS.format(ns=ns)}/fcos-cron"),
                "datasource": kube.get_or_none(f"{SOURCES.format(ns=ns)}/fcos"),
                "dvs": [
                    (d["metadata"]["name"], d.get("status"))
                    for d in kube.get(DVS.format(ns=ns))["items"]
                ],
                "pods": [
                    p.get("status") for p in kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]
                ],
            }
        )
        + product.log()[-3000:]
    )


def wait_pointed(kube: Kube, ns: str, product: Product, old: str | None = None) -> dict[str, Any]:
    """The DataSource once it is Ready at a PVC other than ``old``."""

    def pointed() -> dict[str, Any] | None:
        ds = kube.get_or_none(f"{SOURCES.format(ns=ns)}/fcos")
        pvc = (((ds or {}).get("spec") or {}).get("source") or {}).get("pvc") or {}
        conds = ((ds or {}).get("status") or {}).get("conditions") or []
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in conds)
        return ds if ds and ready and pvc.get("name") not in (None, old) else None

    try:
        return wait_until(pointed, "DataSource ready at a new import", 180)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_state(kube, ns, product)}") from exc


def force_poll(kube: Kube, ns: str, product: Product) -> dict[str, Any]:
    """Ask for a poll now and wait until it has run (the next poll time moves on)."""
    path = f"{CRONS.format(ns=ns)}/fcos-cron"
    kube.patch(path, {"metadata": {"annotations": {ANN_NEXT: FORCE}}})

    def polled() -> dict[str, Any] | None:
        obj = kube.get(path)
        return obj if obj["metadata"]["annotations"].get(ANN_NEXT) != FORCE else None

    try:
        return wait_until(polled, "forced poll done", 120)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_state(kube, ns, product)}") from exc


def wait_reason(kube: Kube, ns: str, reason: str, product: Product) -> dict[str, Any]:
    """The cron once its ``UpToDate`` condition is False with ``reason``."""

    def shown() -> dict[str, Any] | None:
        obj = kube.get(f"{CRONS.format(ns=ns)}/fcos-cron")
        conds = (obj.get("status") or {}).get("conditions") or []
        up = [c for c in conds if c["type"] == "UpToDate"]
        return obj if up and (up[0]["status"], up[0]["reason"]) == ("False", reason) else None

    try:
        return wait_until(shown, f"UpToDate=False {reason}", 120)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\n{_state(kube, ns, product)}") from exc


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == kind)


def dv_names(kube: Kube, ns: str) -> set[str]:
    return {d["metadata"]["name"] for d in kube.get(DVS.format(ns=ns))["items"]}


def test_http_cron_imports_once_per_etag_and_moves_its_data_source(
    kube: Kube, namespace: str, site: Site, request: pytest.FixtureRequest
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    disks: Images = request.getfixturevalue("images")
    site.put("disk.img", (disks.root / "disk.qcow2").read_bytes())
    kube.create(CRONS.format(ns=ns), cron({"http": {"url": site.url("etag/disk.img")}}))
    ds = wait_pointed(kube, ns, deployed)
    one = ds["spec"]["source"]["pvc"]["name"]
    assert one.startswith("fcos-") and len(one) == len("fcos-") + 12
    assert site.count("GET", "etag/disk.img") == 1, "one import, the poll read no body"
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, one)["spec"]["local"]["path"]) / "disk.img", disks.reference
    )

    # the same ETag: a poll, no import
    polled = force_poll(kube, ns, deployed)
    assert condition(polled, "UpToDate")["status"] == "True"
    assert dv_names(kube, ns) == {one}
    assert site.count("GET", "etag/disk.img") == 1

    # a new image (new ETag): exactly one new import, the DataSource moves, the old one goes
    site.put("disk.img", (disks.root / "disk.raw.gz").read_bytes())
    force_poll(kube, ns, deployed)
    two = wait_pointed(kube, ns, deployed, old=one)["spec"]["source"]["pvc"]["name"]
    wait_until(lambda: dv_names(kube, ns) == {two}, "old import collected", 60)
    assert site.count("GET", "etag/disk.img") == 2
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, two)["spec"]["local"]["path"]) / "disk.img", disks.reference
    )


def test_http_cron_without_a_validator_says_so_and_never_imports(
    kube: Kube, namespace: str, site: Site, request: pytest.FixtureRequest
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    site.put("disk.img", b"\0" * 4096)
    kube.create(CRONS.format(ns=ns), cron({"http": {"url": site.url("plain/disk.img")}}))

    up = condition(wait_reason(kube, ns, "NoValidator", deployed), "UpToDate")
    assert "ETag" in up["message"] and "checksumFile" in up["message"]
    heads = site.count("HEAD", "plain/disk.img")
    force_poll(kube, ns, deployed)
    wait_reason(kube, ns, "NoValidator", deployed)
    assert site.count("HEAD", "plain/disk.img") == heads + 1, "one request per poll"
    assert dv_names(kube, ns) == set()
    assert site.count("GET", "plain/disk.img") == 0, "no body was ever downloaded"
    assert kube.get_or_none(f"{SOURCES.format(ns=ns)}/fcos") is None


def test_http_cron_by_checksum_file_imports_the_listed_bytes_once_per_sum(
    kube: Kube, namespace: str, site: Site, request: pytest.FixtureRequest
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    disks: Images = request.getfixturevalue("images")
    data = (disks.root / "disk.qcow2").read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    site.put("disk.img", data)
    site.put("SHA256SUMS", f"{'0' * 64}  other.iso\n{sha}  disk.img\n".encode())
    body = cron({"http": {"url": site.url("plain/disk.img")}})  # no validators: the sums
    body["spec"]["httpPoll"] = {"checksumFile": "SHA256SUMS"}
    kube.create(CRONS.format(ns=ns), body)
    ds = wait_pointed(kube, ns, deployed)
    one = f"fcos-{sha[:12]}"
    assert ds["spec"]["source"]["pvc"]["name"] == one
    dv = kube.get(f"{DVS.format(ns=ns)}/{one}")
    assert dv["spec"]["source"]["http"]["checksum"] == f"sha256:{sha}"
    assert site.count("GET", "plain/disk.img") == 1, "the import; the poll read only the sums"
    force_poll(kube, ns, deployed)
    assert dv_names(kube, ns) == {one}
    assert site.count("GET", "plain/disk.img") == 1, "the same sum: no import"
    assert site.count("GET", "plain/SHA256SUMS") == 2


def test_stream_cron_follows_the_kubevirt_containerdisk_by_digest(
    kube: Kube,
    namespace: str,
    site: Site,
    registry: Registry,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    disks: Images = request.getfixturevalue("images")
    registry_access(kube, ns, registry, USER, PASSWORD, "reg")
    first = publish(registry, disks.root / "disk.qcow2", tmp_path / "one")
    ref = registry.url("golden/fedora", first).removeprefix("docker://")
    site.put("stable.json", stream_document("41.20261201.3.0", ref, site.url("x"), "0" * 64))
    source = {
        "stream": {
            "url": site.url("streams/stable.json"),
            "architecture": "x86_64",
            "artifact": "kubevirt",
            "secretRef": "reg",
            "certConfigMap": "reg-ca",
        }
    }
    kube.create(CRONS.format(ns=ns), cron(source))
    ds = wait_pointed(kube, ns, deployed)
    one = f"fcos-{first.removeprefix('sha256:')[:12]}"
    assert ds["spec"]["source"]["pvc"]["name"] == one
    labels = ds["metadata"]["labels"]
    assert labels["cdi.kubevirt.io/stream.release"] == "41.20261201.3.0"
    assert labels["cdi.kubevirt.io/stream.artifact"] == "kubevirt"
    assert ds["metadata"]["annotations"]["cdi.kubevirt.io/stream.releaseDigest"] == first
    dv = kube.get(f"{DVS.format(ns=ns)}/{one}")
    assert dv["spec"]["source"]["registry"]["url"] == f"docker://{ref}"
    status = kube.get(f"{CRONS.format(ns=ns)}/fcos-cron")["status"]
    assert status["sourceRelease"]["release"] == "41.20261201.3.0"
    assert status["sourceRelease"]["digest"] == first

    # the same release again: no import
    force_poll(kube, ns, deployed)
    assert dv_names(kube, ns) == {one}

    # a new release: one new import by its digest, the DataSource and its labels move
    second = publish(registry, disks.root / "disk.raw.gz", tmp_path / "two")
    ref2 = registry.url("golden/fedora", second).removeprefix("docker://")
    site.put("stable.json", stream_document("41.20261215.3.0", ref2, site.url("x"), "0" * 64))
    force_poll(kube, ns, deployed)
    ds = wait_pointed(kube, ns, deployed, old=one)
    two = f"fcos-{second.removeprefix('sha256:')[:12]}"
    assert ds["spec"]["source"]["pvc"]["name"] == two
    assert ds["metadata"]["labels"]["cdi.kubevirt.io/stream.release"] == "41.20261215.3.0"
    wait_until(lambda: dv_names(kube, ns) == {two}, "old import collected", 60)
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, two)["spec"]["local"]["path"]) / "disk.img", disks.reference
    )


def test_stream_cron_imports_the_disk_with_its_sha256_and_refuses_a_bad_document(
    kube: Kube, namespace: str, site: Site, request: pytest.FixtureRequest
) -> None:
    ns = namespace
    deployed: Product = request.getfixturevalue("controller")
    disks: Images = request.getfixturevalue("images")
    data = (disks.root / "disk.qcow2.xz").read_bytes()
    site.put("fcos-41-qemu.x86_64.qcow2.xz", data)
    sha = hashlib.sha256(data).hexdigest()
    disk_url = site.url("plain/fcos-41-qemu.x86_64.qcow2.xz")
    ref = "127.0.0.1:1/none@sha256:" + "1" * 64
    site.put("stable.json", stream_document("41.1", ref, disk_url, sha))
    source = {
        "stream": {
            "url": site.url("plain/stable.json"),
            "architecture": "x86_64",
            "artifact": "qemu/qcow2.xz",
        }
    }
    kube.create(CRONS.format(ns=ns), cron(source))
    ds = wait_pointed(kube, ns, deployed)
    one = f"fcos-{sha[:12]}"
    assert ds["spec"]["source"]["pvc"]["name"] == one
    assert ds["metadata"]["labels"]["cdi.kubevirt.io/stream.artifact"] == "qemu_qcow2.xz"
    dv = kube.get(f"{DVS.format(ns=ns)}/{one}")
    assert dv["spec"]["source"]["http"] == {"url": disk_url, "checksum": f"sha256:{sha}"}
    assert site.count("GET", "plain/fcos-41-qemu.x86_64.qcow2.xz") == 1
    same_prefix_then_zeros(
        Path(pv_of(kube, ns, one)["spec"]["local"]["path"]) / "disk.img", disks.reference
    )

    # a document that does not parse: the reason on the cron, no import, the DataSource stays
    site.put("stable.json", b"<html><body>502 Bad Gateway</body></html>")
    force_poll(kube, ns, deployed)
    wait_reason(kube, ns, "InvalidStreamDocument", deployed)
    assert dv_names(kube, ns) == {one}
    assert kube.get(f"{SOURCES.format(ns=ns)}/fcos")["spec"]["source"]["pvc"]["name"] == one

    # a document without the artifact: the same, with its own reason
    doc = json.loads(stream_document("41.2", ref, disk_url, sha))
    del doc["architectures"]["x86_64"]["artifacts"]["qemu"]["formats"]["qcow2.xz"]
    site.put("stable.json", json.dumps(doc).encode())
    force_poll(kube, ns, deployed)
    wait_reason(kube, ns, "StreamArtifactMissing", deployed)
    assert dv_names(kube, ns) == {one}
    assert site.count("GET", "plain/fcos-41-qemu.x86_64.qcow2.xz") == 1
