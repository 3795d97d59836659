"""Integration-test fixtures: one real cluster per session, one namespace per test.

The cluster is the one ``testkit`` builds from ``hack/kube`` (real etcd, kube-apiserver,
kube-controller-manager, kube-scheduler) with the local node and provisioner. If the binaries
are missing or a component does not start, every integration test errors: nothing is skipped.
"""

from __future__ import annotations

import re
import secrets
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.cluster import Cluster, ClusterConfig
from testkit.kubeclient import Kube
from testkit.waiting import wait_until

START_TIME = pytest.StashKey[float]()


@pytest.fixture(scope="session")
def cluster(pytestconfig: pytest.Config) -> Iterator[Cluster]:
    state = Path(tempfile.mkdtemp(prefix="testkit-"))
    c = Cluster(ClusterConfig(state_dir=state))
    c.start()
    pytestconfig.stash[START_TIME] = c.started_in
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="session")
def kube(cluster: Cluster) -> Kube:
    """JSON client acting as the cluster admin."""
    return cluster.kube()


@pytest.fixture
def namespace(cluster: Cluster, kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{slug}-{secrets.token_hex(3)}"
    kube.create(
        "/api/v1/namespaces",
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"testkit.local/test": "true"}},
        },
    )
    sa = f"/api/v1/namespaces/{name}/serviceaccounts/default"
    wait_until(lambda: kube.get_or_none(sa), f"default service account in {name}", 30)
    yield name
    kube.delete_ignore_missing(f"/api/v1/namespaces/{name}")


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    started = config.stash.get(START_TIME, None)
    if started is not None:
        terminalreporter.write_line(f"testkit cluster started in {started:.1f} s")
