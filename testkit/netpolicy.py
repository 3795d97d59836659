"""A pure evaluator of Kubernetes NetworkPolicy semantics (``networking.k8s.io/v1``): may this
endpoint open a connection to that one on this port?

The policies in ``deploy/`` are checked by evaluating them against the product's own pods,
labels and ports (``tests/unit/test_network_policies.py``): every connection and port, in the
strictest cluster, which no live test can cover. The test clusters' CNI bridge enforces nothing;
on the real-node harness a real enforcer runs beside it for the e2e test
``tests/e2e/test_network_policies.py`` (:mod:`testkit.netpolenforcer`, kube-network-policies),
which judges pod-to-pod connections but not the node's own, so the API server rules are left to
this evaluator (``docs/security.md``, "NetworkPolicies").
The rules, as the API reference states them:

- A pod is isolated for ingress (egress) when some policy in its namespace selects it
  (``spec.podSelector``) and has ``Ingress`` (``Egress``) in ``policyTypes``; ``policyTypes``
  left out means ``[Ingress]``, plus ``Egress`` when the policy has an ``egress`` section.
- A connection needs both ends: the source's egress (not isolated, or some rule of a policy
  selecting it admits the destination and port) and the destination's ingress (likewise). An
  endpoint outside the pod network (the API server, a web server on the internet) has no
  policies of its own: only the pod side is checked.
- A rule admits a peer when ``from``/``to`` is empty or one of its peers matches, and the port
  when ``ports`` is empty or one of them matches (protocol TCP by default, a named port is
  looked up among the destination pod's container ports, ``endPort`` makes a range).
- A peer: ``podSelector`` alone is pods of the policy's namespace; ``namespaceSelector`` alone,
  every pod of the matching namespaces; both, the matching pods of the matching namespaces;
  ``ipBlock``, addresses inside ``cidr`` and outside every ``except``. Whether an ``ipBlock``
  covers pod addresses is left to the plugin by the API; here it does (the more open reading,
  so a test that something is refused does not depend on it).
- Label selectors: ``matchLabels`` and ``matchExpressions`` (``In``, ``NotIn``, ``Exists``,
  ``DoesNotExist``), all of them; the empty selector matches everything.

Traffic from the node itself (the kubelet's probes) is not modelled: common plugins admit it
whatever the policies say.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Policy = Mapping[str, Any]


@dataclass(frozen=True)
class Endpoint:
    """A pod (``namespace`` set) or an address outside the pod network (``namespace`` None)."""

    name: str
    ip: str
    namespace: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    ports: Mapping[str, int] = field(default_factory=dict)  # named container ports

    @property
    def is_pod(self) -> bool:
        return self.namespace is not None


@dataclass(frozen=True)
class Network:
    namespaces: Mapping[str, Mapping[str, str]]  # name -> labels
    policies: Sequence[Policy]

    def allowed(self, src: Endpoint, dst: Endpoint, port: int, protocol: str = "TCP") -> bool:
        return self._admits(src, dst, dst, port, protocol, "Egress") and self._admits(
            dst, src, dst, port, protocol, "Ingress"
        )

    def _admits(
        self, pod: Endpoint, peer: Endpoint, dst: Endpoint, port: int, protocol: str, kind: str
    ) -> bool:
        """Whether ``pod``'s ``kind`` (Ingress: from ``peer``; Egress: to it) is admitted."""
        if not pod.is_pod:
            return True
        selecting = [p for p in self.policies if self._selects(p, pod, kind)]
        if not selecting:
            return True
        section = "ingress" if kind == "Ingress" else "egress"
        peers_key = "from" if kind == "Ingress" else "to"
        for policy in selecting:
            namespace = str(policy["metadata"]["namespace"])
            for rule in policy["spec"].get(section) or []:
                peers = rule.get(peers_key) or []
                if peers and not any(self._peer(p, peer, namespace) for p in peers):
                    continue
                if _port_matches(rule.get("ports") or [], dst, port, protocol):
                    return True
        return False

    def _selects(self, policy: Policy, pod: Endpoint, kind: str) -> bool:
        spec = policy["spec"]
        types = spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))
        return (
            kind in types
            and policy["metadata"]["namespace"] == pod.namespace
            and matches(spec.get("podSelector") or {}, pod.labels)
        )

    def _peer(self, peer: Mapping[str, Any], other: Endpoint, namespace: str) -> bool:
        if "ipBlock" in peer:
            return in_block(peer["ipBlock"], other.ip)
        if not other.is_pod:
            return False
        if "namespaceSelector" in peer:
            labels = self.namespaces.get(str(other.namespace), {})
            if not matches(peer["namespaceSelector"] or {}, labels):
                return False
        elif other.namespace != namespace:
            return False
        return matches(peer.get("podSelector") or {}, other.labels)


def matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector against a label set (the empty selector matches everything)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(op)
        if ok is None:
            raise ValueError(f"unknown selector operator {op!r}")
        if not ok:
            return False
    return True


def in_block(block: Mapping[str, Any], ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    cidr = ipaddress.ip_network(block["cidr"])
    if address.version != cidr.version or address not in cidr:
        return False
    return not any(
        address in ipaddress.ip_network(e)
        for e in block.get("except") or []
        if ipaddress.ip_network(e).version == address.version
    )


def _port_matches(
    ports: Sequence[Mapping[str, Any]], dst: Endpoint, port: int, protocol: str
) -> bool:
    if not ports:
        return True
    for p in ports:
        if (p.get("protocol") or "TCP") != protocol:
            continue
        if "port" not in p:
            return True  # every port of that protocol
        want = p["port"]
        number = dst.ports.get(want) if isinstance(want, str) else int(want)
        if number is None:
            continue
        if number <= port <= int(p.get("endPort") or number):
            return True
    return False
