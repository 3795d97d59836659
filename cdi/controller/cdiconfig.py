"""The CDIConfig reconciler: the cluster singleton ``config`` exists and its status is current.

There is one key, ``config``. CDI's operator creates the object; we have no operator, so this
reconciler creates it (``spec: {}``) when it is missing. Then it computes the status
(``cdi.render.cdiconfig``) from the spec, the StorageClasses (informer cache; a class event
enqueues ``config`` so per-class overheads follow new classes) and the deployed upload proxy
(Ingresses and the ``cdi-uploadproxy`` Service in the CDI namespace, read fresh; the proxy's
serving CA from the ConfigMap ``cdi-uploadproxy-signer-bundle`` it publishes, as CDI's
``uploadProxyCA``), and writes it once, only when it differs, by replacing the status
subresource.

Everything else reads settings from that status (``CDIConfig`` prefers status over spec), so a
change to ``spec.filesystemOverhead`` reaches the next PVC rendered once it is written here. The
upload proxy's objects are not watched, so the key comes back every ``recheck`` seconds.

The CDI resource in force (``cdi.api.cdiresource``) adds what it sets for the whole product to
the status, where the renderers read it: ``workload`` (worker pod placement),
``cloneStrategyOverride`` and ``certConfig`` (``cdi.render.cdiconfig.from_cdi_resource``).

What wakes it (``WATCHES``): any StorageClass, CDIConfig or CDI resource change maps to
``config``, which is also queued at start (created if missing, before any event).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from cdi.api.cdiresource import active
from cdi.api.codec import SchemaError
from cdi.api.config import CDIConfig
from cdi.api.constants import CDICONFIG_NAME
from cdi.kube.client import CDI_CONFIGS, CDIS, SERVICES, STORAGE_CLASSES, AsyncKube, Resource
from cdi.kube.errors import Forbidden, NotFound
from cdi.kube.watches import Maps, Watches
from cdi.kube.workqueue import Result
from cdi.pki.upload import CA_BUNDLE_KEY, CONFIG_MAPS, PROXY_CA_BUNDLE
from cdi.render import cdiconfig as render

log = logging.getLogger(__name__)

JSON = dict[str, Any]
INGRESSES = Resource("networking.k8s.io", "v1", "ingresses", "Ingress")


def singleton(_obj: JSON) -> list[str]:
    return [CDICONFIG_NAME]


WATCHES = Watches(
    (Maps(STORAGE_CLASSES, singleton), Maps(CDI_CONFIGS, singleton), Maps(CDIS, singleton)),
    initial=(CDICONFIG_NAME,),
)


class Store(Protocol):
    def items(self) -> list[JSON]: ...


class CDIConfigReconciler:
    def __init__(
        self,
        kube: AsyncKube,
        storage_classes: Store,
        namespace: str,
        recheck: float = 60.0,
        cdis: Store | None = None,  # the CDI resources (None: none, as without the CRD)
    ) -> None:
        self.kube = kube
        self.storage_classes = storage_classes
        self.cdis = cdis
        self.namespace = namespace
        self.recheck = recheck

    async def reconcile(self, key: str) -> Result:
        if key != CDICONFIG_NAME:
            return Result()
        obj = await self.kube.get_or_none(CDI_CONFIGS, CDICONFIG_NAME)
        if obj is None:
            obj = await self.kube.create_if_absent(CDI_CONFIGS, render.new_config())
            if obj is None:
                return Result(requeue_after=0.5)
        try:
            config = CDIConfig.from_dict(obj)
        except SchemaError as exc:
            log.warning("CDIConfig %s: unparsable: %s", CDICONFIG_NAME, exc)
            return Result(requeue_after=self.recheck)
        classes = [str(sc["metadata"]["name"]) for sc in self.storage_classes.items()]
        proxy = render.upload_proxy_url(config, *await self._upload_proxy())
        wanted = render.desired_status(config, classes, proxy, await self._upload_proxy_ca())
        wanted.update(render.from_cdi_resource(active(self.cdis.items() if self.cdis else [])))
        if wanted != (obj.get("status") or {}):
            await self.kube.replace(CDI_CONFIGS, {**obj, "status": wanted}, sub="status")
        return Result(requeue_after=self.recheck)

    async def _upload_proxy_ca(self) -> str | None:
        """The CA bundle the upload proxy published (``cdi.upload.kubestore.ProxyCertStore``);
        None before it did, or when we may not look."""
        try:
            found = await self.kube.get_or_none(CONFIG_MAPS, PROXY_CA_BUNDLE, self.namespace)
        except Forbidden:
            return None
        return ((found or {}).get("data") or {}).get(CA_BUNDLE_KEY) or None

    async def _upload_proxy(self) -> tuple[list[JSON], JSON | None]:
        """Ingresses and the proxy Service in the CDI namespace; none when we may not look."""
        try:
            ingresses = (await self.kube.list(INGRESSES, self.namespace)).get("items") or []
        except (NotFound, Forbidden):
            ingresses = []
        try:
            service = await self.kube.get_or_none(
                SERVICES, render.UPLOAD_PROXY_SERVICE, self.namespace
            )
        except Forbidden:
            service = None
        return list(ingresses), service
