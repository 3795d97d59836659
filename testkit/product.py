"""Install the product on a testkit cluster the way a user does: ``kubectl apply`` of ``crds/``
and ``deploy/`` as they are in the repository, then wait until every Deployment there is
Available, the admission webhook answers through its Service and every APIService (the upload
token API) is Available through the kube-apiserver's aggregation.

The node maps our image names to ``python -m cdi`` and friends (``images.yaml``), so the
Deployments run the checkout's code; nothing is started by hand and nothing in the manifests
is rewritten. The integration tests share one installed product per session; ``testkit.tryout``
uses the same steps for the one-command try-out. :class:`Kubectl` runs the kubectl that
``hack/kube/build.sh`` builds from the control plane's own release.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from testkit.cluster import DEFAULT_BIN_DIR, REPO_ROOT, Cluster
from testkit.images import ImageMap
from testkit.kubeclient import Kube
from testkit.podenv import expand
from testkit.waiting import wait_until

JSON = dict[str, Any]
DEPLOY_DIR = REPO_ROOT / "deploy"
CRD_DIR = REPO_ROOT / "crds"
NAMESPACE = "cdi"
LEASE = "cdi-controller-leader-election-helper"
CONTROLLER = "cdi-controller"
# A DataVolume with two sources: only our validating webhook refuses it with this message.
WEBHOOK_PROBE = {
    "apiVersion": "cdi.kubevirt.io/v1beta1",
    "kind": "DataVolume",
    "metadata": {"name": "webhook-probe", "namespace": "default"},
    "spec": {
        "source": {"http": {"url": "http://127.0.0.1:9/a.img"}, "blank": {}},
        "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}},
    },
}
WEBHOOK_PROBE_MESSAGE = "Multiple Data volume sources"


class KubectlFailed(RuntimeError):
    """kubectl exited non-zero; the message holds its stderr."""


class ProductNotReady(RuntimeError):
    """A Deployment of deploy/ did not become Available, or the webhook did not answer; the
    message ends with the tails of the product's pod logs."""


@dataclass(frozen=True)
class Kubectl:
    """The real kubectl against one cluster, with the admin kubeconfig."""

    kubeconfig: Path
    binary: Path = DEFAULT_BIN_DIR / "kubectl"

    @classmethod
    def for_cluster(cls, cluster: Cluster) -> Kubectl:
        return cls(cluster.kubeconfig, cluster.config.bin_dir / "kubectl")

    def __call__(self, *args: str, stdin: str | None = None, timeout: float = 120) -> str:
        if not self.binary.is_file():
            raise KubectlFailed(f"no kubectl at {self.binary}: run hack/kube/build.sh")
        proc = subprocess.run(
            [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode:
            raise KubectlFailed(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout


def deploy_documents(deploy_dir: Path = DEPLOY_DIR) -> list[JSON]:
    """Every object in ``deploy/*.yaml`` (not the ``crds`` link), in file order."""
    docs: list[JSON] = []
    for path in sorted(deploy_dir.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def deployments(deploy_dir: Path = DEPLOY_DIR) -> list[tuple[str, str]]:
    """(namespace, name) of every Deployment in ``deploy/``."""
    return [
        (d["metadata"].get("namespace", "default"), d["metadata"]["name"])
        for d in deploy_documents(deploy_dir)
        if d["kind"] == "Deployment"
    ]


def container_argv(
    deployment: str, env: dict[str, str], images: ImageMap | None = None
) -> list[str]:
    """The command line the node runs for a ``deploy/`` Deployment's first container (its
    image's entry point, its ``command``/``args``, ``$(VAR)`` expanded from ``env``): how a
    test starts a component by hand that must match the deployed one."""
    doc = next(
        d
        for d in deploy_documents()
        if d["kind"] == "Deployment" and d["metadata"]["name"] == deployment
    )
    container = doc["spec"]["template"]["spec"]["containers"][0]
    image = (images or ImageMap.load()).resolve(container["image"])
    argv = image.argv(container.get("command"), container.get("args"))
    return [expand(a, env) for a in argv]


def api_services(deploy_dir: Path = DEPLOY_DIR) -> list[str]:
    """Names of the APIServices in ``deploy/`` (the UploadTokenRequest API)."""
    return [
        d["metadata"]["name"] for d in deploy_documents(deploy_dir) if d["kind"] == "APIService"
    ]


@dataclass
class Product:
    """``crds/`` and ``deploy/`` applied to one cluster."""

    cluster: Cluster
    kubectl: Kubectl
    installed_in: float = 0.0

    @classmethod
    def on(cls, cluster: Cluster) -> Product:
        return cls(cluster, Kubectl.for_cluster(cluster))

    @property
    def kube(self) -> Kube:
        return self.cluster.kube()

    def install(self, timeout: float = 180, kustomize: bool = False) -> Product:
        """``kubectl apply -f crds/``, then ``deploy/`` with ``-f`` or, with ``kustomize``,
        ``-k`` (through ``deploy/Kustomization``, the README's install), and wait until it
        serves."""
        t0 = time.monotonic()
        self.apply_crds()
        self.kubectl("apply", "-k" if kustomize else "-f", str(DEPLOY_DIR))
        try:
            for ns, name in deployments():
                self.kubectl(
                    "-n", ns, "wait", "--for=condition=Available", f"deployment/{name}",
                    f"--timeout={int(timeout)}s", timeout=timeout + 10,
                )  # fmt: skip
            wait_until(self._webhook_refuses_probe, "the webhook to answer through its Service", 60)
            for name in api_services():
                wait_until(lambda n=name: self._api_service_available(n), f"APIService {name}", 60)
        except (KubectlFailed, TimeoutError, subprocess.TimeoutExpired) as e:
            raise ProductNotReady(f"{e}\n{self._pod_log_tails()}") from e
        self.installed_in = time.monotonic() - t0
        return self

    def _pod_log_tails(self, chars: int = 2000) -> str:
        """What the product's pods said, for a start-up that went wrong."""
        apps = {d["metadata"]["name"] for d in deploy_documents() if d["kind"] == "Deployment"}
        return "\n".join(f"=== {app}\n{self.log(app)[-chars:]}" for app in sorted(apps))

    def apply_crds(self) -> None:
        self.kubectl("apply", "-f", str(CRD_DIR))
        self.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD_DIR), timeout=70
        )

    def _api_service_available(self, name: str) -> bool:
        """The kube-apiserver reaches the aggregated API through its Service (the node's
        service proxy writes the EndpointSlice its availability check wants)."""
        svc = self.kube.get_or_none(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}") or {}
        conditions = (svc.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def _webhook_refuses_probe(self) -> bool:
        """A server-side dry run goes through admission: our webhook, reached by the API server
        through the Service's ClusterIP with the CA bundle our webhook patched in."""
        try:
            self.kubectl(
                "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(WEBHOOK_PROBE)
            )
        except KubectlFailed as e:
            return WEBHOOK_PROBE_MESSAGE in str(e)
        raise AssertionError("a DataVolume with two sources was admitted: webhook not called")

    # -- the controller's replicas ----------------------------------------------------------
    def pods(self, app: str) -> list[JSON]:
        listing = self.kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods", labelSelector=f"app={app}")
        return [p for p in listing["items"] if not p["metadata"].get("deletionTimestamp")]

    def lease(self) -> JSON:
        return self.kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}")

    def leader(self) -> str:
        """The controller pod holding the Lease (identity ``<hostname>_<id>``, and a pod's
        hostname is its name)."""
        holder = self.lease()["spec"].get("holderIdentity") or ""
        return str(holder).rsplit("_", 1)[0]

    def kill(self, pod: str) -> None:
        """SIGKILL every container of a pod: a crash, no graceful shutdown, no lease release.
        The node restarts them under the pod's restartPolicy, as a kubelet would. On a real
        node containerd delivers the signal (``ctr tasks kill``) to the container's init
        process; the kubelet sees it exit 137 and restarts it."""
        obj = self.kube.get(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}")
        for status in obj["status"].get("containerStatuses") or []:
            cid = str(status.get("containerID", ""))
            if cid.startswith("testkit://"):
                os.killpg(int(cid.removeprefix("testkit://")), signal.SIGKILL)
            elif cid.startswith("containerd://"):
                node = next(
                    n for n in self.cluster.realnodes if n.node_name == obj["spec"]["nodeName"]
                )
                argv = ["ctr", f"--address={node.containerd_socket}", "--namespace=k8s.io"]
                argv += ["tasks", "kill", "--signal=SIGKILL", cid.removeprefix("containerd://")]
                proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
                if proc.returncode:
                    raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")

    def log(self, app: str = CONTROLLER) -> str:
        """Every container log of every pod the app ever had on the node, oldest first."""
        real = self.cluster.realnodes
        roots = [n.pod_logs_dir for n in real] or [self.cluster.state / "node" / "pods"]
        dirs = sorted(
            (d for root in roots for d in root.glob(f"{NAMESPACE}_{app}-*")),
            key=lambda d: d.stat().st_mtime,
        )
        out = []
        for d in dirs:
            logs = d if real else d / "logs"
            for f in sorted(logs.glob("*/*.log"), key=lambda p: (p.parent, int(p.stem))):
                out.append(
                    f"--- {d.name}/{f.parent.name}/{f.name}\n{f.read_text(errors='replace')}"
                )
        return "".join(out)
