"""A real GCS emulator on loopback for tests: fake-gcs-server (``hack/gcs/build.sh``), the
emulator Google's client libraries are tested with, started as a child process, plus the OAuth
token endpoint it does not have.

fake-gcs-server serves the JSON API (``/storage/v1/b/<bucket>/o/<object>?alt=media`` with
``Range``, HEAD, 404 for a missing object) over its filesystem backend; ``put`` uploads through
its own upload API. It accepts any ``Authorization`` (it checks no credentials), so the service
account's side is tested at the token endpoint: ``TokenServer`` is a small real aiohttp server
that implements Google's JWT-bearer grant (RFC 7523) for the service accounts it was given:
it verifies the assertion's RS256 signature with the account's public key, its ``iss``,
``aud`` (its own URL) and ``exp``, and answers ``{"access_token", "expires_in"}``, or
``400 {"error": "invalid_grant"}`` as Google does for a key it does not know.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import secrets
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from testkit.cluster import free_port
from testkit.procs import ManagedProcess
from testkit.waiting import wait_until

BINARY = (
    Path(__file__).resolve().parent.parent / "hack" / "gcs" / "_build" / "bin" / "fake-gcs-server"
)
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class GcsServerMissing(RuntimeError):
    """fake-gcs-server is not built."""


@dataclass(frozen=True)
class ServiceAccountKey:
    """A service account with a fresh RSA key; ``json`` is its ``credentials.json``."""

    email: str
    private_pem: str = field(repr=False)
    public_pem: str
    key_id: str

    @classmethod
    def generate(cls, email: str) -> ServiceAccountKey:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ).decode()
        public = (
            key.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )
        return cls(email, private, public, secrets.token_hex(20))

    def json(self, token_uri: str) -> str:
        return json.dumps(
            {
                "type": "service_account",
                "project_id": "testkit",
                "private_key_id": self.key_id,
                "private_key": self.private_pem,
                "client_email": self.email,
                "client_id": "1234567890",
                "auth_uri": "https://accounts.google.com/o/oauth2/auth",
                "token_uri": token_uri,
            }
        )


class TokenServer:
    """Google's OAuth token endpoint for the accounts registered with ``allow``, on loopback
    (aiohttp on its own event loop thread). ``granted`` lists (email, scope) per token."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = free_port()
        self.accounts: dict[str, str] = {}  # email -> public key PEM
        self.granted: list[tuple[str, str]] = []
        self.refused = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def token_uri(self) -> str:
        return f"http://{self.host}:{self.port}/token"

    def allow(self, account: ServiceAccountKey) -> None:
        self.accounts[account.email] = account.public_pem

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form.get("grant_type") != JWT_BEARER or not isinstance(form.get("assertion"), str):
            return web.json_response({"error": "unsupported_grant_type"}, status=400)
        assertion = str(form["assertion"])
        try:
            unverified = jwt.decode(assertion, options={"verify_signature": False})
            public = self.accounts[unverified["iss"]]
            claims = jwt.decode(
                assertion,
                public,
                algorithms=["RS256"],
                audience=self.token_uri,
                options={"require": ["iss", "aud", "iat", "exp"]},
            )
        except (jwt.PyJWTError, KeyError):
            self.refused += 1
            return web.json_response(
                {"error": "invalid_grant", "error_description": "Invalid JWT Signature."},
                status=400,
            )
        self.granted.append((claims["iss"], str(claims.get("scope", ""))))
        token = "ya29.testkit-" + secrets.token_urlsafe(24)
        return web.json_response(
            {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
        )

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()

    def start(self) -> TokenServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=30)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            runner = self._runner
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop).result(timeout=30)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


@dataclass
class GcsServer:
    """One running fake-gcs-server (``endpoint`` ``http://127.0.0.1:<port>``) and its token
    endpoint; ``account`` is a service account the token endpoint knows."""

    root: Path
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None
    tokens: TokenServer | None = None
    account: ServiceAccountKey = field(
        default_factory=lambda: ServiceAccountKey.generate(
            "importer@testkit.iam.gserviceaccount.com"
        )
    )

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def emulator_host(self) -> str:
        """The ``STORAGE_EMULATOR_HOST`` value Google's libraries take."""
        return f"{self.host}:{self.port}"

    def credentials_json(self, account: ServiceAccountKey | None = None) -> str:
        assert self.tokens is not None
        return (account or self.account).json(self.tokens.token_uri)

    def start(self) -> GcsServer:
        if not BINARY.is_file():
            raise GcsServerMissing(f"no fake-gcs-server at {BINARY}: run hack/gcs/build.sh")
        storage = self.root / "storage"
        storage.mkdir(parents=True, exist_ok=True)
        argv = [
            str(BINARY),
            "-scheme",
            "http",
            "-host",
            self.host,
            "-port",
            str(self.port),
            "-backend",
            "filesystem",
            "-filesystem-root",
            str(storage),
            "-public-host",
            self.emulator_host,
            "-external-url",
            self.endpoint,
            "-log-level",
            "warn",
        ]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        self.process = ManagedProcess(
            "fake-gcs-server", argv, self.root / "fake-gcs-server.log", env=env
        )
        self.tokens = TokenServer(self.host).start()
        self.tokens.allow(self.account)
        wait_until(self._answers, f"fake-gcs-server on {self.endpoint}", timeout=30, interval=0.05)
        return self

    def _request(self, method: str, path: str, body: object = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(method, path, body=body)  # type: ignore[arg-type]
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def _answers(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        try:
            return self._request("GET", "/_internal/healthcheck")[0] == 200
        except OSError:
            return False

    def put(self, bucket: str, name: str, source: Path) -> str:
        """Upload ``source`` as ``bucket/name`` (creating the bucket); its ``gs://`` URL."""
        status, _ = self._request("GET", f"/storage/v1/b/{quote(bucket, safe='')}")
        if status == 404:
            status, body = self._request("POST", "/storage/v1/b", json.dumps({"name": bucket}))
            assert status == 200, (status, body)
        path = (
            f"/upload/storage/v1/b/{quote(bucket, safe='')}/o"
            f"?uploadType=media&name={quote(name, safe='')}"
        )
        with source.open("rb") as body_file:
            status, body = self._request("POST", path, body_file)
        assert status == 200, (status, body)
        return f"gs://{bucket}/{name}"

    def https_url(self, bucket: str, name: str) -> str:
        """The object's URL with the emulator as its host (CDI's https form)."""
        return f"{self.endpoint}/{bucket}/{name}"

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        if self.tokens is not None:
            self.tokens.stop()
            self.tokens = None
