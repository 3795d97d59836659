"""Proxy credentials for the importer pod, rendered as a Secret instead of environment values.

CDIConfig ``importProxy`` URLs may carry credentials (``http://user:pass@proxy:3128``). CDI
copies them into the importer pod's ``http_proxy``/``https_proxy`` env, where anyone who may read
pods in the tenant's namespace sees them (``view`` is enough; Secrets need more). Here the pod's
env gets the proxy URLs *without* userinfo, and the userinfo alone goes into a per-import Secret
in the DataVolume's namespace, owned by the DataVolume (collected with it), mounted read-only at
``PROXY_AUTH_DIR``; the importer puts it back into the URLs (``importer.config``).

Only the userinfo is in the Secret, never the proxy's address: the importer trusts the proxy
the operator configured (it is not checked by the network policy), so the address must come
from the pod spec, which tenants cannot change, and a tenant who edits the Secret can at most
break their own import's proxy login. The Secret's name carries a digest of its content, so a
changed ``importProxy`` yields a new Secret and the controller only ever needs to create one.
"""

from __future__ import annotations

import base64
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


def render_proxy_auth_secret(
    dv: DataVolume, claim: str, config: CDIConfig
) -> dict[str, Any] | None:
    """The Secret holding the proxies' credentials for importing into ``claim``; None when the
    proxies have none."""
    creds = proxy_credentials(config.import_proxy)
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
