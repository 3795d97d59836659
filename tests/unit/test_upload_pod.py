"""The upload server's Pod, Service and certificate Secret as the pure renderers make them
(the pod contract of docs/upload.md), and the certificates the controller issues for them,
checked by a real TLS handshake on loopback."""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import socket
import ssl
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from cdi.api.config import CDIConfig
from cdi.api.quantity import scratch_ceiling
from cdi.api.tlsprofile import INTERMEDIATE
from cdi.pki.certs import KeyPair, issue_client, new_ca
from cdi.pki.upload import issue_server_credentials
from cdi.pki.uploadca import CAState
from cdi.render import RenderError
from cdi.render.upload_pod import (
    UploadPodConfig,
    render_upload_pod,
    render_upload_secret,
    render_upload_service,
    upload_pod_name,
)

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def pvc(name: str = "disk", mode: str = "Filesystem", **annotations: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": "pvc-uid", "annotations": annotations},
        "spec": {
            "volumeMode": mode,
            "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


def env(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]
    }


CONFIG = UploadPodConfig(
    image="quay.io/cdi-py/cdi-uploadserver:latest", deadline="2026-01-01T19:12:00Z"
)


def test_the_upload_pod_follows_the_contract_for_a_filesystem_claim() -> None:
    pod = render_upload_pod(pvc(**{"cdi.kubevirt.io/storage.contentType": "archive"}), CONFIG)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["name"] == "cdi-upload-disk"
    assert meta["labels"]["cdi.kubevirt.io/uploadTarget"] == "pvc-uid"
    assert meta["labels"]["cdi.kubevirt.io"] == "cdi-upload-server"
    (owner,) = meta["ownerReferences"]
    assert (owner["kind"], owner["uid"], owner["controller"]) == (
        "PersistentVolumeClaim",
        "pvc-uid",
        True,
    )
    assert spec["restartPolicy"] == "OnFailure"
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert env(pod) == {
        "TLS_CERT_FILE": "/etc/cdi/upload-server/tls.crt",
        "TLS_KEY_FILE": "/etc/cdi/upload-server/tls.key",
        "CLIENT_CERT_FILE": "/etc/cdi/upload-server/ca.crt",
        "CLIENT_NAME": "client.upload-server.cdi.kubevirt.io",
        "DESTINATION": "/data/disk.img",
        "UPLOAD_IMAGE_SIZE": "1Gi",
        "FILESYSTEM_OVERHEAD": "0.06",
        "PREALLOCATION": "false",
        "CONTENT_TYPE": "archive",
        "OWNER_UID": "pvc-uid",
        "DEADLINE": "2026-01-01T19:12:00Z",
        "UPLOAD_SERVER_PORT": "8443",
        "TLS_CIPHERS": ",".join(INTERMEDIATE.ciphers),
        "TLS_MIN_VERSION": "VersionTLS12",
        "UPLOAD_SERVER_ADDRESS": {"fieldRef": {"fieldPath": "status.podIP"}},
    }
    container = spec["containers"][0]
    # a TCP connect: the kubelet has no client certificate for the TLS handshake (N4)
    assert container["readinessProbe"]["tcpSocket"] == {"port": 8443}
    assert "httpGet" not in container["readinessProbe"]
    assert container["readinessProbe"]["periodSeconds"] == 1
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert (
        volumes[mounts["/etc/cdi/upload-server"]]["secret"]["secretName"] == "cdi-upload-disk-tls"
    )
    assert volumes[mounts["/data"]]["persistentVolumeClaim"] == {"claimName": "disk"}
    assert "command" not in container  # the image's entry point runs the server
    assert "/scratch" not in mounts and "UPLOAD_SCRATCH_DIR" not in env(pod)


def test_the_upload_pod_carries_cdiconfigs_tls_profile_in_cdis_variables() -> None:
    modern = CDIConfig.from_dict({"spec": {"tlsSecurityProfile": {"type": "Modern", "modern": {}}}})
    values = env(render_upload_pod(pvc(), dataclasses.replace(CONFIG, cdi_config=modern)))
    assert values["TLS_MIN_VERSION"] == "VersionTLS13"
    assert (
        values["TLS_CIPHERS"]
        == "TLS_AES_128_GCM_SHA256,TLS_AES_256_GCM_SHA384,TLS_CHACHA20_POLY1305_SHA256"
    )


def test_a_block_claim_is_a_device_without_overhead() -> None:
    pod = render_upload_pod(
        pvc(mode="Block", **{"cdi.kubevirt.io/storage.preallocation.requested": "true"}), CONFIG
    )
    container = pod["spec"]["containers"][0]
    assert container["volumeDevices"] == [
        {"name": "cdi-data-vol", "devicePath": "/dev/cdi-block-volume"}
    ]
    assert "/data" not in {m["mountPath"] for m in container["volumeMounts"]}
    values = env(pod)
    assert (values["DESTINATION"], values["FILESYSTEM_OVERHEAD"]) == ("/dev/cdi-block-volume", "0")
    scratch = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/scratch"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    limit = str(scratch_ceiling(1 << 30))  # the largest image a 1Gi claim can need staged
    assert volumes[scratch] == {"name": scratch, "emptyDir": {"sizeLimit": limit}}
    assert values["UPLOAD_SCRATCH_DIR"] == "/scratch"
    assert (values["CONTENT_TYPE"], values["PREALLOCATION"]) == ("kubevirt", "true")


def test_a_content_type_other_than_kubevirt_or_archive_is_refused_with_a_reason() -> None:
    with pytest.raises(RenderError) as err:
        render_upload_pod(pvc(**{"cdi.kubevirt.io/storage.contentType": "<script>"}), CONFIG)
    assert err.value.reason == "ErrUploadContentType"


def test_the_service_selects_the_pod_on_8443_and_long_names_stay_dns_labels() -> None:
    svc = render_upload_service(pvc())
    assert svc["spec"]["selector"] == {"service": "cdi-upload-disk"}
    assert svc["spec"]["ports"] == [
        {"name": "https", "port": 8443, "targetPort": 8443, "protocol": "TCP"}
    ]
    assert render_upload_pod(pvc(), CONFIG)["metadata"]["labels"]["service"] == "cdi-upload-disk"
    long = "a." * 60 + "disk"
    name = upload_pod_name(long)
    assert len(name) <= 63 and "." not in name
    assert render_upload_service(pvc(long))["metadata"]["name"] == name


def _serve_once(ctx: ssl.SSLContext, listener: socket.socket, seen: list[str]) -> None:
    conn, _ = listener.accept()
    try:
        with ctx.wrap_socket(conn, server_side=True) as tls:
            subject = dict(x[0] for x in tls.getpeercert()["subject"])
            seen.append(str(subject["commonName"]))
            tls.sendall(b"ok")
    except (ssl.SSLError, OSError) as exc:
        seen.append(f"refused: {exc}")


def _files(pair: KeyPair, d: Path, stem: str) -> tuple[str, str]:
    (d / f"{stem}.crt").write_bytes(pair.cert_pem)
    (d / f"{stem}.key").write_bytes(pair.key_pem)
    return str(d / f"{stem}.crt"), str(d / f"{stem}.key")


def test_the_issued_certificate_serves_the_proxys_name_and_demands_the_client_ca() -> None:
    now = dt.datetime.now(dt.UTC)
    server_ca, client_ca = (
        new_ca("cdi-uploadserver-ca", now),
        new_ca("cdi-uploadserver-client-ca", now),
    )
    creds = issue_server_credentials(
        CAState(server_ca), CAState(client_ca), "cdi-upload-disk", "ns", now
    )
    data = {k: base64.b64decode(v) for k, v in creds.secret_data().items()}
    assert data["ca.crt"] == client_ca.cert_pem  # the client CA's certificate, never its key
    assert creds.deadline == now.replace(microsecond=0) + dt.timedelta(hours=24) * 0.8
    secret = render_upload_secret(pvc(), creds.secret_data())
    assert secret["metadata"]["name"] == "cdi-upload-disk-tls"
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        server.load_cert_chain(*_files(KeyPair(data["tls.crt"], data["tls.key"]), d, "server"))
        server.load_verify_locations(cadata=data["ca.crt"].decode())
        server.verify_mode = ssl.CERT_REQUIRED
        client = ssl.create_default_context(cadata=server_ca.cert_pem.decode())
        proxy = issue_client(client_ca, "client.upload-server.cdi.kubevirt.io", now)
        client.load_cert_chain(*_files(proxy, d, "client"))
        with socket.create_server(("127.0.0.1", 0)) as listener:
            seen: list[str] = []
            t = threading.Thread(target=_serve_once, args=(server, listener, seen))
            t.start()
            with (
                socket.create_connection(listener.getsockname()) as raw,
                client.wrap_socket(raw, server_hostname="cdi-upload-disk.ns.svc") as tls,
            ):
                assert tls.recv(2) == b"ok"
            t.join(5)
    assert seen == ["client.upload-server.cdi.kubevirt.io"]
    other = issue_server_credentials(
        CAState(server_ca), CAState(client_ca), "cdi-upload-other", "ns", now
    )
    assert other.server.cert_pem != creds.server.cert_pem


def test_a_long_namespace_still_gets_a_certificate_for_the_proxys_name() -> None:
    now = dt.datetime.now(dt.UTC)
    ca = new_ca("cdi-uploadserver-ca", now)
    namespace = "n" * 63
    creds = issue_server_credentials(
        CAState(ca), CAState(new_ca("c", now)), "cdi-upload-" + "d" * 52, namespace, now
    )
    sans = creds.server.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert f"cdi-upload-{'d' * 52}.{namespace}.svc" in sans.value.get_values_for_type(x509.DNSName)
