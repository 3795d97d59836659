"""CDIConfig ``status.uploadProxyCA`` (CDI's field, read by ``cdi upload``): the upload proxy
publishes its serving CA in the ConfigMap ``cdi-uploadproxy-signer-bundle`` and the controller
copies it into CDIConfig's status; a client that trusts only that bundle verifies the proxy
under its Service name."""

from __future__ import annotations

import socket
import ssl

import pytest

from testkit.kubeclient import Kube
from testkit.product import Product
from testkit.waiting import wait_until

pytestmark = pytest.mark.integration
CONFIG = "/apis/cdi.kubevirt.io/v1beta1/cdiconfigs/config"


def test_cdiconfig_publishes_the_upload_proxys_ca_and_it_verifies_the_proxy(
    kube: Kube, product: Product
) -> None:
    bundle = kube.get("/api/v1/namespaces/cdi/configmaps/cdi-uploadproxy-signer-bundle")
    published = bundle["data"]["ca-bundle.crt"]
    assert "BEGIN CERTIFICATE" in published
    ca = wait_until(
        lambda: (kube.get(CONFIG).get("status") or {}).get("uploadProxyCA"),
        "CDIConfig status.uploadProxyCA",
        90,  # the controller looks again every 60 s
    )
    assert ca == published
    ip = kube.get("/api/v1/namespaces/cdi/services/cdi-uploadproxy")["spec"]["clusterIP"]
    trusting = ssl.create_default_context(cadata=ca)  # nothing else: not the system's store
    with socket.create_connection((ip, 443), timeout=10) as raw:
        with trusting.wrap_socket(raw, server_hostname="cdi-uploadproxy.cdi.svc") as tls:
            assert tls.version() in ("TLSv1.2", "TLSv1.3")
    stranger = ssl.create_default_context()  # the system's CAs only: the proxy is not theirs
    with socket.create_connection((ip, 443), timeout=10) as raw:
        with pytest.raises(ssl.SSLCertVerificationError):
            stranger.wrap_socket(raw, server_hostname="cdi-uploadproxy.cdi.svc")
