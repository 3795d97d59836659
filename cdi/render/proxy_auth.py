"""Proxy settings for the importer pod: the proxy URLs in its env, their userinfo in a Secret.

CDIConfig ``importProxy`` URLs may carry credentials (``http://user:pass@proxy:3128``). CDI
copies them into the importer pod's ``http_proxy``/``https_proxy`` env, where anyone who may read
pods in the tenant's namespace sees them (``view`` is enough). Copying them into a Secret in
that namespace instead (what we did before issue 23) still hands them to anyone with ``edit``,
who reads Secrets and execs into pods: a cluster-wide password disclosed to every tenant who
imports (S4, ``docs/security.md``). So the password never leaves the ``cdi`` namespace: every
importProxy URL that has credentials is replaced, for the importer, by the address of the
import proxy relay (``cdi.importproxy``), which adds them, and the userinfo the importer sends
the relay is a per-import ticket (``cdi.importproxy.ticket``) that expires.

The pod's env gets the proxy URLs without userinfo; the userinfo (the ticket) goes into a
per-import Secret in the DataVolume's namespace, owned by the DataVolume (collected with it),
mounted read-only at ``PROXY_AUTH_DIR``; the importer puts it back into the URLs
(``importer.config``), as before. Only the userinfo is in the Secret, never the proxy's
address: the importer trusts the proxy the operator configured (it is not checked by the network
policy), so the address must come from the pod spec, which tenants cannot change. The Secret's
name carries a digest of its content, so each ticket gets its own Secret and the controller only
ever needs to create one.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from cdi.api.config import CDIConfig, ImportProxy
from cdi.api.constants import SECRET_KEY_PROXY_HTTP, SECRET_KEY_PROXY_HTTPS
from cdi.api.types import DataVolume
from cdi.render.naming import proxy_auth_secret_name
from cdi.render.owner import datavolume_reference


def without_userinfo(url: str | None) -> str | None:
    """A proxy URL with its ``user:password@`` removed (None and "" stay None)."""
    if not url:
        return None
    parts = urlsplit(url if "://" in url else f"http://{url}")
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def userinfo(url: str | None) -> str | None:
    """The raw (still percent-encoded) ``user:password`` of a proxy URL, if it has one."""
    if not url:
        return None
    netloc = urlsplit(url if "://" in url else f"http://{url}").netloc
    info, at, _ = netloc.rpartition("@")
    return info if at else None


def proxy_credentials(proxy: ImportProxy | None) -> dict[str, str]:
    """Secret key -> userinfo of each importProxy URL that has credentials."""
    if proxy is None:
        return {}
    found = {
        SECRET_KEY_PROXY_HTTP: userinfo(proxy.http_proxy),
        SECRET_KEY_PROXY_HTTPS: userinfo(proxy.https_proxy),
    }
    return {key: value for key, value in found.items() if value}


def relayed(proxy: ImportProxy | None, relay_url: str) -> ImportProxy | None:
    """The importProxy the importer is given: each URL with credentials replaced by the
    relay's address (the relay adds the credentials), the others as configured."""
    if proxy is None:
        return None
    return dataclasses.replace(
        proxy,
        http_proxy=relay_url if userinfo(proxy.http_proxy) else proxy.http_proxy,
        https_proxy=relay_url if userinfo(proxy.https_proxy) else proxy.https_proxy,
    )


def with_import_proxy(config: CDIConfig, proxy: ImportProxy | None) -> CDIConfig:
    """``config`` whose ``import_proxy`` (status first, as the property reads it) is ``proxy``."""
    status = config.status and dataclasses.replace(config.status, import_proxy=proxy)
    return dataclasses.replace(
        config, spec=dataclasses.replace(config.spec, import_proxy=proxy), status=status
    )


def render_proxy_auth_secret(
    dv: DataVolume, claim: str, config: CDIConfig, ticket: str
) -> dict[str, Any] | None:
    """The Secret holding the importer's proxy userinfo for importing into ``claim``: the
    relay ``ticket`` for each importProxy URL that has credentials (never the credentials);
    None when none has."""
    creds = {key: ticket for key in proxy_credentials(config.import_proxy)}
    if not creds:
        return None
    digest = hashlib.sha256(repr(sorted(creds.items())).encode()).hexdigest()[:10]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": proxy_auth_secret_name(claim, digest),
            "namespace": dv.namespace,
            "ownerReferences": [datavolume_reference(dv)],
        },
        "data": {k: base64.b64encode(v.encode()).decode("ascii") for k, v in creds.items()},
    }
