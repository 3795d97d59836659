"""Imports through an ``https://`` proxy on loopback (``importer.sources.proxy_tls``): a real TLS
forward proxy whose certificate a private CA signed (``testkit.tlsproxy``), trusted only through
``proxy_ca_files`` (CDIConfig ``importProxy.trustedCAProxy`` in the pod). An https destination
goes TLS in TLS through a CONNECT tunnel, an http one as absolute-form requests over the
proxy's TLS; without the proxy's CA the import fails at once, permanently, naming the setting,
and the proxy opens nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from importer.sources.http import ProxyConfig
from testkit.pki import CertificateAuthority
from testkit.registry import Tls
from testkit.tlsproxy import TlsForwardProxy
from tests.component.conftest import ImageFactory, same_content
from tests.component.helpers import import_url


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[TlsForwardProxy]:
    tls = Tls.make(tmp_path / "proxy-tls", CertificateAuthority("private-proxy-ca"))
    server = TlsForwardProxy(tls).start()
    yield server
    server.stop()


@pytest.mark.parametrize("kind", ["https", "https-close", "http"])
async def test_an_import_through_an_https_proxy_trusted_by_its_private_ca(
    kind: str,
    proxy: TlsForwardProxy,
    origins: dict[str, tuple[str, list[str]]],
    target_tls: Tls,
    images: ImageFactory,
    tmp_path: Path,
) -> None:
    image = images.make("qcow2")
    origin, seen = origins[kind]
    result = await import_url(
        f"{origin}/{image.path.name}",
        tmp_path / "disk.img",
        ca_files=(str(target_tls.ca_pem),),
        proxy=ProxyConfig(http=proxy.url, https=proxy.url),
        proxy_ca_files=(str(proxy.ca_pem),),
    )
    assert result.reason == "Completed", result
    assert same_content(tmp_path / "disk.img", image.reference)
    assert f"GET /{image.path.name}" in seen
    port = origin.rsplit(":", 1)[1]
    if kind.startswith("https"):
        assert proxy.tunnels and set(proxy.tunnels) == {f"127.0.0.1:{port}"}
        assert proxy.forwarded == []
    else:
        assert proxy.tunnels == [] and proxy.forwarded
        assert all(f"http://127.0.0.1:{port}/" in line for line in proxy.forwarded)


async def test_an_untrusted_proxy_fails_at_once_naming_trusted_ca_proxy(
    proxy: TlsForwardProxy,
    origins: dict[str, tuple[str, list[str]]],
    target_tls: Tls,
    images: ImageFactory,
    tmp_path: Path,
) -> None:
    image = images.make("raw")
    origin, seen = origins["https"]
    result = await import_url(
        f"{origin}/{image.path.name}",
        tmp_path / "disk.img",
        ca_files=(str(target_tls.ca_pem),),  # the destination's CA is not the proxy's
        proxy=ProxyConfig(https=proxy.url),
    )
    assert result.reason == "SourceUnavailable" and not result.transient, result
    assert "import proxy" in result.message and "trustedCAProxy" in result.message
    assert proxy.url in result.message
    assert proxy.tunnels == [] and seen == []
    assert not (tmp_path / "disk.img").exists()
