"""Static identities of the test cluster and the kubeconfig files that carry them.

The API server reads a static token file: one admin in ``system:masters`` and unprivileged users
that RBAC grants nothing, for authorization tests. Each identity gets its own kubeconfig file
(and context in the shared one) so a test can act as that user with the official client.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from pathlib import Path

import yaml

ADMIN = "admin"
UNPRIVILEGED = ("alice", "bob", "carol")


@dataclass(frozen=True)
class Identity:
    user: str
    token: str
    groups: tuple[str, ...] = ()


def default_identities() -> dict[str, Identity]:
    ids = {ADMIN: Identity(ADMIN, secrets.token_hex(16), ("system:masters",))}
    for user in UNPRIVILEGED:
        ids[user] = Identity(user, secrets.token_hex(16), ("testkit:users",))
    return ids


def write_token_file(path: Path, identities: dict[str, Identity]) -> Path:
    """The API server's --token-auth-file: ``token,user,uid,"group1,group2"`` per line."""
    lines = [f'{i.token},{i.user},uid-{i.user},"{",".join(i.groups)}"' for i in identities.values()]
    path.write_text("\n".join(lines) + "\n")
    path.chmod(0o600)
    return path


def write_kubeconfig(
    path: Path, server: str, ca_pem: bytes, identities: list[Identity], current: str
) -> Path:
    """A kubeconfig with one user and one context per identity, named after the user."""
    ca = base64.b64encode(ca_pem).decode()
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "testkit", "cluster": {"server": server, "certificate-authority-data": ca}}
        ],
        "users": [{"name": i.user, "user": {"token": i.token}} for i in identities],
        "contexts": [
            {"name": i.user, "context": {"cluster": "testkit", "user": i.user}} for i in identities
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path
