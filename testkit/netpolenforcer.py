"""NetworkPolicies enforced for real on a real node (issue 26): the controller of
``sigs.k8s.io/kube-network-policies`` (built by hack/netpol/build.sh), run as a process inside
the cluster's network namespace, never on the host's network.

How it enforces: the process watches Pods, Namespaces and NetworkPolicies through the
cluster's admin kubeconfig (pod addresses from the API server) and reads an NFQUEUE: each packet
queued there gets the verdict of the policies that select its source pod (egress) and its
destination pod (ingress). Upstream also loads the rules that divert packets to that queue
itself, as an ``inet`` nftables table whose ``postrouting`` chain uses the nftables ``queue``
expression; this machine's kernel is built without it (``# CONFIG_NFT_QUEUE is not set`` in
``/proc/config.gz``, and no modules), so the kernel refuses that table (``netlink receive: no
such file or directory`` in the enforcer's log, every sync) and the harness diverts instead with
the xtables NFQUEUE target (``CONFIG_NETFILTER_XT_TARGET_NFQUEUE=y``), through the namespace's
``iptables``: a chain ``TESTKIT-NETPOL-<node>`` at the end of ``filter FORWARD`` (after
kube-proxy's rules) sends the first packet of every new forwarded connection to the queue. The
CNI bridge's traffic between pods passes ``FORWARD`` because the namespace turns on bridge
netfilter (:meth:`testkit.netns.NetNamespace.create`), and after kube-proxy's DNAT, so a
connection to a Service is judged against the pod it lands on. Upstream queues only the
connections of pods some policy selects; this queues every new pod-to-pod connection while the
enforcer runs (the verdict for an unselected pod is accept).

What it does not judge (upstream's design too, as most plugins): connections a process of the
node opens (the kubelet's probes, the API server calling a webhook or an aggregated API, a
test's client run with :meth:`testkit.cluster.Cluster.in_network`: they never pass
``FORWARD``), and a pod's connections to the node itself (the API server's address is a local
one: ``INPUT``). So on this harness the policies' ipBlock rules for the API server are loaded
but not exercised; pod-to-pod connections are.

Started only by the tests that need it (``with Enforcer(cluster): ...``): the diversion is
added once the process reads its queue, and :meth:`Enforcer.stop` removes it before stopping
the process (SIGTERM), then runs ``--cleanup`` (deletes upstream's nftables table, should a
kernel with ``nft_queue`` have taken it), so that no rule keeps queueing packets nobody reads
once the test is over and later tests on the cluster are unaffected.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from testkit.cluster import REPO_ROOT, Cluster
from testkit.procs import ManagedProcess
from testkit.realnode import RealNode, RealNodeMissing

DEFAULT_BINARY = REPO_ROOT / "hack" / "netpol" / "_build" / "kube-network-policies"
QUEUE_BASE = 100  # node i uses NFQUEUE 100 + i
TABLE_PREFIX = "testkit-netpol"  # node i's upstream nftables table: testkit-netpol-<i> (inet)
CHAIN_PREFIX = "TESTKIT-NETPOL"  # node i's iptables chain (filter): TESTKIT-NETPOL-<i>


class EnforcerFailed(RuntimeError):
    """The enforcer exited, did not bind its queue in time, or its table could not be removed;
    the message carries the tail of its log."""


@dataclass
class Enforcer:
    """One kube-network-policies process for one real node of ``cluster`` (the first by
    default). Nodes of one cluster share its network namespace, so each has its own queue and
    table."""

    cluster: Cluster
    node: RealNode | None = None
    binary: Path = DEFAULT_BINARY
    process: ManagedProcess | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.node is None:
            self.node = self.cluster.realnode
        if self.node is None or self.cluster.netns is None:
            raise EnforcerFailed("NetworkPolicies are enforced on a real node only (node='real')")

    @property
    def index(self) -> int:
        assert self.node is not None
        return self.node.index

    @property
    def queue(self) -> int:
        return QUEUE_BASE + self.index

    @property
    def table(self) -> str:
        return f"{TABLE_PREFIX}-{self.index}"

    @property
    def chain(self) -> str:
        return f"{CHAIN_PREFIX}-{self.index}"

    @property
    def log_path(self) -> Path:
        return self.cluster.state / "logs" / f"netpol-enforcer-{self.index}.log"

    def argv(self) -> list[str]:
        assert self.node is not None
        return [
            str(self.binary),
            f"--kubeconfig={self.cluster.kubeconfig}",
            f"--hostname-override={self.node.node_name}",
            f"--nfqueue-id={self.queue}",
            f"--nftables-table={self.table}",
            "--v=1",
        ]

    def start(self, timeout: float = 60) -> Enforcer:
        """Start it in the namespace and wait until it reads its queue: from then on every
        NetworkPolicy that selects a pod of the node is enforced (a few hundred ms after it is
        created)."""
        if not self.binary.is_file():
            raise RealNodeMissing(f"{self.binary} (run hack/netpol/build.sh)")
        self.process = ManagedProcess(
            f"netpol-enforcer-{self.index}", self.cluster.in_network(self.argv()), self.log_path
        )
        deadline = time.monotonic() + timeout
        while not self.bound():
            if self.process.proc.poll() is not None:
                raise EnforcerFailed(
                    f"kube-network-policies exited with {self.process.proc.returncode}:\n"
                    f"{self.process.log_tail()}"
                )
            if time.monotonic() > deadline:
                tail = self.process.log_tail()
                self.stop()
                raise EnforcerFailed(
                    f"kube-network-policies did not bind NFQUEUE {self.queue} in {timeout:.0f} s:"
                    f"\n{tail}"
                )
            time.sleep(0.2)
        try:
            self._iptables("-N", self.chain)
            self._iptables(
                "-A", self.chain, "-m", "conntrack", "--ctstate", "NEW",
                "-j", "NFQUEUE", "--queue-num", str(self.queue),
            )  # fmt: skip
            self._iptables("-A", "FORWARD", "-j", self.chain)
        except EnforcerFailed:
            self.stop()
            raise
        return self

    def _iptables(self, *args: str, check: bool = True) -> bool:
        """``iptables -w`` inside the namespace (the nft flavour: one transaction per call)."""
        proc = subprocess.run(
            self.cluster.in_network(["iptables", "-w", "5", *args]),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode and check:
            raise EnforcerFailed(f"iptables {' '.join(args)}: {proc.stderr.strip()}")
        return proc.returncode == 0

    def diverting(self) -> bool:
        """Whether ``FORWARD`` still jumps to this enforcer's chain."""
        return self._iptables("-C", "FORWARD", "-j", self.chain, check=False)

    def bound(self) -> bool:
        """Whether a process reads this enforcer's NFQUEUE (the namespace's
        ``/proc/net/netfilter/nfnetlink_queue``, read through the process's own ``/proc``)."""
        if self.process is None:
            return False
        path = Path(f"/proc/{self.process.pid}/net/netfilter/nfnetlink_queue")
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return False
        return any(line.split()[:1] == [str(self.queue)] for line in lines)

    def describe(self) -> str:
        """For a failed test: whether it runs and reads its queue, the queue's counters, the
        ``FORWARD`` rules and the tail of its log."""
        pid = self.process.pid if self.process else None
        queues = ""
        if pid is not None:
            try:
                queues = Path(f"/proc/{pid}/net/netfilter/nfnetlink_queue").read_text()
            except OSError as e:
                queues = str(e)
        rules = subprocess.run(
            self.cluster.in_network(["iptables", "-w", "5", "-S", "FORWARD"]),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
        running = self.process is not None and self.process.proc.poll() is None
        tail = self.process.log_tail(40) if self.process else ""
        return (
            f"enforcer running: {running}\nnfnetlink_queue:\n{queues}FORWARD:\n{rules}log:\n{tail}"
        )

    def alive(self) -> None:
        """Raise :class:`EnforcerFailed` if the process has exited."""
        if self.process is None or self.process.proc.poll() is not None:
            tail = self.process.log_tail() if self.process else ""
            raise EnforcerFailed(f"kube-network-policies is not running:\n{tail}")

    def stop(self) -> None:
        """Remove the diversion (no packet is queued once nobody reads the queue), stop the
        process, then remove upstream's table whatever happened."""
        while self.diverting():
            self._iptables("-D", "FORWARD", "-j", self.chain)
        if self._iptables("-L", self.chain, "-n", check=False):
            self._iptables("-F", self.chain)
            self._iptables("-X", self.chain)
        if self.process is not None:
            self.process.stop(grace=15)
            self.process = None
        proc = subprocess.run(
            self.cluster.in_network(
                [str(self.binary), "--cleanup", f"--nftables-table={self.table}"]
            ),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode:
            raise EnforcerFailed(f"removing nftables table {self.table}: {proc.stderr.strip()}")

    def __enter__(self) -> Enforcer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
