"""The DataSource mutating webhook: record who created it, signed (``/datasource-mutate``).

The controller answers in a DataSource's status about a source in another namespace only for a
creator who may read that source (docs/security.md N7), so it must know the creator, and a
DataSource's annotations are the tenant's to write. As for DataVolumes (``cdi.webhooks.mutation``)
the webhook owns ``storage.requester.username`` / ``.groups`` / ``.signature``: on create it
writes the request's user, on update it restores what was recorded at creation. The signature
binds ``datasources/<name>`` instead of the name (``cdi.api.datasource_requester``), so it is
never mistaken for a DataVolume's. Nothing else of the DataSource is changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api.datasource_requester import SIGNED_NAME_PREFIX
from cdi.webhooks.mutation import Patch, Signer, UserInfo, requester_patch


def mutate_datasource(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: UserInfo,
    signer: Signer | None = None,
    namespace: str = "",
) -> Patch:
    """The requester record's patch; ``namespace`` is the admission request's."""
    return requester_patch(new, old, user, _for_datasources(signer) if signer else None, namespace)


def _for_datasources(signer: Signer) -> Signer:
    def sign(namespace: str, name: str, record: Mapping[str, str]) -> str:
        return signer(namespace, f"{SIGNED_NAME_PREFIX}{name}", record)

    return sign
