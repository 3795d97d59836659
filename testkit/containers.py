"""One container as a process on the node: start, exit, signals, logs, termination message,
restart back-off, readiness and liveness probes.

A container runs as ``unshare --mount --uts --propagation private -- mountns.sh <binds> -- argv``
in a new session (its own process group): the wrapper bind-mounts the pod's volumes in the
private mount namespace, sets the pod's hostname in its own UTS namespace (as a kubelet does, so
``gethostname()`` names the pod) and execs the command with the same PID, so signals reach it
directly and the host's mounts and name never change. A container with
``readOnlyRootFilesystem`` sees the root read-only, as under a kubelet: it writes only to its
volumes, never to the host's files. stdout and stderr go to
``logs/<container>/<restartCount>.log``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.podvolumes import Bind

JSON = dict[str, Any]
MOUNTNS = Path(__file__).with_name("mountns.sh")
REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
MAX_MESSAGE = 4096
BACKOFF_START = 1.0  # a kubelet starts at 10 s; tests want restarts promptly
BACKOFF_MAX = 10.0


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Exit:
    code: int
    started_at: str
    finished_at: str
    message: str = ""
    signal: int = 0

    @property
    def reason(self) -> str:
        return "Completed" if self.code == 0 else "Error"

    def as_state(self, container_id: str) -> JSON:
        term: JSON = {
            "exitCode": self.code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": container_id,
        }
        if self.message:
            term["message"] = self.message
        if self.signal:
            term["signal"] = self.signal
        return {"terminated": term}


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    workdir: str
    binds: list[Bind]
    log_path: Path
    termination_host_path: Path
    termination_path: str
    fallback_to_logs: bool
    record_path: Path  # the wrapper lists here the mount points it had to create on the host
    hostname: str = ""  # the pod's hostname (its name, or spec.hostname); empty: the host's
    read_only_root: bool = False  # securityContext.readOnlyRootFilesystem: only volumes writable


class ContainerProcess:
    """A started container process."""

    def __init__(self, spec: LaunchSpec) -> None:
        self.spec = spec
        self.started_at = now_rfc3339()
        spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        spec.termination_host_path.parent.mkdir(parents=True, exist_ok=True)
        spec.termination_host_path.write_bytes(b"")
        # setpriv: a container dies with the node agent that started it, like pods whose
        # kubelet and runtime went away.
        argv = ["setpriv", "--pdeathsig", "KILL", "--"]
        argv += ["unshare", "--mount", "--uts", "--propagation", "private", "--"]
        argv += ["/bin/sh", str(MOUNTNS), "--record", str(spec.record_path)]
        if spec.hostname:
            argv += ["--hostname", spec.hostname]
        for keep in dict.fromkeys((str(REPO_ROOT), sys.prefix, sys.base_prefix)):
            argv += ["--keep", keep]
        for b in spec.binds:
            if b.device:
                argv += ["--dev", str(b.src), b.dst]
            else:
                argv += ["--bind", str(b.src), b.dst, "ro" if b.read_only else "rw"]
        argv += ["--bind", str(spec.termination_host_path), spec.termination_path, "rw"]
        if spec.read_only_root:
            argv += ["--read-only-root"]
        argv += ["--workdir", spec.workdir, "--", *spec.argv]
        with open(spec.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=spec.env,
                start_new_session=True,
                close_fds=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def container_id(self) -> str:
        return f"testkit://{self.proc.pid}"

    def poll(self) -> Exit | None:
        code = self.proc.poll()
        if code is None:
            return None
        sig = -code if code < 0 else 0
        exit_code = 128 + sig if sig else code
        return Exit(exit_code, self.started_at, now_rfc3339(), self._message(exit_code), sig)

    def _message(self, code: int) -> str:
        try:
            data = self.spec.termination_host_path.read_bytes()[:MAX_MESSAGE]
        except OSError:
            data = b""
        if not data and code != 0 and self.spec.fallback_to_logs:
            try:
                lines = self.spec.log_path.read_bytes().splitlines()[-80:]
                data = b"\n".join(lines)[-2048:]
            except OSError:
                data = b""
        return data.decode(errors="replace")

    def signal(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


@dataclass
class Probe:
    """Readiness probe state: thresholds as in Kubernetes, checks run on a thread pool."""

    spec: JSON
    created: float = field(default_factory=time.monotonic)
    last_run: float = 0.0
    successes: int = 0
    failures: int = 0
    ready: bool = False
    pending: Future[bool] | None = None

    @property
    def failed(self) -> bool:
        """For a liveness probe: failureThreshold consecutive failures."""
        return self.failures >= int(self.spec.get("failureThreshold", 3))

    def step(self, pool: ThreadPoolExecutor, pod_ip: str, container: JSON, pid: int | None) -> None:
        if self.pending is not None:
            if not self.pending.done():
                return
            ok = bool(self.pending.result())
            self.pending = None
            if ok:
                self.successes, self.failures = self.successes + 1, 0
                if self.successes >= int(self.spec.get("successThreshold", 1)):
                    self.ready = True
            else:
                self.failures, self.successes = self.failures + 1, 0
                if self.failures >= int(self.spec.get("failureThreshold", 3)):
                    self.ready = False
        now = time.monotonic()
        if now - self.created < float(self.spec.get("initialDelaySeconds", 0)):
            return
        if self.last_run and now - self.last_run < float(self.spec.get("periodSeconds", 10)):
            return
        self.last_run = now
        self.pending = pool.submit(run_probe, self.spec, pod_ip, container, pid)


def _port(value: Any, container: JSON) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for p in container.get("ports") or []:
        if p.get("name") == value:
            return int(p["containerPort"])
    raise ValueError(f"no container port named {value}")


def run_probe(spec: JSON, pod_ip: str, container: JSON, pid: int | None) -> bool:
    timeout = float(spec.get("timeoutSeconds", 1))
    try:
        if "httpGet" in spec:
            g = spec["httpGet"]
            scheme = str(g.get("scheme", "HTTP")).lower()
            host = g.get("host") or pod_ip
            url = f"{scheme}://{host}:{_port(g['port'], container)}{g.get('path', '/')}"
            req = urllib.request.Request(url)
            for h in g.get("httpHeaders") or []:
                req.add_header(h["name"], h["value"])
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE  # kubelet probes skip certificate checks too
            try:
                with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
                    return 200 <= resp.status < 400
            except urllib.error.HTTPError as e:
                return 200 <= e.code < 400
        if "tcpSocket" in spec:
            t = spec["tcpSocket"]
            with socket.create_connection(
                (t.get("host") or pod_ip, _port(t["port"], container)), timeout=timeout
            ):
                return True
        if "exec" in spec:
            if pid is None:
                return False
            cmd = ["nsenter", "--mount", f"--target={pid}", "--", *spec["exec"]["command"]]
            proc = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
            return proc.returncode == 0
    except (OSError, ValueError, subprocess.TimeoutExpired, urllib.error.URLError):
        return False
    return False


@dataclass
class ContainerRuntime:
    """What the node knows about one container of a pod across its restarts."""

    spec: JSON
    init: bool = False
    proc: ContainerProcess | None = None
    restart_count: int = 0
    starts: int = 0
    last_exit: Exit | None = None
    prev_exit: Exit | None = None
    done: bool = False
    waiting_reason: str = "ContainerCreating"
    waiting_message: str = ""
    next_start: float = 0.0
    backoff: float = BACKOFF_START
    probe: Probe | None = None
    liveness: Probe | None = None
    last_container_id: str = ""
    image_id: str = ""  # <repo>@sha256:... once the node pulled the image (testkit.runtime)

    @property
    def name(self) -> str:
        return str(self.spec["name"])

    @property
    def running(self) -> bool:
        return self.proc is not None

    @property
    def ready(self) -> bool:
        if not self.running:
            return False
        return self.probe.ready if self.probe is not None else True

    def record_exit(self, ex: Exit, restart_policy: str) -> None:
        """Note an exit and decide, per ``restartPolicy``, whether the container runs again."""
        self.last_container_id = self.proc.container_id if self.proc else ""
        self.proc = None
        self.prev_exit, self.last_exit = self.last_exit, ex
        self.probe = None
        self.liveness = None
        again = restart_policy == "Always" or (restart_policy == "OnFailure" and ex.code != 0)
        if self.init and ex.code == 0:
            again = False
        if again:
            self.next_start = time.monotonic() + self.backoff
            self.backoff = min(self.backoff * 2, BACKOFF_MAX)
            self.waiting_reason = "CrashLoopBackOff"
            self.waiting_message = f"back-off {self.backoff:.0f}s restarting failed container"
        else:
            self.done = True

    def status(self) -> JSON:
        st: JSON = {
            "name": self.name,
            "image": self.spec.get("image", ""),
            "imageID": self.image_id or self.spec.get("image", ""),
            "ready": self.ready,
            "restartCount": self.restart_count,
            "started": self.running,
            "lastState": {},
        }
        if self.proc is not None:
            st["containerID"] = self.proc.container_id
            st["state"] = {"running": {"startedAt": self.proc.started_at}}
            if self.last_exit:
                st["lastState"] = self.last_exit.as_state(self.last_container_id)
        elif self.done and self.last_exit is not None:
            st["containerID"] = self.last_container_id
            st["state"] = self.last_exit.as_state(self.last_container_id)
            if self.prev_exit:
                st["lastState"] = self.prev_exit.as_state(self.last_container_id)
        else:
            waiting: JSON = {"reason": self.waiting_reason}
            if self.waiting_message:
                waiting["message"] = self.waiting_message
            st["state"] = {"waiting": waiting}
            if self.last_exit:
                st["lastState"] = self.last_exit.as_state(self.last_container_id)
        return st


def remove_created_mount_points(records: list[Path]) -> None:
    """Remove the empty directories and empty placeholder files that containers had to create
    on the host as mount points (listed by mountns.sh), deepest first. Anything that is no
    longer empty was not ours alone and stays."""
    paths: set[str] = set()
    for rec in records:
        with contextlib.suppress(OSError):
            paths.update(p for p in rec.read_text().splitlines() if p.startswith("/"))
    for p in sorted(paths, key=lambda x: x.count("/"), reverse=True):
        path = Path(p)
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
