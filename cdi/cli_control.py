"""``cdi controller`` and ``cdi webhook``: the control-plane processes' command lines.

The process edge: flags (and nothing else) become frozen config dataclasses here, once; the
components below never read the environment. Both run until SIGTERM and shut down gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import uuid
from pathlib import Path


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster)")
    p.add_argument("--log-level", default="INFO")


def add_controller_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("controller", help="run the DataVolume controller")
    _common(p)
    p.add_argument("--importer-image", default="quay.io/cdi-py/cdi-importer:latest")
    p.add_argument("--pull-policy", default="IfNotPresent")
    p.add_argument("--workers", type=int, default=3, help="reconciles in parallel")
    p.add_argument("--max-attempts", type=int, default=3, help="importer pods per import")
    p.add_argument("--retry-base-delay", type=float, default=2.0, help="seconds, doubling")
    p.add_argument("--retry-max-delay", type=float, default=60.0)
    p.add_argument("--progress-interval", type=float, default=2.0)
    p.add_argument("--resync", type=float, default=300.0, help="informer resync seconds")
    p.add_argument(
        "--claim-adoption", action="store_true", help="feature gate DataVolumeClaimAdoption"
    )
    p.add_argument(
        "--cluster-cidr",
        action="append",
        default=[],
        metavar="CIDR",
        help="a pod, service or node range of the cluster (repeatable): imports may not reach "
        "it unless CDIConfig importPolicy.allowedSourceCIDRs allows it",
    )
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--lease-namespace", default="cdi")
    p.add_argument("--lease-name", default="cdi-controller-leader-election-helper")
    p.add_argument("--lease-duration", type=float, default=15.0)
    p.add_argument("--renew-deadline", type=float, default=10.0)
    p.add_argument("--retry-period", type=float, default=2.0)
    p.add_argument("--namespace", default="cdi", help="CDI namespace (upload proxy lookup)")
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=0, help="serve /metrics here; 0: off")
    p.set_defaults(func=cmd_controller)


def add_webhook_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("webhook", help="serve the DataVolume admission webhooks over HTTPS")
    _common(p)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--namespace", default="cdi", help="where the certificate Secret lives")
    p.add_argument("--service", default="cdi-webhook", help="Service name in the certificate")
    p.add_argument("--cert-secret", default="cdi-webhook-certs")
    p.add_argument(
        "--extra-san",
        action="append",
        default=[],
        help="extra DNS name or IP address for the serving certificate",
    )
    p.add_argument("--validating-config", default="cdi-datavolume-validator")
    p.add_argument("--mutating-config", default="cdi-datavolume-mutator")
    p.add_argument("--cert-check-interval", type=float, default=3600.0)
    p.add_argument(
        "--requester-key-file",
        type=Path,
        help="HMAC key (a mounted Secret) to sign the recorded requester; unset: unsigned",
    )
    p.set_defaults(func=cmd_webhook)


def add_control_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_controller_parser(sub)
    add_webhook_parser(sub)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def cmd_controller(a: argparse.Namespace) -> int:
    from cdi.controller.datavolume import ControllerConfig
    from cdi.controller.manager import Manager, ManagerConfig, serve
    from cdi.controller.policy import FailurePolicy
    from cdi.kube.client import Kube, load_api_client
    from cdi.kube.leader import LeaderConfig

    _logging(a.log_level)
    identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    leader = None
    if a.leader_elect:
        leader = LeaderConfig(
            name=a.lease_name,
            namespace=a.lease_namespace,
            identity=identity,
            lease_duration=a.lease_duration,
            renew_deadline=a.renew_deadline,
            retry_period=a.retry_period,
        )
    config = ManagerConfig(
        controller=ControllerConfig(
            importer_image=a.importer_image,
            pull_policy=a.pull_policy,
            policy=FailurePolicy(a.max_attempts, a.retry_base_delay, a.retry_max_delay),
            progress_interval=a.progress_interval,
            claim_adoption_gate=a.claim_adoption,
            cluster_cidrs=tuple(a.cluster_cidr),
        ),
        leader=leader,
        workers=a.workers,
        resync=a.resync,
        namespace=a.namespace,
        metrics_host=a.metrics_host,
        metrics_port=a.metrics_port or None,
    )

    async def main() -> None:
        await serve(Manager(Kube(load_api_client(a.kubeconfig)), config, identity))

    asyncio.run(main())
    return 0


def cmd_webhook(a: argparse.Namespace) -> int:
    from cdi.admission import WebhookConfig, serve_webhook
    from cdi.kube.client import Kube, load_api_client

    _logging(a.log_level)
    config = WebhookConfig(
        host=a.host,
        port=a.port,
        namespace=a.namespace,
        service=a.service,
        cert_secret=a.cert_secret,
        extra_sans=tuple(a.extra_san),
        validating_config=a.validating_config,
        mutating_config=a.mutating_config,
        cert_check_interval=a.cert_check_interval,
        requester_key=a.requester_key_file.read_bytes().strip() if a.requester_key_file else None,
    )
    asyncio.run(serve_webhook(Kube(load_api_client(a.kubeconfig)), config))
    return 0
