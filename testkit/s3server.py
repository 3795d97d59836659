"""A real S3 server on loopback for tests: versitygw (``hack/s3/build.sh``), an S3 gateway
over a directory, started as a child process.

versitygw's posix backend serves a directory: each sub-directory is a bucket, each file under it
an object, so ``put`` just places a file there (a hard link when it can, the images are large).
It checks SigV4 on every request with the root key pair given here, answers ranges, HEAD, and
S3's XML error documents (``NoSuchKey``, ``InvalidAccessKeyId``, ``SignatureDoesNotMatch``), which
is what the importer's S3 source must meet. ``virtual_domain`` turns on virtual-hosted bucket
addressing under that domain (``<bucket>.<domain>``), as AWS serves it; ``tls`` serves https
with a certificate from a test CA (the certConfigMap case).
"""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
from dataclasses import dataclass, field
from pathlib import Path

from testkit.cluster import free_port
from testkit.procs import ManagedProcess
from testkit.registry import Tls
from testkit.waiting import wait_until

BINARY = Path(__file__).resolve().parent.parent / "hack" / "s3" / "_build" / "bin" / "versitygw"


class S3ServerMissing(RuntimeError):
    """versitygw is not built."""


@dataclass
class S3Server:
    """One running versitygw; ``endpoint`` is ``http://127.0.0.1:<port>``."""

    root: Path
    access_key: str = "testkit-access"
    secret_key: str = "testkit-secret-0123456789"
    virtual_domain: str | None = None
    region: str = "us-east-1"  # the region signatures must name
    tls: Tls | None = None  # serve https with this certificate (for 127.0.0.1 / localhost)
    host: str = "127.0.0.1"
    port: int = field(default_factory=free_port)
    process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    def url(self, bucket: str, key: str) -> str:
        """The path-style URL of an object."""
        return f"{self.endpoint}/{bucket}/{key}"

    @property
    def data(self) -> Path:
        return self.root / "data"

    def start(self) -> S3Server:
        if not BINARY.is_file():
            raise S3ServerMissing(f"no versitygw at {BINARY}: run hack/s3/build.sh")
        self.data.mkdir(parents=True, exist_ok=True)
        argv = [
            str(BINARY),
            "--access",
            self.access_key,
            "--secret",
            self.secret_key,
            "--port",
            f"{self.host}:{self.port}",
            "--quiet",
            "--region",
            self.region,
        ]
        # The internal IAM service: an unknown access key is then S3's 403 InvalidAccessKeyId
        # (single-tenant mode answers 404 XAdminUserNotFound, which no S3 client expects).
        (self.root / "iam").mkdir(exist_ok=True)
        argv += ["--iam-dir", str(self.root / "iam")]
        if self.tls:
            argv += ["--cert", str(self.tls.cert), "--key", str(self.tls.key)]
        if self.virtual_domain:
            argv += ["--virtual-domain", self.virtual_domain]
        argv += ["posix", str(self.data)]
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        self.process = ManagedProcess("versitygw", argv, self.root / "versitygw.log", env=env)
        wait_until(self._answers, f"versitygw on {self.endpoint}", timeout=30, interval=0.05)
        return self

    def _answers(self) -> bool:
        assert self.process is not None
        self.process.check_alive()
        try:
            conn = (
                http.client.HTTPSConnection(
                    self.host,
                    self.port,
                    timeout=1,
                    context=ssl.create_default_context(cafile=str(self.tls.ca_pem)),
                )
                if self.tls
                else http.client.HTTPConnection(self.host, self.port, timeout=1)
            )
            conn.request("GET", "/")
            conn.getresponse().read()
            conn.close()
        except OSError:
            return False
        return True  # any answer (403 to an unsigned request) means it serves

    def put(self, bucket: str, key: str, source: Path) -> str:
        """Make ``source`` the object ``bucket/key``; its path-style URL."""
        target = self.data / bucket / key
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        try:
            os.link(source, target)
        except OSError:
            shutil.copyfile(source, target)
        return self.url(bucket, key)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
