"""The tenant roles of deploy/13-rbac-tenants.yaml are CDI's (``rbac.go``; reference scenarios
2.13, 3945-3947): admin and edit manage CDI's namespaced kinds and ask upload tokens, view reads
them, all three may clone from where they are bound; each is folded into its built-in role.
The one difference from CDI, no ``cdiconfigs`` in view, is asserted too (docs/security.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cdi.api.cloneauth import clone_checks

TENANTS = Path(__file__).resolve().parents[2] / "deploy" / "13-rbac-tenants.yaml"
MANAGED = {
    "datavolumes",
    "dataimportcrons",
    "datasources",
    "volumeimportsources",
    "volumeuploadsources",
    "volumeclonesources",
}
Grant = tuple[str, str, str]
# CDI's "*": every verb a custom resource serves (deploy/ spells them out), and the one verb of
# the token API (docs/upload.md: discovery says create only)
EVERY_VERB = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")


def roles() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(TENANTS.read_text()) if d}


def grants(role: dict[str, Any]) -> set[Grant]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("built_in", ["admin", "edit", "view"])
def test_each_role_is_aggregated_into_its_built_in_role_only(built_in: str) -> None:
    labels = roles()[f"cdi.kubevirt.io:{built_in}"]["metadata"]["labels"]
    aggregate = {k for k, v in labels.items() if k.startswith("rbac.authorization.k8s.io/")}
    assert aggregate == {f"rbac.authorization.k8s.io/aggregate-to-{built_in}"}
    assert labels[f"rbac.authorization.k8s.io/aggregate-to-{built_in}"] == "true"


@pytest.mark.parametrize("name", ["cdi.kubevirt.io:admin", "cdi.kubevirt.io:edit"])
def test_admin_and_edit_manage_cdis_kinds_and_ask_upload_tokens(name: str) -> None:
    expected = {("cdi.kubevirt.io", r, v) for r in MANAGED for v in EVERY_VERB} | {
        ("cdi.kubevirt.io", "datavolumes/source", "create"),
        ("upload.cdi.kubevirt.io", "uploadtokenrequests", "create"),
    }
    assert grants(roles()[name]) == expected


def test_view_reads_cdis_kinds_and_may_clone_but_not_cdiconfig() -> None:
    readable = MANAGED | {"objecttransfers", "storageprofiles"}
    expected = {("cdi.kubevirt.io", r, v) for r in readable for v in ("get", "list", "watch")}
    expected.add(("cdi.kubevirt.io", "datavolumes/source", "create"))
    given = grants(roles()["cdi.kubevirt.io:view"])
    assert given == expected
    assert not any(resource == "cdiconfigs" for _, resource, _ in given)


def test_the_clone_right_granted_is_the_one_clone_authorization_asks() -> None:
    (explicit,), _ = clone_checks(False, "src")
    asked = (explicit.group, f"{explicit.resource}/{explicit.subresource}", explicit.verb)
    for name in ("cdi.kubevirt.io:admin", "cdi.kubevirt.io:edit", "cdi.kubevirt.io:view"):
        assert asked in grants(roles()[name]), name
