"""A real container registry on loopback for tests and benchmarks: Debian's ``docker-registry``
(the CNCF distribution registry, v2.8), started as a child process with its config written here.

Three shapes, as tests need them: anonymous plain http; TLS from a generated CA with htpasswd
(basic) auth; TLS with the docker token flow, where ``TokenServer`` (a small https server in
this module) issues RS256 JWTs signed by a key the registry trusts through ``rootcertbundle``
and the ``x5c`` header, after checking basic credentials. Nothing is mocked: the registry
enforces the auth, stores blobs on disk (``blob_path`` lets a test tamper with one), and speaks
the API the importer and skopeo talk to.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import socket
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import jwt
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from testkit.pki import CertificateAuthority, KeyPair
from testkit.procs import ManagedProcess
from testkit.waiting import wait_until

SERVICE = "testkit-registry"
ISSUER = "testkit-token-issuer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Credentials:
    username: str
    password: str


@dataclass(frozen=True)
class Tls:
    """A CA and a serving certificate for 127.0.0.1 / localhost, written under ``folder``."""

    ca_pem: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, folder: Path, ca: CertificateAuthority | None = None) -> Tls:
        ca = ca or CertificateAuthority("registry-test-ca")
        folder.mkdir(parents=True, exist_ok=True)
        pair = ca.issue("127.0.0.1", dns_names=("localhost",), ips=("127.0.0.1",))
        ca_pem = folder / "ca.crt"
        ca_pem.write_bytes(ca.cert_pem)
        cert, key = pair.write(folder / "tls.crt", folder / "tls.key")
        return cls(ca_pem, cert, key)


class TokenServer:
    """The docker token protocol's auth server: ``GET /token?service=&scope=`` -> ``{token}``.

    Checks basic credentials when ``users`` is given (else anyone gets a token), grants what the
    scope asks for, and signs with a key whose certificate the registry trusts."""

    def __init__(self, folder: Path, tls: Tls, users: dict[str, str] | None = None) -> None:
        ca = CertificateAuthority("token-signing-ca")
        self.signer: KeyPair = ca.issue("token-signer")
        self.bundle = folder / "token-ca.pem"
        self.bundle.write_bytes(ca.cert_pem)
        self.users = users
        self.issued = 0
        self.port = free_port()
        self.realm = f"https://127.0.0.1:{self.port}/token"
        cert = x509.load_pem_x509_certificate(self.signer.cert_pem)
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(tls.cert, tls.key)
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()

    def token(self, scopes: list[str], subject: str) -> str:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        self.issued += 1
        return jwt.encode(claims, self.signer.key_pem, "RS256", headers={"x5c": [self._x5c]})

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *_: object) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                user = owner.authenticate(self.headers.get("Authorization", ""))
                if user is None:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = json.dumps({"token": owner.token(query.get("scope", []), user)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def authenticate(self, header: str) -> str | None:
        """The user a request is from ("" for anonymous when allowed), None if refused."""
        if self.users is None:
            return "anonymous"
        if not header.startswith("Basic "):
            return None
        user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        return user if self.users.get(user) == password else None

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class Registry:
    """One running ``docker-registry``; ``host`` is ``127.0.0.1:<port>``."""

    root: Path
    tls: Tls | None = None
    users: dict[str, str] | None = None  # htpasswd users (basic auth)
    token: TokenServer | None = None  # bearer auth instead
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    pushed: dict[str, str] = field(default_factory=dict)  # repo -> digest, for tests to note

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    def url(self, repo: str, ref: str = "latest") -> str:
        sep = "@" if ref.startswith("sha256:") else ":"
        return f"docker://{self.host}/{repo}{sep}{ref}"

    def start(self) -> Registry:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(yaml.safe_dump(self._config()))
        argv = ["docker-registry", "serve", str(config)]
        self.process = ManagedProcess("docker-registry", argv, self.root / "registry.log")
        wait_until(self._answers, f"docker-registry on {self.host}", timeout=30, interval=0.05)
        return self

    def _config(self) -> dict[str, object]:
        http_conf: dict[str, object] = {"addr": self.host, "secret": uuid.uuid4().hex}
        if self.tls:
            http_conf["tls"] = {"certificate": str(self.tls.cert), "key": str(self.tls.key)}
        config: dict[str, object] = {
            "version": 0.1,
            "log": {"level": "error", "accesslog": {"disabled": True}},
            "storage": {"filesystem": {"rootdirectory": str(self.root / "store")}},
            "http": http_conf,
        }
        if self.users is not None:
            config["auth"] = {"htpasswd": {"realm": "test", "path": str(self._htpasswd())}}
        elif self.token is not None:
            config["auth"] = {
                "token": {
                    "realm": self.token.realm,
                    "service": SERVICE,
                    "issuer": ISSUER,
                    "rootcertbundle": str(self.token.bundle),
                }
            }
        return config

    def _htpasswd(self) -> Path:
        path = self.root / "htpasswd"
        lines = []
        for user, password in (self.users or {}).items():
            out = subprocess.run(
                ["htpasswd", "-Bbn", user, password], capture_output=True, text=True, check=True
            )
            lines.append(out.stdout.strip())
        path.write_text("\n".join(lines) + "\n")
        return path

    def _answers(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        try:
            conn = self.connection(timeout=1)
            conn.request("GET", "/v2/")
            status = conn.getresponse().status
            conn.close()
        except OSError:
            return False
        return status in (200, 401)

    def connection(self, timeout: float = 10) -> http.client.HTTPConnection:
        if self.tls is None:
            return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        ctx = ssl.create_default_context(cafile=str(self.tls.ca_pem))
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=ctx)

    def blob_path(self, digest: str) -> Path:
        """Where the registry keeps a blob's bytes (a test may tamper with them)."""
        hexd = digest.removeprefix("sha256:")
        return self.root / "store/docker/registry/v2/blobs/sha256" / hexd[:2] / hexd / "data"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(grace=5)
            self.process = None
        if self.token is not None:
            self.token.stop()
