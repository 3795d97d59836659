"""The per-import copy of CDIConfig ``importProxy.trustedCAProxy`` (CDI ``import-proxy-cm-<pvc>``).

The operator keeps the CA bundle of the import proxy in a ConfigMap of the CDI namespace and
names it in ``importProxy.trustedCAProxy``. A pod mounts only ConfigMaps of its own namespace,
so, as CDI does, the controller copies the bundle's data beside each import as
``import-proxy-cm-<claim>`` (``cdi.render.naming``) and the importer pod mounts it at
``/proxycerts/`` (``IMPORTER_PROXY_CERT_DIR``). CDI owns the copy by the importer pod; here it
is owned by the DataVolume, like the pods and the proxy-auth Secret (``cdi.render.owner``), so
it exists before the pod that mounts it and goes with the DataVolume.

Only ``data`` is copied (CA certificates are text), never ``binaryData``, labels or
annotations of the operator's object.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.types import DataVolume
from cdi.render.naming import proxy_ca_config_map_name
from cdi.render.owner import datavolume_reference


def render_proxy_ca_config_map(
    dv: DataVolume, claim: str, data: Mapping[str, Any]
) -> dict[str, Any]:
    """The copy of the trustedCAProxy bundle ``data`` for importing into ``claim``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": proxy_ca_config_map_name(claim),
            "namespace": dv.namespace,
            "ownerReferences": [datavolume_reference(dv)],
        },
        "data": {str(k): str(v) for k, v in data.items()},
    }
