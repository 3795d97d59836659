"""The RBAC in deploy/ grants each component exactly the verbs its code calls, no more, no less.

Every API call goes through ``cdi.kube.client`` (``kube.get(PODS, ...)``, ``Informer(kube,
DATAVOLUMES)``), so the calls can be read from the source: this test walks each component's
modules, resolves the first argument of every ``*kube.<verb>(...)`` call to its ``Resource``
constant (``sub="status"`` makes it the status subresource), adds list+watch for every
``Informer`` (of a kind held in a variable: ``INDIRECT_INFORMERS``), and compares the set with
what the component's ServiceAccount is bound to in ``deploy/1*-rbac-*.yaml`` and
``deploy/50-upload.yaml``. A new call without its RBAC fails here (instead of as a 403 in a
cluster), and so does a verb left in deploy/ that no code uses any more. A call whose resource
is a variable must be listed in ``INDIRECT``.

A component is a list of units: a module or folder, or ``module.py::Name`` (a top-level
function or class) or ``module.py::Class.method``. The upload token API server
(``cdi-apiserver``) and the upload proxy (``cdi-uploadproxy``) share modules
(``cdi.upload.serve``, ``kubestore``, the webhook's ``CertStore``) but not each function in them,
so theirs are named function by function; ``test_every_upload_server_call_belongs_to_a_
component`` makes sure no function with API calls in those modules is left out.
"""

from __future__ import annotations

import ast
import functools
import importlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from cdi.controller.manager import Manager, ManagerConfig
from cdi.kube.client import (
    MUTATING_WEBHOOKS,
    PODS,
    SECRETS,
    SERVICES,
    VALIDATING_WEBHOOKS,
    Kube,
    Resource,
)
from cdi.pki.upload import CONFIG_MAPS

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
    "delete_if_present": "delete",
    "create_if_absent": "create",
}
COMPONENTS = {
    "cdi-controller": (
        "cdi/controller",
        "cdi/kube/leader.py",
        "cdi/kube/events.py",
        "cdi/kube/shared_key.py",
        "cdi/pki/upload.py",
        # the metrics serving certificate (cdi/controller/metrics_serving.py) and TLS profile
        "cdi/pki/store.py::CertStore._read",  # ensure() publishes through the subclass
        "cdi/pki/store.py::CertStore._write",
        "cdi/upload/kubestore.py::ProxyCertStore",  # its CA alone, in a ConfigMap
        "cdi/pki/profile.py",
    ),
    "cdi-webhook": (
        "cdi/admission.py",
        "cdi/pki/store.py",
        "cdi/webhooks",
        "cdi/kube/shared_key.py",
        "cdi/pki/profile.py",
    ),
    # the upload token API (cdi.upload.serve.serve_upload_api)
    "cdi-apiserver": (
        "cdi/upload/serve.py::serve_upload_api",
        "cdi/upload/serve.py::_ServingCert",
        "cdi/upload/kubestore.py::SecretKeyStore",
        "cdi/upload/kubestore.py::publish_public_keys",
        "cdi/upload/kubestore.py::KubeAccessReviewer",
        "cdi/upload/kubestore.py::KubeUploadTargets.get_pvc",
        "cdi/upload/kubestore.py::requestheader_settings",
        "cdi/upload/kubestore.py::ApiServiceCertStore",
        "cdi/pki/store.py::CertStore._read",  # ensure() publishes through the subclass
        "cdi/pki/store.py::CertStore._write",
        "cdi/upload/apiserver.py",
        "cdi/upload/tokenapi.py",
        "cdi/upload/token.py",
        "cdi/upload/keys.py",
        "cdi/pki/profile.py",  # CDIConfig: TLS profile and logVerbosity
    ),
    # the import proxy relay (cdi.importproxy, deploy/60-import-proxy.yaml)
    "cdi-import-proxy": ("cdi/importproxy", "cdi/kube/shared_key.py"),
    # the upload proxy (cdi.upload.serve.serve_upload_proxy)
    "cdi-uploadproxy": (
        "cdi/upload/serve.py::serve_upload_proxy",
        "cdi/upload/serve.py::_Upstream",
        "cdi/upload/serve.py::_ServingCert",
        "cdi/upload/kubestore.py::read_public_keys",
        "cdi/upload/kubestore.py::KubeUploadTargets",
        "cdi/upload/kubestore.py::read_upstream_credentials",
        "cdi/upload/kubestore.py::ProxyCertStore",
        "cdi/pki/store.py::CertStore._read",  # its CertStore publishes nowhere
        "cdi/pki/store.py::CertStore._write",
        "cdi/pki/store.py::CertStore.ensure",
        "cdi/upload/proxy.py",
        "cdi/upload/readiness.py",
        "cdi/upload/token.py",
        "cdi/pki/contexts.py",
        "cdi/pki/profile.py",  # CDIConfig: TLS profile and logVerbosity
    ),
}
# The upload servers' modules: every function in them that calls the API is in a component.
UPLOAD_SERVER_MODULES = (
    "cdi/upload/serve.py",
    "cdi/upload/kubestore.py",
    "cdi/upload/apiserver.py",
    "cdi/upload/tokenapi.py",
    "cdi/upload/token.py",
    "cdi/upload/keys.py",
    "cdi/upload/proxy.py",
    "cdi/upload/readiness.py",
    "cdi/pki/contexts.py",
)
RBAC_FILES = ("1*-rbac-*.yaml", "50-upload.yaml", "60-import-proxy.yaml")
# (module, function) -> the resources its variable-resource calls reach
INDIRECT: dict[tuple[str, str], tuple[Resource, ...]] = {
    ("cdi.pki.store", "_publish_to"): (VALIDATING_WEBHOOKS, MUTATING_WEBHOOKS),
    # the upload flavour's helpers, called with the server's Service and its pod/Service/Secret
    ("cdi.controller.flavours.upload", "_delete"): (PODS, SERVICES, SECRETS),
    ("cdi.controller.flavours.upload", "remove"): (PODS, SERVICES),
    # the upload proxy's client certificate and server CA bundle, kept by the controller
    ("cdi.pki.upload", "_store"): (SECRETS, CONFIG_MAPS),
}
# Helpers called with the resource they read and patch: CertStore's compare-and-swap publish of
# a CA bundle (its own body is scanned through INDIRECT where a component includes it).
PUBLISHERS = {"_publish_to": ("get", "patch")}
Grant = tuple[str, str, str]  # (apiGroup, resource[/subresource], verb)
INFORMERS = ("Informer", "keys_cache")  # (kube, RESOURCE, ...): list + watch


@functools.cache
def controller_informers() -> tuple[Resource, ...]:
    """The kinds the controller's informers list and watch: what its reconcilers read from
    caches and what their watch declarations name (a Manager built and wired, never started:
    nothing is sent)."""
    manager = Manager(Kube(ApiClient()), ManagerConfig(metrics_port=None))
    try:
        manager.wire()
        return tuple(manager.informers.kinds())
    finally:
        manager.kube.close()


# (module, function) -> the kinds its informers of a variable kind list and watch
INDIRECT_INFORMERS: dict[tuple[str, str], Callable[[], tuple[Resource, ...]]] = {
    ("cdi.controller.caches", "informer"): controller_informers,
}
Function = ast.FunctionDef | ast.AsyncFunctionDef


def _units(paths: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
    """(module file, "" for all of it or the ``Name`` / ``Class.method`` it is limited to)."""
    for unit in paths:
        rel, _, name = unit.partition("::")
        path = ROOT / rel
        for module in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            yield module, name


def _functions(tree: ast.Module, name: str) -> Iterator[Function]:
    """Every function (methods and nested ones included) in the module or the named unit."""
    scope: list[ast.AST] = [tree]
    for part in name.split(".") if name else []:
        body = [n for s in scope for n in getattr(s, "body", [])]
        scope = [n for n in body if isinstance(n, Function | ast.ClassDef) and n.name == part]
        assert scope, f"{name}: no such function or class"
    for node in scope:
        yield from (fn for fn in ast.walk(node) if isinstance(fn, Function))


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
    if isinstance(func, ast.Name) and func.id in INFORMERS:
        res = getattr(mod, ast.unparse(node.args[1]), None)
        if isinstance(res, Resource):
            kinds: tuple[Resource, ...] = (res,)
        elif where in INDIRECT_INFORMERS:
            kinds = INDIRECT_INFORMERS[where]()
        else:
            raise AssertionError(f"{where}: {ast.unparse(node)} watches an unknown resource")
        return {(r.group, r.plural, verb) for r in kinds for verb in ("list", "watch")}
    if isinstance(func, ast.Attribute) and func.attr in PUBLISHERS:
        first = node.args[0] if node.args else None
        res = getattr(mod, first.id, None) if isinstance(first, ast.Name) else None
        if not isinstance(res, Resource):
            return set()  # a variable resource: the helper's own calls are counted
        return {(res.group, res.plural, verb) for verb in PUBLISHERS[func.attr]}
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


def calls(paths: tuple[str, ...]) -> Iterator[tuple[tuple[str, str], set[Grant]]]:
    """((module, function), the grants its API calls need) for every function of the units."""
    for path, unit in _units(paths):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mod = importlib.import_module(name)
        for fn in _functions(ast.parse(path.read_text()), unit):
            grants: set[Grant] = set()
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    grants |= _grants_of_call(node, mod, (name, fn.name))
            yield (name, fn.name), grants


def used_grants(component: str) -> set[Grant]:
    found: set[Grant] = set()
    for _, grants in calls(COMPONENTS[component]):
        found |= grants
    return found


def _key(doc: dict[str, Any], kind: str, name: str) -> tuple[str, str, str]:
    namespace = doc["metadata"].get("namespace", "") if kind == "Role" else ""
    return kind, namespace, name


def granted(service_account: str) -> set[Grant]:
    docs = [
        d
        for pattern in RBAC_FILES
        for path in sorted(DEPLOY.glob(pattern))
        for d in yaml.safe_load_all(path.open())
        if isinstance(d, dict)
    ]
    roles = {
        _key(d, d["kind"], d["metadata"]["name"]): d for d in docs if d["kind"].endswith("Role")
    }
    out: set[Grant] = set()
    for binding in (d for d in docs if d["kind"].endswith("RoleBinding")):
        if not any(s.get("name") == service_account for s in binding["subjects"]):
            continue
        ref = binding["roleRef"]
        role = roles[_key(binding, ref["kind"], ref["name"])]
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


@pytest.mark.parametrize("component", ["cdi-apiserver", "cdi-uploadproxy", "cdi-import-proxy"])
def test_the_upload_token_api_and_proxy_are_granted_exactly_what_they_call(component: str) -> None:
    missing, unused = _diff(component)
    assert not missing, f"calls without RBAC: {sorted(missing)}"
    assert not unused, f"RBAC no code uses: {sorted(unused)}"


def test_every_upload_server_call_belongs_to_a_component() -> None:
    """The upload components are named function by function: a new function with API calls in
    their modules must be added to one of them (or it would escape the comparison)."""
    claimed = {
        where
        for component in ("cdi-apiserver", "cdi-uploadproxy")
        for where, _ in calls(COMPONENTS[component])
    }
    unclaimed = [
        where for where, grants in calls(UPLOAD_SERVER_MODULES) if grants and where not in claimed
    ]
    assert not unclaimed, f"API calls in no upload component: {unclaimed}"


def test_the_scanner_sees_calls_across_lines_and_status_subresources() -> None:
    """The scanner itself can fail: known calls of the controller must be found."""
    used = used_grants("cdi-controller")
    assert ("", "pods", "delete") in used  # a call spread over several lines
    assert ("cdi.kubevirt.io", "datavolumes/status", "patch") in used
    assert ("coordination.k8s.io", "leases", "update") in used  # replace -> update
    assert ("storage.k8s.io", "storageclasses", "watch") in used  # from an Informer
    proxy = used_grants("cdi-uploadproxy")  # a unit limited to one class: its methods only
    assert ("", "services", "get") in proxy
    assert ("", "services", "get") not in used_grants("cdi-apiserver")  # get_pvc only
