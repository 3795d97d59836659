"""A random key that several components share through one Secret, made by whoever needs it first.

The requester record the webhook signs (``cdi.api.requester``) is checked by the controller, so
both need the same HMAC key, and no key may be checked into ``deploy/``. Each reads the Secret
at start-up (``--requester-key-secret``); if it does not exist yet, it creates it with 32 random
bytes, hex-encoded (so the same value works as a ``--requester-key-file`` that a file read and
``strip()`` would leave unchanged). Two replicas racing both try to create; the API server lets
one win (409 for the other, which then reads the winner's key), so every process ends with the
same key. Only ``get`` on the one Secret and ``create`` in the component's namespace are
needed (deploy/10-rbac-controller.yaml, deploy/11-rbac-webhook.yaml).
"""

from __future__ import annotations

import base64
import secrets

from cdi.kube.client import SECRETS, Kube

DATA_KEY = "key"
KEY_BYTES = 32


def _decode(secret: dict[str, object] | None) -> bytes | None:
    data = secret.get("data") if secret else None
    value = data.get(DATA_KEY) if isinstance(data, dict) else None
    if not isinstance(value, str):
        return None
    key = base64.b64decode(value).strip()
    return key or None


def ensure_shared_key(kube: Kube, namespace: str, name: str, attempts: int = 5) -> bytes:
    """The key in Secret ``namespace/name``, created with a fresh random key if missing."""
    for _ in range(attempts):
        found = _decode(kube.get_or_none(SECRETS, name, namespace))
        if found is not None:
            return found
        key = secrets.token_hex(KEY_BYTES).encode("ascii")
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": name, "namespace": namespace},
            "data": {DATA_KEY: base64.b64encode(key).decode("ascii")},
        }
        if kube.create_if_absent(SECRETS, body) is None:
            continue  # another process created it first: read theirs
        return key
    raise RuntimeError(f"Secret {namespace}/{name} exists without a usable {DATA_KEY!r}")
