"""The DataVolume mutating webhook: record who asked, fill defaults, as an RFC 6902 JSON patch.

Who created a DataVolume matters later: a clone from another namespace is allowed only if that
user may read the source (reference §4.5). CDI decides at admission and stores a signed token;
we also keep the requester in annotations the controller can re-check with a
SubjectAccessReview (``cdi.api.requester.Requester.record``: username, groups as a JSON list,
and the ``uid`` and ``extra`` the API server authenticated, when there are any). The webhook
owns those keys: on create it overwrites whatever the user wrote, on update it restores the
values recorded at creation, so nobody can claim to be someone else.
With a signing key (``cdi.api.requester``) it also writes ``storage.requester.signature``, so
the controller can tell a record the webhook wrote from one a tenant wrote while the webhook
was not in the path; without a key it removes any signature the user supplied.

Defaults filled (on create and update alike, so an update that omits them is no spec change):
``spec.contentType: kubevirt`` and, for a registry URL source, ``pullMethod: pod``.

Pure: the caller passes the decoded objects, the request's ``userInfo`` and namespace (both set
by the API server; the server only gets here for an authenticated caller,
``cdi.webhooks.callers``); what comes back is the patch list for ``AdmissionResponse.patch``
(empty when nothing changes).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cdi.api.constants import ContentType, RegistryPullMethod
from cdi.api.requester import ANN_REQUESTER_SIGNATURE, RECORD_KEYS, Requester, signed_name

Patch = list[dict[str, Any]]
Signer = Callable[[str, str, Mapping[str, str]], str]  # (namespace, name, record) -> signature
REQUESTER_KEYS = (*RECORD_KEYS, ANN_REQUESTER_SIGNATURE)
UserInfo = Requester  # ``AdmissionRequest.userInfo``: ``UserInfo.from_dict``


def escape(key: str) -> str:
    """A JSON-pointer token (RFC 6901): annotation keys contain '/'."""
    return key.replace("~", "~0").replace("/", "~1")


def mutate_datavolume(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: UserInfo,
    signer: Signer | None = None,
    namespace: str = "",
) -> Patch:
    """``namespace``: the admission request's (the API server's word, not the object's)."""
    return requester_patch(new, old, user, signer, namespace) + _defaults_patch(new)


def requester_patch(
    new: Mapping[str, Any],
    old: Mapping[str, Any] | None,
    user: UserInfo,
    signer: Signer | None,
    namespace: str,
) -> Patch:
    """The requester record alone (DataSources carry one too: ``datasource_mutation``)."""
    meta = new.get("metadata") or {}
    annotations = meta.get("annotations")
    current = dict(annotations or {})
    wanted: dict[str, str | None]
    if old is None:
        record = user.record()
        signature = signer(namespace, signed_name(meta), record) if signer else None
        wanted = {key: record.get(key) for key in RECORD_KEYS}
        wanted[ANN_REQUESTER_SIGNATURE] = signature
    else:
        recorded = (old.get("metadata") or {}).get("annotations") or {}
        wanted = {key: recorded.get(key) for key in REQUESTER_KEYS}
    patch: Patch = []
    if annotations is None and any(v is not None for v in wanted.values()):
        patch.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    for key, value in wanted.items():
        path = f"/metadata/annotations/{escape(key)}"
        if value is None and key in current:
            patch.append({"op": "remove", "path": path})
        elif value is not None and current.get(key) != value:
            patch.append({"op": "add", "path": path, "value": value})
    return patch


def _defaults_patch(new: Mapping[str, Any]) -> Patch:
    spec = new.get("spec")
    if not isinstance(spec, Mapping):
        return []
    patch: Patch = []
    if not spec.get("contentType"):
        patch.append({"op": "add", "path": "/spec/contentType", "value": str(ContentType.KUBEVIRT)})
    registry = (spec.get("source") or {}).get("registry")
    if isinstance(registry, Mapping) and registry.get("url") and not registry.get("pullMethod"):
        patch.append(
            {
                "op": "add",
                "path": "/spec/source/registry/pullMethod",
                "value": str(RegistryPullMethod.POD),
            }
        )
    return patch


def apply_patch(obj: Mapping[str, Any], patch: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Apply the add/remove operations this module emits (tests and dry runs use it)."""
    doc: dict[str, Any] = json.loads(json.dumps(obj))
    for op in patch:
        *parents, last = [
            t.replace("~1", "/").replace("~0", "~") for t in str(op["path"]).split("/")[1:]
        ]
        target = doc
        for token in parents:
            target = target[token]
        if op["op"] == "add":
            target[last] = op["value"]
        elif op["op"] == "remove":
            del target[last]
        else:
            raise ValueError(f"unsupported op {op['op']!r}")
    return doc
