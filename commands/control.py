"""``cdi controller``, ``cdi webhook``, ``cdi uploadproxy``, ``cdi upload-apiserver``: the
control-plane processes' command lines.

The process edge: flags (and nothing else) become frozen config dataclasses here, once; the
components below never read the environment. Both run until SIGTERM and shut down gracefully.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import socket
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cdi.kube.client import Kube
    from cdi.upload.serve import UploadPlaneConfig


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", type=Path, help="kubeconfig file (default: in-cluster)")
    p.add_argument("--log-level", default="INFO")


def add_controller_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("controller", help="run the DataVolume controller")
    _common(p)
    p.add_argument("--importer-image", default="quay.io/cdi-py/cdi-importer:latest")
    p.add_argument("--pull-policy", default="IfNotPresent")
    p.add_argument("--uploadserver-image", default="quay.io/cdi-py/cdi-uploadserver:latest")
    p.add_argument(
        "--uploadserver-cert-lifetime",
        type=float,
        default=86400.0,
        help="seconds an upload server's certificate lives; the pod is replaced at 80%%",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=24,
        help="reconciles in parallel per kind (docs/controller.md)",
    )
    p.add_argument("--max-attempts", type=int, default=3, help="importer pods per import")
    p.add_argument("--retry-base-delay", type=float, default=2.0, help="seconds, doubling")
    p.add_argument("--retry-max-delay", type=float, default=60.0)
    p.add_argument("--progress-interval", type=float, default=2.0)
    p.add_argument("--resync", type=float, default=300.0, help="informer resync seconds")
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
    p.add_argument(
        "--namespace", default="cdi", help="CDI namespace (upload proxy lookup, upload CAs)"
    )
    p.add_argument("--metrics-host", default="0.0.0.0")
    p.add_argument("--metrics-port", type=int, default=0, help="serve /metrics here; 0: off")
    p.add_argument(
        "--metrics-tls",
        action="store_true",
        help="serve /metrics over TLS: a certificate kept in Secret "
        "cdi-controller-metrics-server-cert in --namespace, CDIConfig's TLS profile",
    )
    _requester_key_flags(p, "to check the recorded requester (clone authorization)")
    p.set_defaults(func=cmd_controller)


def _requester_key_flags(p: argparse.ArgumentParser, why: str) -> None:
    p.add_argument("--requester-key-file", type=Path, help=f"HMAC key file {why}")
    p.add_argument(
        "--requester-key-secret",
        metavar="NAME",
        help=f"Secret in --namespace holding the HMAC key {why}; created with a random key "
        "if missing (cdi/kube/shared_key.py). --requester-key-file wins",
    )


def _requester_key(a: argparse.Namespace, kube: Kube) -> bytes | None:
    """The key from the file, else from (or made into) the Secret, else None (unsigned)."""
    from cdi.kube.shared_key import ensure_shared_key

    if a.requester_key_file:
        return bytes(a.requester_key_file.read_bytes().strip())
    if a.requester_key_secret:
        return ensure_shared_key(kube, a.namespace, a.requester_key_secret)
    return None


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
    _requester_key_flags(p, "to sign the recorded requester (neither flag: unsigned)")
    p.add_argument(
        "--client-auth",
        choices=("certificate", "network"),
        default="certificate",
        help="certificate: answer only callers with the API server's client certificate; "
        "network: ask for none (only behind deploy/optional/webhook-networkpolicy.yaml)",
    )
    p.add_argument(
        "--client-ca-file",
        type=Path,
        help="CA of the API server's client certificate "
        "(default: the requestheader CA in kube-system/extension-apiserver-authentication)",
    )
    p.add_argument(
        "--client-allowed-names",
        help="comma-separated CNs of the API server's client certificate (default: "
        "requestheader-allowed-names, or any CN the --client-ca-file CA signed)",
    )
    p.add_argument("--health-port", type=int, default=0, help="plain-HTTP /healthz; 0: none")
    p.set_defaults(func=cmd_webhook)


def _upload_plane(p: argparse.ArgumentParser, service: str, cert_secret: str) -> None:
    _common(p)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8443)
    p.add_argument("--namespace", default="cdi", help="where the Secrets live")
    p.add_argument("--service", default=service, help="Service name in the certificate")
    p.add_argument("--cert-secret", default=cert_secret, help="serving certificate Secret")
    p.add_argument("--extra-san", action="append", default=[], help="extra DNS name or IP")
    p.add_argument("--public-keys-config-map", default="cdi-api-signing-public-keys")
    p.add_argument("--check-interval", type=float, default=3600.0, help="rotation checks, s")


def add_upload_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("uploadproxy", help="serve the upload proxy (CDI's cdi-uploadproxy)")
    _upload_plane(p, "cdi-uploadproxy", "cdi-uploadproxy-server-cert")
    p.add_argument(
        "--client-cert-secret",
        default="cdi-uploadserver-client-cert",
        help="the client certificate for upload servers, issued by the controller",
    )
    p.add_argument(
        "--server-ca-config-map",
        default="cdi-uploadserver-signer-bundle",
        help="the upload servers' CA certificate, published by the controller",
    )
    p.add_argument("--upload-server-port", type=int, default=443)
    p.add_argument("--idle-timeout", type=float, default=300.0, help="s without body bytes")
    p.add_argument("--ready-timeout", type=float, default=10.0, help="s to wait for the pod")
    p.add_argument("--handshake-timeout", type=float, default=10.0, help="s for a TLS handshake")
    p.add_argument("--head-timeout", type=float, default=30.0, help="s for a request head")
    p.add_argument("--write-timeout", type=float, default=30.0, help="s to write an answer")
    p.add_argument("--max-connections", type=int, default=512, help="connections at once")
    p.add_argument(
        "--max-connections-per-address",
        type=int,
        default=32,
        help="connections at once from one client address (0: no cap, e.g. behind an ingress)",
    )
    p.set_defaults(func=cmd_uploadproxy)
    p = sub.add_parser("upload-apiserver", help="serve the UploadTokenRequest aggregated API")
    _upload_plane(p, "cdi-api", "cdi-apiserver-server-cert")
    p.add_argument("--signing-secret", default="cdi-api-signing-key")
    p.add_argument("--api-service", default="v1beta1.upload.cdi.kubevirt.io")
    p.add_argument("--key-rotation-days", type=float, default=7.0)
    p.add_argument(
        "--requestheader-client-ca-file",
        type=Path,
        help="front-proxy CA (default: kube-system/extension-apiserver-authentication)",
    )
    p.add_argument("--requestheader-allowed-names", default="", help="comma-separated CNs")
    p.set_defaults(func=cmd_upload_apiserver)


def add_import_proxy_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "import-proxy", help="relay importers to the credentialed importProxy (docs/security.md)"
    )
    _common(p)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=3128)
    p.add_argument("--namespace", default="cdi", help="where the ticket key Secret lives")
    p.add_argument("--key-secret", default="cdi-import-proxy-key", help="ticket key Secret")
    p.add_argument("--refresh", type=float, default=5.0, help="s between CDIConfig reads")
    p.add_argument("--idle-timeout", type=float, default=300.0, help="s with nothing moved")
    p.set_defaults(func=cmd_import_proxy)


def add_control_commands(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    add_controller_parser(sub)
    add_webhook_parser(sub)
    add_upload_parsers(sub)
    add_import_proxy_parser(sub)


def _logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def cmd_controller(a: argparse.Namespace) -> int:
    import datetime as dt

    from cdi.controller.datavolume import ControllerConfig
    from cdi.controller.flavours.upload import UploadSettings
    from cdi.controller.manager import Manager, ManagerConfig, serve
    from cdi.controller.policy import FailurePolicy
    from cdi.kube.client import Kube, load_api_client
    from cdi.kube.leader import LeaderConfig

    _logging(a.log_level)
    kube = Kube(load_api_client(a.kubeconfig))
    config = ManagerConfig(
        controller=ControllerConfig(
            importer_image=a.importer_image,
            pull_policy=a.pull_policy,
            policy=FailurePolicy(a.max_attempts, a.retry_base_delay, a.retry_max_delay),
            progress_interval=a.progress_interval,
            cluster_cidrs=tuple(a.cluster_cidr),
            upload=UploadSettings(
                image=a.uploadserver_image,
                pull_policy=a.pull_policy,
                namespace=a.namespace,
                cert_lifetime=dt.timedelta(seconds=a.uploadserver_cert_lifetime),
                poll_interval=a.progress_interval,
            ),
        ),
        workers=a.workers,
        resync=a.resync,
        namespace=a.namespace,
        metrics_host=a.metrics_host,
        metrics_port=a.metrics_port or None,
        metrics_tls=a.metrics_tls,
        requester_key=_requester_key(a, kube),
        log_level=logging.getLogger().level,  # the flag's, set above
    )

    def term() -> Manager:
        """A Manager for one term, under an identity of its own: after a lost Lease the
        next one waits for the Lease to run out like any other candidate."""
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
        return Manager(kube, dataclasses.replace(config, leader=leader), identity)

    async def main() -> None:
        await serve(term)

    asyncio.run(main())
    return 0


def cmd_webhook(a: argparse.Namespace) -> int:
    from cdi.admission import WebhookConfig, serve_webhook
    from cdi.kube.client import Kube, load_api_client

    _logging(a.log_level)
    kube = Kube(load_api_client(a.kubeconfig))
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
        requester_key=_requester_key(a, kube),
        client_auth=a.client_auth,
        client_ca_file=a.client_ca_file,
        client_names=None
        if a.client_allowed_names is None
        else tuple(n for n in a.client_allowed_names.split(",") if n),
        health_port=a.health_port,
    )
    asyncio.run(serve_webhook(kube, config))
    return 0


def _plane(a: argparse.Namespace) -> UploadPlaneConfig:
    from cdi.upload.serve import UploadPlaneConfig

    return UploadPlaneConfig(
        host=a.host,
        port=a.port,
        namespace=a.namespace,
        extra_sans=tuple(a.extra_san),
        public_keys_config_map=a.public_keys_config_map,
        check_interval=a.check_interval,
        **({"signing_secret": a.signing_secret} if "signing_secret" in a else {}),
    )


def cmd_uploadproxy(a: argparse.Namespace) -> int:
    from cdi.kube.client import Kube, load_api_client
    from cdi.upload.proxy import ProxyConfig
    from cdi.upload.serve import UploadProxyConfig, serve_upload_proxy

    _logging(a.log_level)
    config = UploadProxyConfig(
        plane=_plane(a),
        service=a.service,
        cert_secret=a.cert_secret,
        client_cert_secret=a.client_cert_secret,
        server_ca_config_map=a.server_ca_config_map,
        upload_server_port=a.upload_server_port,
        proxy=ProxyConfig(
            ready_timeout=a.ready_timeout,
            idle_timeout=a.idle_timeout,
            handshake_timeout=a.handshake_timeout,
            head_timeout=a.head_timeout,
            write_timeout=a.write_timeout,
            max_connections=a.max_connections,
            max_connections_per_address=a.max_connections_per_address,
        ),
    )
    asyncio.run(serve_upload_proxy(Kube(load_api_client(a.kubeconfig)), config))
    return 0


def cmd_upload_apiserver(a: argparse.Namespace) -> int:
    import datetime as dt

    from cdi.kube.client import Kube, load_api_client
    from cdi.upload.serve import ApiServerConfig, serve_upload_api
    from cdi.upload.tokenapi import RequestHeaderConfig

    _logging(a.log_level)
    ca = a.requestheader_client_ca_file.read_bytes() if a.requestheader_client_ca_file else b""
    names = tuple(n for n in a.requestheader_allowed_names.split(",") if n)
    config = ApiServerConfig(
        plane=_plane(a),
        service=a.service,
        cert_secret=a.cert_secret,
        api_service=a.api_service,
        key_rotation=dt.timedelta(days=a.key_rotation_days),
        requestheader_ca=ca,
        requestheader=RequestHeaderConfig(allowed_names=names) if ca else None,
    )
    asyncio.run(serve_upload_api(Kube(load_api_client(a.kubeconfig)), config))
    return 0


def cmd_import_proxy(a: argparse.Namespace) -> int:
    from cdi.importproxy.relay import RelayConfig
    from cdi.importproxy.serve import ImportProxyServeConfig, serve_import_proxy
    from cdi.kube.client import Kube, load_api_client

    _logging(a.log_level)
    config = ImportProxyServeConfig(
        host=a.host,
        port=a.port,
        namespace=a.namespace,
        key_secret=a.key_secret,
        refresh=a.refresh,
        relay=RelayConfig(idle_timeout=a.idle_timeout),
    )
    asyncio.run(serve_import_proxy(Kube(load_api_client(a.kubeconfig)), config))
    return 0
