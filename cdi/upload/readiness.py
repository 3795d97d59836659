"""Is this PVC ready to take an upload? CDI's proxy checks, in CDI's order, with CDI's messages.

``upload_target`` is the pure part: given the PVC the token names (and, for a populator PVC,
its PVC'), it returns the claim to upload into, ``None`` while the upload pod is not ready,
or raises the refusal CDI's ``uploadReady`` gives (all 503, except a token bound to an earlier
incarnation of the PVC: 401, our addition). ``wait_for_upload_target`` polls it through the
injected ``UploadTargets`` (1 s interval, 10 s limit by default, like CDI) and answers
``context deadline exceeded`` when the pod never becomes ready, the text CDI's users see.

``UploadTargets`` is the seam to the cluster: it finds PVCs and says where a PVC's upload
server listens (the Service ``cdi-upload-<pvc>`` in the PVC's namespace, created by the
upload flavour). ``cdi.upload.kubestore.KubeUploadTargets`` is the cluster implementation
(it dials the Service's ClusterIP and verifies the certificate for ``cdi-upload-<pvc>.<ns>.svc``,
so no cluster DNS is needed); tests pass a table.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from cdi.api.constants import (
    ANN_POD_PHASE,
    ANN_POD_READY,
    ANN_PVC_PRIME_NAME,
    ANN_UPLOAD_REQUEST,
    KIND_VOLUME_UPLOAD_SOURCE,
)
from cdi.upload.errors import InvalidToken, UploadNotReady
from cdi.upload.token import UploadGrant

PVC = Mapping[str, Any]
_TRUE = {"1", "t", "T", "true", "TRUE", "True"}  # Go's strconv.ParseBool


@dataclass(frozen=True)
class UploadServer:
    """Where a PVC's upload server listens: ``url`` is ``https://host:port`` (no path);
    ``server_hostname`` the name its certificate must carry when ``url`` holds an address."""

    url: str
    server_hostname: str | None = None


class UploadTargets(Protocol):
    async def get_pvc(self, namespace: str, name: str) -> PVC | None: ...

    async def upload_server(self, namespace: str, pvc_name: str) -> UploadServer:
        """The PVC's upload server, or ``UploadServerUnreachable`` if it has none."""
        ...


def _annotations(pvc: PVC) -> Mapping[str, str]:
    return (pvc.get("metadata") or {}).get("annotations") or {}


def prime_name(pvc: PVC) -> str | None:
    """For a populator PVC (``dataSourceRef.kind: VolumeUploadSource``) the name of its PVC',
    "" while the populator has not named it yet; None for an ordinary PVC."""
    ref = (pvc.get("spec") or {}).get("dataSourceRef") or {}
    if ref.get("kind") != KIND_VOLUME_UPLOAD_SOURCE:
        return None
    return _annotations(pvc).get(ANN_PVC_PRIME_NAME, "")


def upload_target(grant: UploadGrant, pvc: PVC | None, prime: PVC | None) -> PVC | None:
    """The claim to upload into, None while not ready yet, or a typed refusal."""
    name = grant.name
    if pvc is None:
        raise UploadNotReady(f"rejecting Upload Request for PVC {name} that doesn't exist")
    if not grant.uid or (pvc.get("metadata") or {}).get("uid") != grant.uid:
        raise InvalidToken(f"the token was issued for an earlier PVC named {name}")
    target = pvc
    if prime_name(pvc) is not None:
        if prime is None:
            raise UploadNotReady(
                f"rejecting Upload Request for PVC {name}, PVC' wasn't created yet"
            )
        target = prime
    annotations = _annotations(target)
    if ANN_UPLOAD_REQUEST not in annotations:
        raise UploadNotReady(f"PVC {name} is not an upload target")
    if annotations.get(ANN_POD_PHASE) == "Succeeded":
        raise UploadNotReady(
            f"rejecting Upload Request for PVC {name} that already finished uploading"
        )
    return target if annotations.get(ANN_POD_READY) in _TRUE else None


async def _lookup(targets: UploadTargets, grant: UploadGrant) -> PVC | None:
    pvc = await targets.get_pvc(grant.namespace, grant.name)
    prime = None
    if pvc is not None and (name := prime_name(pvc)):
        prime = await targets.get_pvc(grant.namespace, name)
    return upload_target(grant, pvc, prime)


async def wait_for_upload_target(
    targets: UploadTargets,
    grant: UploadGrant,
    *,
    limit: float = 10.0,
    interval: float = 1.0,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> PVC:
    """Poll until the upload pod is ready (``limit`` seconds at most)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while True:
        target = await _lookup(targets, grant)
        if target is not None:
            return target
        if loop.time() + interval > deadline:
            raise UploadNotReady("context deadline exceeded")
        await sleep(interval)
