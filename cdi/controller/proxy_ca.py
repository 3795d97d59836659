"""How an import trusts an ``https://`` import proxy: CDIConfig ``importProxy.trustedCAProxy``
copied beside the import, at the start of each attempt.

The ConfigMap the setting names is read from the CDI namespace (the controller's; one GET per
attempt, so a rotated CA reaches the next attempt) and written into the DataVolume's namespace
as ``import-proxy-cm-<claim>`` (``cdi.render.proxy_ca``): created, or, when the name is taken
(an earlier attempt's copy, an older bundle, or an object someone else put at CDI's name),
replaced by the copy, so what the importer mounts is always the operator's current bundle and
nothing else. A setting that names a ConfigMap that does not exist is a ``RenderError`` with
its own reason: the attempt waits and says why, rather than importing without the trust the
operator asked for.
"""

from __future__ import annotations

from cdi.api.config import CDIConfig
from cdi.controller.flavours import Claim, FlavourDeps
from cdi.kube.client import CONFIG_MAPS
from cdi.kube.errors import Conflict
from cdi.render import RenderError
from cdi.render.proxy_ca import render_proxy_ca_config_map

REASON_PROXY_CA_MISSING = "ImportProxyCAMissing"


class ProxyCA:
    """The importer's copy of the import proxy's CA bundle for one attempt."""

    def __init__(self, deps: FlavourDeps, namespace: str) -> None:
        self.deps, self.namespace = deps, namespace

    async def copy_for(self, claim: Claim, config: CDIConfig) -> str | None:
        """The name of the copy to mount, or None when importProxy names no trusted CA."""
        proxy = config.import_proxy
        source = proxy.trusted_ca_proxy if proxy is not None else None
        if not source:
            return None
        kube = self.deps.kube
        found = await kube.get_or_none(CONFIG_MAPS, source, self.namespace)
        if found is None:
            raise RenderError(
                f"importProxy.trustedCAProxy names ConfigMap {self.namespace}/{source}, "
                "which does not exist",
                REASON_PROXY_CA_MISSING,
            )
        copy = render_proxy_ca_config_map(claim.dv, claim.name, found.get("data") or {})
        try:
            await kube.create(CONFIG_MAPS, copy, claim.dv.namespace)
        except Conflict:
            await kube.replace(CONFIG_MAPS, copy)
        return str(copy["metadata"]["name"])
