"""The images' recipe (deploy/images/Containerfile.*, which scripts/images.sh turns into umoci
configs) runs what deploy/ and the controller's pods expect: the right program, as the right
user, with the holder where the importer looks for it; and deploy/'s Kustomization holds exactly
the manifests that ``kubectl apply -f deploy/`` applies.

Building the images takes minutes (scripts/images.sh); these checks are the cheap half that CI
runs on every change: a renamed subcommand, a new worker image or a changed pod user shows here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from importer.holder import HOLDER_BINARY
from testkit.product import deploy_documents
from tests.worker_pods import worker_pods

ROOT = Path(__file__).resolve().parents[2]
IMAGES_DIR = ROOT / "deploy" / "images"
KUBECTL = ROOT / "hack" / "kube" / "_build" / "bin" / "kubectl"
PREFIX = "quay.io/cdi-py/cdi-"
CONTROL_PLANE_USER, WORKER_USER = "65532:65532", "107:107"

_spec = importlib.util.spec_from_file_location("containerfile", ROOT / "scripts/containerfile.py")
assert _spec and _spec.loader
containerfile = importlib.util.module_from_spec(_spec)
sys.modules["containerfile"] = containerfile  # dataclasses look their module up
_spec.loader.exec_module(containerfile)


def recipe(image: str) -> Any:
    """The runtime config of ``quay.io/cdi-py/cdi-<name>[:tag]``'s Containerfile."""
    name = image.removeprefix(PREFIX).split(":")[0].split("@")[0]
    return containerfile.parse(IMAGES_DIR / f"Containerfile.{name}")


def images_sh_list() -> list[str]:
    text = (ROOT / "scripts" / "images.sh").read_text()
    found = re.search(r"^IMAGES=\(([^)]*)\)", text, re.M)
    assert found
    return found.group(1).split()


def test_images_sh_builds_every_containerfile_and_nothing_else() -> None:
    files = sorted(p.suffix[1:] for p in IMAGES_DIR.glob("Containerfile.*"))
    assert sorted(images_sh_list()) == files
    for name in files:
        config = recipe(name)
        assert config.base == "localhost/cdi-base:latest", name  # no registry base image
        assert config.entrypoint[:2] == ["python", "-m"], name


def test_every_deployment_runs_its_images_entrypoint_as_the_nonroot_user() -> None:
    seen = set()
    for doc in deploy_documents():
        if doc["kind"] != "Deployment":
            continue
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        for c in pod["containers"]:
            config = recipe(c["image"])
            seen.add(c["image"])
            assert "command" not in c  # the image's ENTRYPOINT runs: python -m cdi
            assert config.entrypoint == ["python", "-m", "cdi"]
            # runAsNonRoot needs a numeric USER the kubelet can check without /etc/passwd
            assert config.user == CONTROL_PLANE_USER
            assert c["securityContext"]["readOnlyRootFilesystem"] is True
            subcommand = c["args"][0]
            assert subcommand in {*config.cmd, "import-proxy"}, (c["image"], subcommand)
    assert {PREFIX + n + ":latest" for n in ("controller", "webhook", "apiserver")} <= seen


def test_deployment_subcommands_are_the_images_default_commands() -> None:
    """Each control-plane image's CMD is its Deployment's subcommand (the import proxy relay
    reuses the controller image with ``import-proxy``)."""
    by_image = {}
    for doc in deploy_documents():
        if doc["kind"] == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c["args"][0] != "import-proxy":
                    by_image[c["image"]] = c["args"][0]
    assert {image: recipe(image).cmd for image in by_image} == {
        image: [sub] for image, sub in by_image.items()
    }


def test_worker_pods_run_their_images_as_the_user_the_pod_asks_for() -> None:
    for kind, pod in worker_pods("ns").items():
        spec = pod["spec"]
        for c in spec["containers"] + spec.get("initContainers", []):
            if not c["image"].startswith(PREFIX):
                continue  # the containerDisk of a node pull: the tenant's image
            config = recipe(c["image"])
            uid = spec["securityContext"]["runAsUser"]
            assert config.user == f"{uid}:{uid}" == WORKER_USER, kind
            assert c.get("command", config.entrypoint) == config.entrypoint, kind
            assert config.cmd == [], kind  # the workers take no subcommand


def test_the_importer_image_carries_the_holder_where_the_importer_installs_it_from() -> None:
    text = (IMAGES_DIR / "Containerfile.importer").read_text()
    assert re.search(rf"^COPY --chmod=0555 \S+/cdi-holder {re.escape(HOLDER_BINARY)}$", text, re.M)
    others = [p for p in IMAGES_DIR.glob("Containerfile.*") if p.name != "Containerfile.importer"]
    assert not [p.name for p in others if re.search(r"^COPY .*cdi-holder", p.read_text(), re.M)]


def test_the_test_nodes_image_map_runs_what_the_images_run() -> None:
    """testkit/images.yaml stands in for the images on the process node: same programs."""
    entries = yaml.safe_load((ROOT / "testkit" / "images.yaml").read_text())["images"]
    for name in images_sh_list():
        image = f"{PREFIX}{name}"
        entry = next(
            e for e in entries if any(re.fullmatch(m.replace("*", ".*"), image) for m in e["match"])
        )
        mapped = [a.replace("{python}", "python") for a in entry["entrypoint"]]
        assert mapped == recipe(image).entrypoint, name


def test_the_kustomization_applies_exactly_the_manifests_of_kubectl_apply_f() -> None:
    kustomization = yaml.safe_load((ROOT / "deploy" / "Kustomization").read_text())
    assert kustomization["resources"] == sorted(p.name for p in (ROOT / "deploy").glob("*.yaml"))
    assert not list((ROOT / "deploy").glob("kustomization.*"))  # kubectl -f would apply it
    built = subprocess.run(
        [str(KUBECTL), "kustomize", str(ROOT / "deploy")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    got = [d for d in yaml.safe_load_all(built) if d]
    assert sorted(map(_normalized, got)) == sorted(map(_normalized, deploy_documents()))


def _normalized(doc: Any) -> str:
    """Kustomize reorders keys and re-folds long strings (CEL expressions): compare documents
    as sorted JSON, their strings without blank lines."""
    return json.dumps(_folded(doc), sort_keys=True)


def _folded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _folded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_folded(v) for v in value]
    if isinstance(value, str):
        return re.sub(r"\n\s*\n", "\n", value)
    return value
