"""The testkit node: a kubelet stand-in that runs the pods bound to one Node as processes.

It registers a Node (capacity, Ready condition, ``kubernetes.io/hostname`` label, no taints),
then loops: list the pods bound to it, and for each pod build its volumes, start its init
containers one by one and then its containers, restart them under ``restartPolicy`` with a
back-off, run readiness and liveness probes, and write a kubelet-like status whenever it
changes. Deletion sends SIGTERM to every container's process group, SIGKILL after the grace
period, and then removes the pod object, as a kubelet does.

Each pod gets its own loopback address from ``--pod-cidr`` (e.g. 127.10.x.y) as pod IP;
servers in pods bind to it (the downward API exposes it as ``status.podIP``). Service
ClusterIPs are loopback addresses too and ``testkit.serviceproxy`` forwards them to ready pods.
Logs are plain files under
``<state>/pods/<namespace>_<name>_<uid>/logs/<container>/<restartCount>.log``.

The loop polls the API server (a few list calls a second) instead of keeping watches: every
pass re-reads the pods, so it is level-triggered and never misses an event.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import shutil
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.containers import (
    DEFAULT_TERMINATION_PATH,
    ContainerProcess,
    ContainerRuntime,
    LaunchSpec,
    Probe,
    now_rfc3339,
)
from testkit.images import DEFAULT_MAP, Image, ImageMap, UnknownImage
from testkit.kubeclient import JSON, STRATEGIC_PATCH, ApiError, Kube, ns_path
from testkit.podenv import NotReady, PodFacts, base_env, container_env, expand, pod_hostname
from testkit.podvolumes import KubeLookup, Volume, VolumeBuilder, container_binds
from testkit.runtime import ImageRuntime, PulledImage
from testkit.serviceproxy import ServiceProxy

log = logging.getLogger("testkit.node")

MARKER_ENV = "TESTKIT_NODE_STATE"  # set in every container: lets the harness find strays
HEARTBEAT_SECONDS = 10.0
DEFAULT_POD_CIDR = "127.1.0.0/16"


@dataclass(frozen=True)
class NodeConfig:
    name: str
    state_dir: Path
    api_port: int
    images: ImageMap
    pod_cidr: str = DEFAULT_POD_CIDR
    mount_point_record: Path | None = None  # default: <state>/created-mount-points
    poll_interval: float = 0.2
    insecure_registries: tuple[str, ...] = ()  # besides loopback ones (testkit.runtime)


@dataclass
class PodRuntime:
    pod: JSON
    ip: str
    dir: Path
    init: list[ContainerRuntime]
    containers: list[ContainerRuntime]
    start_time: str = field(default_factory=now_rfc3339)
    volumes: dict[str, Volume] | None = None
    conditions: dict[str, tuple[str, str]] = field(default_factory=dict)
    last_status: JSON | None = None
    kill_at: float | None = None

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])

    @property
    def key(self) -> str:
        return f"{self.pod['metadata']['namespace']}/{self.pod['metadata']['name']}"

    @property
    def restart_policy(self) -> str:
        return str(self.pod["spec"].get("restartPolicy") or "Always")

    def all(self) -> list[ContainerRuntime]:
        return self.init + self.containers


# -- status: pure functions of a PodRuntime ---------------------------------------------------
def pod_phase(rt: PodRuntime) -> str:
    for c in rt.init:
        if c.done and c.last_exit is not None and c.last_exit.code != 0:
            return "Failed"
        if not c.done:
            return "Pending"
    if not any(c.running or c.last_exit for c in rt.containers):
        return "Pending"
    if all(c.done for c in rt.containers):
        ok = all(c.last_exit is not None and c.last_exit.code == 0 for c in rt.containers)
        return "Succeeded" if ok else "Failed"
    return "Running"


def _condition(rt: PodRuntime, ctype: str, ok: bool, reason: str = "") -> JSON:
    status = "True" if ok else "False"
    prev = rt.conditions.get(ctype)
    when = prev[1] if prev and prev[0] == status else now_rfc3339()
    rt.conditions[ctype] = (status, when)
    cond: JSON = {
        "type": ctype,
        "status": status,
        "lastTransitionTime": when,
        "lastProbeTime": None,
    }
    if reason and not ok:
        cond["reason"] = reason
    return cond


def render_status(rt: PodRuntime) -> JSON:
    phase = pod_phase(rt)
    initialized = all(c.done and c.last_exit and c.last_exit.code == 0 for c in rt.init)
    ready = phase == "Running" and all(c.ready for c in rt.containers)
    not_ready = "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady"
    conditions = [
        _condition(rt, "PodReadyToStartContainers", rt.volumes is not None),
        _condition(rt, "Initialized", initialized, "ContainersNotInitialized"),
        _condition(rt, "ContainersReady", ready, not_ready),
        _condition(rt, "Ready", ready, not_ready),
    ]
    status: JSON = {
        "phase": phase,
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": rt.ip,
        "podIPs": [{"ip": rt.ip}],
        "startTime": rt.start_time,
        "containerStatuses": [c.status() for c in rt.containers],
    }
    if rt.init:
        status["initContainerStatuses"] = [c.status() for c in rt.init]
    return status


# -- the agent --------------------------------------------------------------------------------
class NodeAgent:
    def __init__(self, kube: Kube, config: NodeConfig) -> None:
        self.kube = kube
        self.config = config
        self.lookup = KubeLookup(kube)
        self.pods: dict[str, PodRuntime] = {}
        self.probes = ThreadPoolExecutor(max_workers=4, thread_name_prefix="probe")
        self.pods_dir = config.state_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self._last_heartbeat = 0.0
        self.proxy = ServiceProxy(kube)  # also writes the served Services' EndpointSlices
        self.version = "v0.0.0"
        # Images the map does not know are pulled for real (testkit.runtime).
        self.runtime = ImageRuntime(config.state_dir / "images", config.insecure_registries)

    # -- node object ------------------------------------------------------------------------
    def register(self) -> None:
        name = self.config.name
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                },
            },
        }
        try:
            self.kube.create("/api/v1/nodes", node)
        except ApiError as e:
            if not e.conflict:
                raise
        self.version = str(self.kube.get("/version").get("gitVersion", "v0.0.0"))
        self.heartbeat(force=True)
        # TaintNodesByCondition admission adds not-ready taints at creation; the node-lifecycle
        # controller (not run here) would lift them once Ready, so the node does it itself.
        self.kube.patch(f"/api/v1/nodes/{name}", {"spec": {"taints": None}})

    def _node_status(self) -> JSON:
        cpus = str(os.cpu_count() or 1)
        mem_kib = 0
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_kib = int(line.split()[1])
        disk = shutil.disk_usage(self.config.state_dir)
        resources = {
            "cpu": cpus,
            "memory": f"{mem_kib}Ki",
            "pods": "110",
            "ephemeral-storage": str(disk.total),
        }
        now = now_rfc3339()

        def cond(ctype: str, status: str, reason: str) -> JSON:
            return {
                "type": ctype,
                "status": status,
                "reason": reason,
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
                "message": "testkit node",
            }

        return {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID"),
                cond("Ready", "True", "KubeletReady"),
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.config.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": "testkit",
                "systemUUID": "testkit",
                "bootID": "testkit",
                "kernelVersion": os.uname().release,
                "osImage": "testkit local node",
                "containerRuntimeVersion": "testkit://1",
                "kubeletVersion": self.version,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    def heartbeat(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_heartbeat < HEARTBEAT_SECONDS:
            return
        self.kube.patch(
            f"/api/v1/nodes/{self.config.name}/status",
            {"status": self._node_status()},
            STRATEGIC_PATCH,
        )
        self._last_heartbeat = time.monotonic()

    # -- loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        self.register()
        while not stop.is_set():
            try:
                self.sync_once()
                self.heartbeat()
            except Exception:
                log.exception("sync failed; retrying")
            stop.wait(self.config.poll_interval)
        self.shutdown()

    def sync_once(self) -> None:
        listing = self.kube.get("/api/v1/pods", fieldSelector=f"spec.nodeName={self.config.name}")
        seen = set()
        for pod in listing["items"]:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            rt = self.pods.get(uid)
            if rt is None:
                if pod["metadata"].get("deletionTimestamp"):
                    self._remove_pod_object(pod)
                    continue
                if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                    continue  # finished before this agent started: never run twice
                rt = self._admit(pod)
            rt.pod = pod
            try:
                self.sync_pod(rt)
            except ApiError as e:
                log.warning("pod %s: %s", rt.key, e)
        for uid in list(self.pods):
            if uid not in seen:  # force-deleted behind our back
                self._kill_now(self.pods.pop(uid))
        self.proxy.sync(self.kube.get("/api/v1/services")["items"], listing["items"])

    def _admit(self, pod: JSON) -> PodRuntime:
        meta = pod["metadata"]
        d = self.pods_dir / f"{meta['namespace']}_{meta['name']}_{meta['uid']}"
        d.mkdir(parents=True, exist_ok=True)
        spec = pod["spec"]
        rt = PodRuntime(
            pod=pod,
            ip=self._allocate_ip(),
            dir=d,
            init=[ContainerRuntime(c, init=True) for c in spec.get("initContainers") or []],
            containers=[ContainerRuntime(c) for c in spec.get("containers") or []],
        )
        self.pods[meta["uid"]] = rt
        log.info("admitted pod %s with IP %s", rt.key, rt.ip)
        return rt

    def _allocate_ip(self) -> str:
        used = {rt.ip for rt in self.pods.values()}
        for ip in ipaddress.IPv4Network(self.config.pod_cidr).hosts():
            if str(ip) not in used and int(ip) & 0xFF not in (0, 1, 255):
                return str(ip)
        raise RuntimeError(f"pod CIDR {self.config.pod_cidr} is exhausted")

    # -- one pod ----------------------------------------------------------------------------
    def sync_pod(self, rt: PodRuntime) -> None:
        if rt.pod["metadata"].get("deletionTimestamp"):
            self._terminate(rt)
            return
        if pod_phase(rt) not in ("Succeeded", "Failed"):
            self._progress(rt)
        self._write_status(rt)

    def _progress(self, rt: PodRuntime) -> None:
        if rt.volumes is None:
            try:
                facts = PodFacts(rt.pod, rt.ip)
                rt.volumes = VolumeBuilder(self.kube, self.lookup, facts, rt.dir).build_all()
            except NotReady as e:
                for c in rt.all():
                    c.waiting_reason, c.waiting_message = e.reason, e.message
                return
        for c in rt.init:
            if c.done:
                continue
            self._step(rt, c)
            return  # init containers run one at a time, in order
        for c in rt.containers:
            self._step(rt, c)
            if self.runtime.pulling(str(c.spec.get("image", ""))):
                return  # as a kubelet: the next container starts once this image is pulled

    def _step(self, rt: PodRuntime, c: ContainerRuntime) -> None:
        if c.proc is not None:
            ex = c.proc.poll()
            if ex is None:
                if c.probe is not None:
                    c.probe.step(self.probes, rt.ip, c.spec, c.proc.pid)
                if c.liveness is not None:
                    c.liveness.step(self.probes, rt.ip, c.spec, c.proc.pid)
                    if c.liveness.failed:
                        log.info("pod %s container %s failed liveness: killing", rt.key, c.name)
                        c.proc.signal(signal.SIGKILL)
                        c.liveness = None
                return
            log.info("pod %s container %s exited %d", rt.key, c.name, ex.code)
            c.record_exit(ex, rt.restart_policy)
        if c.done or time.monotonic() < c.next_start:
            return
        try:
            launch = self._launch_spec(rt, c)
        except (NotReady, UnknownImage) as e:
            reason = e.reason if isinstance(e, NotReady) else "ErrImagePull"
            c.waiting_reason, c.waiting_message = reason, str(e)
            return
        if c.starts:
            c.restart_count += 1
        c.starts += 1
        c.proc = ContainerProcess(launch)
        c.waiting_reason, c.waiting_message = "", ""
        probe, liveness = c.spec.get("readinessProbe"), c.spec.get("livenessProbe")
        c.probe = Probe(probe) if probe else None
        c.liveness = Probe(liveness) if liveness else None
        log.info("pod %s container %s started pid %d", rt.key, c.name, c.proc.pid)

    def _image(self, c: ContainerRuntime) -> tuple[Image, PulledImage | None]:
        """The map's stand-in for the image, else the image pulled for real."""
        ref = str(c.spec.get("image", ""))
        try:
            return self.config.images.resolve(ref), None
        except UnknownImage:
            pulled = self.runtime.get(ref, always=c.spec.get("imagePullPolicy") == "Always")
            return pulled.image, pulled

    def _launch_spec(self, rt: PodRuntime, c: ContainerRuntime) -> LaunchSpec:
        image, pulled = self._image(c)
        facts = PodFacts(rt.pod, rt.ip)
        base = base_env(rt.pod, image.env, self.config.api_port)
        base[MARKER_ENV] = str(self.config.state_dir)
        env = container_env(c.spec, facts, base, self.lookup)

        argv = [expand(a, env) for a in image.argv(c.spec.get("command"), c.spec.get("args"))]
        if not argv:
            raise NotReady("CreateContainerError", "no command to run")
        assert rt.volumes is not None
        security = c.spec.get("securityContext") or {}
        launch = LaunchSpec(
            argv=argv,
            env=env,
            workdir=c.spec.get("workingDir") or image.workdir,
            binds=container_binds(c.spec, rt.volumes),
            log_path=rt.dir / "logs" / c.name / f"{c.restart_count + (1 if c.starts else 0)}.log",
            termination_host_path=rt.dir / "containers" / c.name / "termination-log",
            termination_path=c.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH,
            fallback_to_logs=c.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError",
            record_path=self.config.mount_point_record
            or self.config.state_dir / "created-mount-points",
            hostname=pod_hostname(rt.pod),
            read_only_root=security.get("readOnlyRootFilesystem") is True,
        )
        if pulled is None:
            return launch
        c.image_id = pulled.image_id
        return self.runtime.contain(launch, pulled)

    def _write_status(self, rt: PodRuntime) -> None:
        status = render_status(rt)
        if status == rt.last_status:
            return
        meta = rt.pod["metadata"]
        self.kube.patch(
            ns_path(meta["namespace"], "pods", meta["name"], "status"),
            {"metadata": {"uid": meta["uid"]}, "status": status},
            STRATEGIC_PATCH,
        )
        rt.last_status = status

    # -- deletion ---------------------------------------------------------------------------
    def _terminate(self, rt: PodRuntime) -> None:
        now = time.monotonic()
        if rt.kill_at is None:
            grace = rt.pod["metadata"].get("deletionGracePeriodSeconds")
            grace = 30 if grace is None else int(grace)
            rt.kill_at = now + grace
            log.info("pod %s deleted: SIGTERM, grace %d s", rt.key, grace)
            for c in rt.all():
                if c.proc is not None:
                    c.proc.signal(signal.SIGTERM)
        for c in rt.all():
            if c.proc is not None:
                ex = c.proc.poll()
                if ex is not None:
                    c.record_exit(ex, "Never")
                elif now >= rt.kill_at:
                    c.proc.signal(signal.SIGKILL)
        if any(c.proc is not None for c in rt.all()):
            return
        self._remove_pod_object(rt.pod)
        self._cleanup(rt)
        self.pods.pop(rt.uid, None)

    def _remove_pod_object(self, pod: JSON) -> None:
        meta = pod["metadata"]
        body = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        try:
            self.kube.delete(ns_path(meta["namespace"], "pods", meta["name"]), body)
        except ApiError as e:
            if not (e.not_found or e.conflict):
                raise

    def _kill_now(self, rt: PodRuntime) -> None:
        for c in rt.all():
            if c.proc is not None:
                c.proc.signal(signal.SIGKILL)
                with contextlib.suppress(Exception):
                    c.proc.proc.wait(timeout=5)
        self._cleanup(rt)

    def _cleanup(self, rt: PodRuntime) -> None:
        """Drop the pod's materialized volumes (secrets); keep logs for the tests."""
        shutil.rmtree(rt.dir / "volumes", ignore_errors=True)

    def shutdown(self) -> None:
        """Stop every container: SIGTERM, up to 5 s, then SIGKILL."""
        running = [c for rt in self.pods.values() for c in rt.all() if c.proc is not None]
        for c in running:
            assert c.proc is not None
            c.proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5
        for c in running:
            assert c.proc is not None
            with contextlib.suppress(Exception):
                c.proc.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            c.proc.signal(signal.SIGKILL)
            with contextlib.suppress(Exception):
                c.proc.proc.wait(timeout=5)
        self.probes.shutdown(wait=False, cancel_futures=True)
        self.proxy.close()
        self.runtime.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--node-name", required=True)
    parser.add_argument("--api-port", type=int, required=True)
    parser.add_argument("--ca-file", type=Path)
    parser.add_argument("--images", type=Path, default=DEFAULT_MAP)
    parser.add_argument("--pod-cidr", default=DEFAULT_POD_CIDR)
    parser.add_argument(
        "--mount-point-record", type=Path, help="file listing mount points created on the host"
    )
    parser.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        help="host[:port] pulled without TLS checks (loopback ones always are)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    stop = threading.Event()

    def on_signal(*_: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    config = NodeConfig(
        args.node_name,
        args.state_dir,
        args.api_port,
        ImageMap.load(args.images),
        pod_cidr=args.pod_cidr,
        mount_point_record=args.mount_point_record,
        insecure_registries=tuple(args.insecure_registry),
    )
    NodeAgent(Kube.from_kubeconfig(args.kubeconfig), config).run(stop)


if __name__ == "__main__":
    main()
