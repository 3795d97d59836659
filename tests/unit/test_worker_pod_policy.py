"""The controller's pod policy (deploy/15-admission-policy.yaml) and the renderers stay in step:
every environment variable any worker pod may carry matches the policy's ``envNames`` allow-list
(N9), and no renderer sets what the policy refuses outright (another command, args, a working
directory, lifecycle hooks, exec probes, env from a Secret). The real API server runs the whole
policy against the same pods in tests/integration/datavolumes/test_admission_policy.py; this
catches a renderer that grows a new variable without the policy, in seconds."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.api.config import CDIConfig
from cdi.api.types import DataVolume
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.worker_pod import Metrics
from tests.worker_pods import IMPORTER_IMAGE, claim_of, worker_pods

POLICY = Path(__file__).resolve().parents[2] / "deploy" / "15-admission-policy.yaml"
ALLOWED_COMMANDS = ([], ["python", "-m", "importer"], ["/shared/cdi-holder"])

SOURCES = {
    "http": {
        "url": "http://h/d.img",
        "secretRef": "s",
        "certConfigMap": "c",
        "extraHeaders": ["X-A: 1"],
        "secretExtraHeaders": ["h"],
        "checksum": "sha256:" + "0" * 64,
    },
    "s3": {"url": "http://h/b/d.img", "secretRef": "s", "certConfigMap": "c"},
    "gcs": {"url": "gs://b/d.img", "secretRef": "s"},
    "registry": {"url": "docker://r/i:1", "secretRef": "s", "platform": {"architecture": "arm64"}},
    "imageio": {"url": "https://e/api", "secretRef": "s", "certConfigMap": "c", "diskId": "d"},
    "vddk": {
        "url": "https://v",
        "secretRef": "s",
        "uuid": "u",
        "backingFile": "b",
        "thumbprint": "t",
    },
    "blank": {},
}


def env_names_pattern() -> re.Pattern[str]:
    """The policy's ``envNames`` variable: a CEL concatenation of string literals."""
    policy = next(
        d
        for d in yaml.safe_load_all(POLICY.read_text())
        if d["kind"] == "ValidatingAdmissionPolicy"
    )
    expr = next(v["expression"] for v in policy["spec"]["variables"] if v["name"] == "envNames")
    return re.compile("".join(re.findall(r'"([^"\\]*)"', expr)))


def rich_config() -> CDIConfig:
    return CDIConfig.from_dict(
        {
            "metadata": {"name": "config"},
            "spec": {
                "importProxy": {
                    "HTTPProxy": "http://u:p@proxy:3128",
                    "HTTPSProxy": "http://u:p@proxy:3128",
                    "noProxy": "local",
                    "trustedCAProxy": "ca",
                },
                "importPolicy": {
                    "allowedSourceCIDRs": ["10.0.0.0/8"],
                    "clusterCIDRs": ["10.1.0.0/16"],
                },
            },
        }
    )


def importer_pods() -> list[dict[str, Any]]:
    config = ImporterPodConfig(
        image=IMPORTER_IMAGE,
        command=(),
        cdi_config=rich_config(),
        scratch_pvc_name="disk-scratch",
        proxy_ca_config_map="import-proxy-cm-disk",
        proxy_auth_secret="import-proxy-auth-disk-0123456789",
        direct_io=True,
        checkpoint_attested=(4096, "ab" * 32),
        metrics=Metrics(port=9443, on_pod_ip=True),
    )
    pods = []
    for kind, source in SOURCES.items():
        dv = DataVolume.from_dict(
            {
                "metadata": {"name": "disk", "namespace": "ns", "uid": "dv-uid"},
                "spec": {"source": {kind: source}, "pvc": {}},
            }
        )
        pods.append(render_importer_pod(dv, claim_of("ns", "disk"), config))
    return pods


def all_pods() -> list[dict[str, Any]]:
    return importer_pods() + list(worker_pods("ns").values())


def containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    spec = pod["spec"]
    return list(spec["containers"]) + list(spec.get("initContainers") or [])


def test_every_worker_environment_variable_is_in_the_policys_allow_list() -> None:
    pattern = env_names_pattern()
    names = {e["name"] for pod in all_pods() for c in containers(pod) for e in c.get("env") or []}
    assert {"IMPORTER_CHECKSUM", "IMPORTER_UUID", "http_proxy", "UPLOAD_SERVER_ADDRESS"} <= names
    assert sorted(n for n in names if not pattern.fullmatch(n)) == []


@pytest.mark.parametrize("name", ["PYTHONPATH", "PYTHONHOME", "HOME", "LD_PRELOAD", "GCONV_PATH"])
def test_the_allow_list_refuses_what_would_load_other_code(name: str) -> None:
    assert not env_names_pattern().fullmatch(name)


def test_no_renderer_sets_what_the_policy_refuses() -> None:
    for pod in all_pods():
        assert pod["spec"]["automountServiceAccountToken"] is False
        for c in containers(pod):
            assert c.get("command", []) in ALLOWED_COMMANDS, c["name"]
            assert c.get("args") in (None, ["install-holder", "/shared/cdi-holder"]), c["name"]
            assert not {"workingDir", "lifecycle", "envFrom"} & c.keys(), c["name"]
            assert all(set(e.get("valueFrom") or {}) <= {"fieldRef"} for e in c.get("env") or [])
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
