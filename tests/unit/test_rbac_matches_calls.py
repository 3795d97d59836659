"""The RBAC in deploy/ grants each component exactly the verbs its code calls, no more, no less.

Every API call goes through ``cdi.kube.client`` (``kube.get(PODS, ...)``, ``Informer(kube,
DATAVOLUMES)``), so the calls can be read from the source: this test walks each component's
modules, resolves the first argument of every ``*kube.<verb>(...)`` call to its ``Resource``
constant (``sub="status"`` makes it the status subresource), adds list+watch for every
``Informer``, and compares the set with what the component's ServiceAccount is bound to in
``deploy/10-rbac-controller.yaml`` / ``deploy/11-rbac-webhook.yaml``. A new call without its
RBAC fails here (instead of as a 403 in a cluster), and so does a verb left in deploy/ that no
code uses any more. A call whose resource is a variable must be listed in ``INDIRECT``.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from cdi.kube.client import (
    MUTATING_WEBHOOKS,
    PODS,
    SECRETS,
    SERVICES,
    VALIDATING_WEBHOOKS,
    Resource,
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Kube / AsyncKube method -> the RBAC verb it needs
VERBS = {
    "get": "get",
    "get_or_none": "get",
    "list": "list",
    "watch": "watch",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete": "delete",
}
COMPONENTS = {
    "cdi-controller": (
        "cdi/controller",
        "cdi/kube/leader.py",
        "cdi/kube/events.py",
        "cdi/kube/shared_key.py",
        "cdi/upload/servercert.py",
    ),
    "cdi-webhook": ("cdi/admission.py", "cdi/webhooks", "cdi/kube/shared_key.py"),
}
# (module, function) -> the resources its variable-resource calls reach
INDIRECT: dict[tuple[str, str], tuple[Resource, ...]] = {
    ("cdi.admission", "_publish_to"): (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS),
    # the upload flavour's helpers, called with the server's Service and its pod/Service/Secret
    ("cdi.controller.flavours.upload", "_create_ignoring_conflict"): (SERVICES,),
    ("cdi.controller.flavours.upload", "_delete"): (PODS, SERVICES, SECRETS),
    ("cdi.controller.flavours.upload", "remove"): (PODS, SERVICES),
}
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)


def _modules(paths: tuple[str, ...]) -> Iterator[Path]:
    for rel in paths:
        path = ROOT / rel
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def _resource_names(node: ast.Call, mod: Any, where: tuple[str, str]) -> list[Resource]:
    first = node.args[0] if node.args else None
    value = getattr(mod, first.id, None) if isinstance(first, ast.Name) else None
    if isinstance(value, Resource):
        return [value]
    if where in INDIRECT:
        return list(INDIRECT[where])
    raise AssertionError(f"{where}: {ast.unparse(node)} calls the API on an unknown resource")


def _grants_of_call(node: ast.Call, mod: Any, where: tuple[str, str]) -> set[Grant]:
    func = node.func
    if isinstance(func, ast.Name) and func.id == "Informer":
        res = getattr(mod, ast.unparse(node.args[1]))
        return {(res.group, res.plural, verb) for verb in ("list", "watch")}
    if not (isinstance(func, ast.Attribute) and func.attr in VERBS):
        return set()
    if not ast.unparse(func.value).endswith("kube"):
        return set()  # a dict's get, a list's ... not an API call
    sub = next((k.value for k in node.keywords if k.arg == "sub"), None)
    suffix = f"/{sub.value}" if isinstance(sub, ast.Constant) and sub.value else ""
    return {
        (res.group, res.plural + suffix, VERBS[func.attr])
        for res in _resource_names(node, mod, where)
    }


def used_grants(component: str) -> set[Grant]:
    found: set[Grant] = set()
    for path in _modules(COMPONENTS[component]):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mod = importlib.import_module(name)
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    found |= _grants_of_call(node, mod, (name, fn.name))
    return found


def granted(service_account: str) -> set[Grant]:
    docs = [
        d for path in sorted(DEPLOY.glob("1*-rbac-*.yaml")) for d in yaml.safe_load_all(path.open())
    ]
    roles = {(d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")}
    out: set[Grant] = set()
    for binding in (d for d in docs if d["kind"].endswith("RoleBinding")):
        if not any(s.get("name") == service_account for s in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    out |= {(group, resource, verb) for verb in rule["verbs"]}
    return out


def _diff(component: str) -> tuple[set[Grant], set[Grant]]:
    used, given = used_grants(component), granted(component)
    return used - given, given - used


def test_the_controller_is_granted_exactly_what_it_calls() -> None:
    missing, unused = _diff("cdi-controller")
    assert not missing, f"calls without RBAC: {sorted(missing)}"
    assert not unused, f"RBAC no code uses: {sorted(unused)}"


def test_the_webhook_is_granted_exactly_what_it_calls() -> None:
    missing, unused = _diff("cdi-webhook")
    assert not missing, f"calls without RBAC: {sorted(missing)}"
    assert not unused, f"RBAC no code uses: {sorted(unused)}"


def test_the_scanner_sees_calls_across_lines_and_status_subresources() -> None:
    """The scanner itself can fail: known calls of the controller must be found."""
    used = used_grants("cdi-controller")
    assert ("", "pods", "delete") in used  # a call spread over several lines
    assert ("cdi.kubevirt.io", "datavolumes/status", "patch") in used
    assert ("coordination.k8s.io", "leases", "update") in used  # replace -> update
    assert ("storage.k8s.io", "storageclasses", "watch") in used  # from an Informer
