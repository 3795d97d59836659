"""The optional NetworkPolicy (``deploy/optional/``) fences what ``deploy/30-webhook.yaml``
runs: it selects the webhook's pods, admits the review port only from the range the operator
fills in and leaves the health port open for the kubelet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_the_optional_policy_fences_the_webhooks_review_port_and_opens_its_health_port() -> None:
    (policy,) = _docs(DEPLOY / "optional" / "webhook-networkpolicy.yaml")
    deployment = next(d for d in _docs(DEPLOY / "30-webhook.yaml") if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    ports = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    fenced, health = policy["spec"]["ingress"]
    assert [p["port"] for p in fenced["ports"]] == [ports["https"]]
    assert [f["ipBlock"]["cidr"] for f in fenced["from"]] == ["192.0.2.0/24"]  # to be replaced
    assert [p["port"] for p in health["ports"]] == [ports["health"]] and "from" not in health
    probe = pod["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["port"] == "health" and probe["scheme"] == "HTTP"
