"""How an import reaches a credentialed ``importProxy``: through the relay, with a ticket.

When CDIConfig ``importProxy`` URLs carry credentials, the importer is pointed at the import
proxy relay (Service ``cdi/cdi-import-proxy``, ``cdi.importproxy``) instead, and its proxy
userinfo is a ticket the relay accepts until it expires (``cdi.importproxy.ticket``), one per
attempt (valid 24 hours from the start of the 10-minute slot it was issued in), signed with
the key in Secret ``cdi/cdi-import-proxy-key`` (made by whichever of the controller and the
relay needs it first). The password itself never leaves the ``cdi``
namespace (S4, ``docs/security.md``). Without credentials nothing changes: the importer dials
the operator's proxy directly, and no Secret is made.

The relay's address is its Service's ClusterIP, read when an attempt starts (no cluster DNS is
needed, as for the upload proxy's dial of upload servers); a relay Service without one is a
``RenderError`` with its own reason, and the attempt waits: credentials are never copied out
as a fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

from cdi.api.config import CDIConfig
from cdi.controller.flavours import Claim, FlavourDeps
from cdi.importproxy.ticket import issue
from cdi.kube.client import SECRETS, SERVICES
from cdi.kube.shared_key import ensure_shared_key
from cdi.render import RenderError
from cdi.render.proxy_auth import (
    proxy_credentials,
    relayed,
    render_proxy_auth_secret,
    with_import_proxy,
)

REASON_RELAY_UNAVAILABLE = "ImportProxyRelayUnavailable"
TICKET_GRID = 600.0  # s


@dataclass(frozen=True)
class RelaySettings:
    namespace: str = "cdi"  # of the relay's Service and the ticket key Secret
    service: str = "cdi-import-proxy"
    port: int = 3128
    key_secret: str = "cdi-import-proxy-key"
    ticket_lifetime: float = 24 * 3600.0  # s; a new attempt gets a new ticket


class ProxyRelay:
    """The importer's proxy settings for one attempt."""

    def __init__(self, deps: FlavourDeps, settings: RelaySettings) -> None:
        self.deps, self.settings = deps, settings
        self._key: bytes | None = None

    async def importer_proxy(self, claim: Claim) -> tuple[str | None, CDIConfig]:
        """(the proxy-auth Secret to mount, or None; the CDIConfig to render the pod from)."""
        config = claim.cdi_config
        if not proxy_credentials(config.import_proxy):
            return None, config
        url = await self._relay_url()
        key = await self._ticket_key()
        # issued on a 10-minute grid: the reconciles of one attempt that race its pod's
        # create make the same ticket, so the same Secret (its name is a digest of it)
        issued = self.deps.clock() // TICKET_GRID * TICKET_GRID
        ticket = issue(claim.dv.namespace, claim.name, issued, self.settings.ticket_lifetime)
        secret = render_proxy_auth_secret(claim.dv, claim.name, config, ticket.userinfo(key))
        assert secret is not None  # there are credentials
        # None: the same ticket's Secret (same content, same name) exists
        await self.deps.kube.create_if_absent(SECRETS, secret, claim.dv.namespace)
        proxy = relayed(config.import_proxy, url)
        return str(secret["metadata"]["name"]), with_import_proxy(config, proxy)

    async def _ticket_key(self) -> bytes:
        if self._key is None:
            s = self.settings
            self._key = await self.deps.kube.call(
                ensure_shared_key, self.deps.kube.sync, s.namespace, s.key_secret
            )
        return self._key

    async def _relay_url(self) -> str:
        s = self.settings
        svc = await self.deps.kube.get_or_none(SERVICES, s.service, s.namespace)
        ip = ((svc or {}).get("spec") or {}).get("clusterIP")
        if not ip or ip == "None":
            raise RenderError(
                f"importProxy has credentials, and the import proxy relay Service "
                f"{s.namespace}/{s.service} that holds them for importers has no address",
                REASON_RELAY_UNAVAILABLE,
            )
        host = f"[{ip}]" if ":" in str(ip) else str(ip)
        return f"http://{host}:{s.port}"
