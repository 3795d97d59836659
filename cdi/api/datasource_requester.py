"""Who created a DataSource, signed by the mutating webhook as a DataVolume's creator is.

A DataSource's status answers questions about its source (does the claim exist, what is its
DataVolume's phase, which ``*.kubevirt.io/*`` labels does it carry), and its source may be in
another namespace. The controller reads that source with its own cluster-wide rights, so it
answers only for a creator who may read the source themselves (``cdi.controller.datasource``,
docs/security.md N7), and it learns who the creator was from the same signed requester record
as DataVolumes carry (``cdi.api.requester``), written by the webhook
(``cdi.webhooks.datasource_mutation``).

One difference: the signed name is ``datasources/<name>`` (``/`` never occurs in an object's
name), so a DataSource's signature is never valid on a DataVolume of the same namespace and
name, nor a DataVolume's on a DataSource: a record proves who created *this kind* of object.
"""

from __future__ import annotations

from collections.abc import Mapping

from cdi.api.requester import Requester, trusted_requester

SIGNED_NAME_PREFIX = "datasources/"


def signed_metadata(metadata: Mapping[str, object]) -> dict[str, object]:
    """The DataSource's metadata as the signature sees it: name and generateName prefixed."""
    out = dict(metadata)
    for key in ("name", "generateName"):
        if out.get(key):
            out[key] = f"{SIGNED_NAME_PREFIX}{out[key]}"
    return out


def trusted_datasource_requester(obj: Mapping[str, object], key: bytes | None) -> Requester | None:
    """The creator of DataSource ``obj`` (as read from the API server) if the webhook signed it."""
    meta = obj.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    return trusted_requester({**obj, "metadata": signed_metadata(meta)}, key)
