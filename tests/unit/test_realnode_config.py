"""The real node's pure parts: the node kind's default, the pause image layout, the product
image names and the configuration files (issue 24). The node itself runs in
tests/integration/test_real_node.py."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import tomllib
from pathlib import Path

import pytest
import yaml

from testkit import realnode
from testkit.cluster import ClusterConfig
from testkit.netns import NetNamespace


def test_node_kind_defaults_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESTKIT_NODE", raising=False)
    assert ClusterConfig(state_dir=Path("/x")).node == "process"
    monkeypatch.setenv("TESTKIT_NODE", "real")
    assert ClusterConfig(state_dir=Path("/x")).real_node
    assert ClusterConfig(state_dir=Path("/x"), node="process").node == "process"
    monkeypatch.setenv("TESTKIT_NODE", "virtual")
    with pytest.raises(ValueError, match="virtual"):
        ClusterConfig(state_dir=Path("/x"))


def test_pause_layout_is_one_deterministic_layer_holding_the_binary(tmp_path: Path) -> None:
    binary = tmp_path / "pause"
    binary.write_bytes(b"\x7fELF not really")
    a, b = tmp_path / "a", tmp_path / "b"
    realnode.write_pause_layout(binary, a)
    realnode.write_pause_layout(binary, b)
    assert (a / "index.json").read_bytes() == (b / "index.json").read_bytes()
    index = json.loads((a / "index.json").read_text())
    (entry,) = index["manifests"]
    assert entry["annotations"]["org.opencontainers.image.ref.name"] == "pause"

    def blob(digest: str) -> bytes:
        data = (a / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest.removeprefix("sha256:")
        return data

    manifest = json.loads(blob(entry["digest"]))
    config = json.loads(blob(manifest["config"]["digest"]))
    assert config["config"]["Entrypoint"] == ["/pause"]
    (layer,) = manifest["layers"]
    raw = gzip.decompress(blob(layer["digest"]))
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(raw).hexdigest()]
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        member = tar.getmember("pause")
        assert member.mode == 0o755
        f = tar.extractfile(member)
        assert f is not None and f.read() == binary.read_bytes()


def test_product_images_keep_the_names_deploy_pulls(tmp_path: Path) -> None:
    refs = ["cdi-base", "cdi-controller", "cdi-importer", "other"]
    index = {"manifests": [{"annotations": {"org.opencontainers.image.ref.name": r}} for r in refs]}
    (tmp_path / "index.json").write_text(json.dumps(index))
    assert realnode.product_image_refs(tmp_path) == {
        "cdi-base": "quay.io/cdi-py/cdi-base:latest",
        "cdi-controller": "quay.io/cdi-py/cdi-controller:latest",
        "cdi-importer": "quay.io/cdi-py/cdi-importer:latest",
    }
    deploy = (Path(__file__).parents[2] / "deploy" / "20-controller.yaml").read_text()
    assert "quay.io/cdi-py/cdi-controller:latest" in deploy


def test_missing_parts_name_the_command_that_provides_them(tmp_path: Path) -> None:
    missing = realnode.missing_parts(tmp_path / "bin", tmp_path / "no-images", tmp_path / "csi")
    assert f"{tmp_path / 'bin' / 'kubelet'} (run hack/kube/build.sh)" in missing
    assert f"{tmp_path / 'no-images'} (run scripts/images.sh)" in missing
    assert f"{tmp_path / 'csi'} (run hack/csinode/build.sh)" in missing


def test_the_csi_node_plugin_listens_where_the_kubelet_of_its_node_looks(tmp_path: Path) -> None:
    node = realnode.RealNode(
        state=tmp_path,
        netns=NetNamespace("testkit-rn-unit"),
        bin_dir=tmp_path / "bin",
        node_name="n2",
        kubeconfig=tmp_path / "kubeconfig",
        ca_path=tmp_path / "ca.crt",
        cgroup_name="testkit-rn-unit-2",
        images_dir=None,
        index=1,
    )
    argv = node.csi_node_argv(Path("/bin/plugin"), tmp_path / "storage" / "volumes")
    kubelet = tmp_path / "realnode-2" / "kubelet"
    assert argv == [
        "/bin/plugin",
        "--node-id=n2",
        f"--endpoint={kubelet / 'plugins' / 'loop.testkit.local' / 'csi.sock'}",
        f"--registration-socket={kubelet / 'plugins_registry' / 'loop.testkit.local-reg.sock'}",
        f"--volumes-dir={tmp_path / 'storage' / 'volumes'}",
    ]
    assert f"--root-dir={kubelet}" in node.kubelet_argv()


def test_configs_hold_the_settings_that_made_the_kubelet_run(tmp_path: Path) -> None:
    node = realnode.RealNode(
        state=tmp_path,
        netns=NetNamespace("testkit-rn-unit"),
        bin_dir=tmp_path / "bin",
        node_name="n1",
        kubeconfig=tmp_path / "kubeconfig",
        ca_path=tmp_path / "ca.crt",
        cgroup_name="testkit-rn-unit",
        images_dir=None,
    )
    node.write_configs(10248, (10256, 10249))
    root = tmp_path / "realnode"
    kubelet = yaml.safe_load((root / "kubelet.yaml").read_text())
    assert kubelet["failCgroupV1"] is False
    assert kubelet["oomScoreAdj"] == 0
    assert kubelet["resolvConf"] == ""
    assert kubelet["cgroupRoot"] == "/testkit-rn-unit"
    assert kubelet["authentication"]["anonymous"]["enabled"] is False
    ctr = tomllib.loads((root / "containerd" / "config.toml").read_text())
    cri = ctr["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["device_ownership_from_security_context"] is True
    assert cri["sandbox_image"] == realnode.PAUSE_IMAGE
    assert all(str(tmp_path) in ctr[k] for k in ("root", "state"))
    for host in realnode.MIRRORED:
        hosts = tomllib.loads((root / "containerd" / "certs.d" / host / "hosts.toml").read_text())
        assert hosts["server"] == f"http://{realnode.REGISTRY}"
        assert list(hosts["host"]) == [f"http://{realnode.REGISTRY}"]
    cni = json.loads((root / "cni" / "net.d" / "10-testkit.conflist").read_text())
    assert cni["plugins"][0]["ipam"]["ranges"] == [[{"subnet": realnode.node_pod_cidr(0)}]]
    assert cni["plugins"][0]["bridge"] == "cni0"


def test_several_nodes_only_real_and_named_in_order() -> None:
    config = ClusterConfig(state_dir=Path("/x"), node="real", nodes=3)
    assert config.node_names == ["testkit-node", "testkit-node-2", "testkit-node-3"]
    with pytest.raises(ValueError, match="node='real'"):
        ClusterConfig(state_dir=Path("/x"), node="process", nodes=2)
    with pytest.raises(ValueError):
        ClusterConfig(state_dir=Path("/x"), node="real", nodes=0)
    assert realnode.node_ip(1) == "10.243.0.2"
    assert realnode.node_pod_cidr(1) == "10.244.1.0/24"
