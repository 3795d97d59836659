"""Every CRD in crds/ is a well-formed structural CRD, and CDI's own manifests fit its schema.

The integration suite applies these to a real API server; here we check, without a cluster, the
rules a server would enforce (structural schema, one storage version, printer columns that
point at schema fields) and validate CDI-style manifests against the schema strictly (unknown
fields are errors, as with ``kubectl --validate=strict``), so a CDI user's YAML is accepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

CRD_DIR = Path(__file__).resolve().parents[2] / "crds"
CRD_FILES = sorted(CRD_DIR.glob("*.yaml"))
Schema = dict[str, Any]


def load(path: Path) -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == 1, f"{path.name}: one CRD per file"
    return docs[0]


def crd_named(kind: str) -> dict[str, Any]:
    for path in CRD_FILES:
        crd = load(path)
        if crd["spec"]["names"]["kind"] == kind:
            return crd
    raise AssertionError(f"no CRD for {kind}")


def schema_of(kind: str) -> Schema:
    return crd_named(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def walk(node: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    yield path, node
    for name, sub in (node.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_there_are_crds_for_datavolume_storageprofile_and_cdiconfig() -> None:
    kinds = {load(p)["spec"]["names"]["kind"] for p in CRD_FILES}
    assert {"DataVolume", "StorageProfile", "CDIConfig"} <= kinds


@pytest.mark.parametrize("path", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_crd_is_well_formed(path: Path) -> None:
    crd = load(path)
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    spec = crd["spec"]
    names = spec["names"]
    assert crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}" == path.stem
    assert spec["group"] == "cdi.kubevirt.io"
    assert spec["scope"] in ("Namespaced", "Cluster")
    assert {"kind", "plural", "singular", "listKind"} <= names.keys()
    versions = spec["versions"]
    assert [v["name"] for v in versions if v["storage"]] == ["v1beta1"]
    for version in versions:
        assert version["served"] is True
        assert version["subresources"] == {"status": {}}


@pytest.mark.parametrize("path", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_schema_is_structural(path: Path) -> None:
    root = load(path)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root["type"] == "object"
    assert root["properties"]["metadata"] == {"type": "object"}
    for where, node in walk(root):
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], where
            continue
        assert node.get("type") in ("object", "array", "string", "integer", "boolean", "number"), (
            f"{where}: every node needs a type"
        )
        assert not ("properties" in node and "additionalProperties" in node), where
        assert "x-kubernetes-preserve-unknown-fields" not in node, f"{where}: use a schema"
        for key in node.get("required", ()):
            assert key in node.get("properties", {}), f"{where}: required {key} is not declared"
        if node["type"] == "array":
            assert "items" in node, where
        for value in node.get("enum", ()):
            assert isinstance(value, str) and node["type"] == "string", where
        if "pattern" in node:
            re.compile(node["pattern"])


@pytest.mark.parametrize("path", CRD_FILES, ids=[p.name for p in CRD_FILES])
def test_printer_columns_point_at_schema_fields(path: Path) -> None:
    version = load(path)["spec"]["versions"][0]
    paths = {where for where, _ in walk(version["schema"]["openAPIV3Schema"])}
    for column in version.get("additionalPrinterColumns", ()):
        assert column["jsonPath"] in paths or column["jsonPath"] == ".metadata.creationTimestamp"


def test_datavolume_prints_like_cdi() -> None:
    crd = crd_named("DataVolume")
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"]) for c in columns] == [
        ("Phase", ".status.phase"),
        ("Progress", ".status.progress"),
        ("Restarts", ".status.restartCount"),
        ("Age", ".metadata.creationTimestamp"),
    ]
    assert crd["spec"]["names"]["shortNames"] == ["dv", "dvs"]
    assert crd["spec"]["scope"] == "Namespaced"


def test_storageprofile_and_cdiconfig_are_cluster_scoped() -> None:
    assert crd_named("StorageProfile")["spec"]["scope"] == "Cluster"
    assert crd_named("CDIConfig")["spec"]["scope"] == "Cluster"


# --- a strict validator: enough of the API server's checks to judge manifests -----------------

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float)}


def violations(value: Any, node: Schema, path: str = "") -> list[str]:
    if node.get("x-kubernetes-int-or-string"):
        ok = isinstance(value, int | str) and not isinstance(value, bool)
        if ok and isinstance(value, str) and not re.match(node["pattern"], value):
            return [f"{path}: should match '{node['pattern']}'"]
        return [] if ok else [f"{path}: must be int or string"]
    kind = node["type"]
    if kind == "integer":
        good = isinstance(value, int) and not isinstance(value, bool)
    else:
        good = isinstance(value, _TYPES[kind]) and not (
            kind != "boolean" and isinstance(value, bool)
        )
    if not good:
        return [f"{path}: must be of type {kind}"]
    if "enum" in node and value not in node["enum"]:
        return [f'{path}: Unsupported value: "{value}"']
    if "pattern" in node and not re.match(node["pattern"], value):
        return [f"{path}: should match '{node['pattern']}'"]
    if kind == "array":
        items = node["items"]
        return [e for i, v in enumerate(value) for e in violations(v, items, f"{path}[{i}]")]
    if kind == "object":
        return _object_violations(value, node, path)
    return []


def _object_violations(value: dict[str, Any], node: Schema, path: str) -> list[str]:
    errors = [f"{path}.{k}: Required value" for k in node.get("required", ()) if k not in value]
    props, extra = node.get("properties"), node.get("additionalProperties")
    for key, sub in value.items():
        if props is not None and key in props:
            errors += violations(sub, props[key], f"{path}.{key}")
        elif isinstance(extra, dict):
            errors += violations(sub, extra, f"{path}.{key}")
        elif props is not None:
            errors.append(f'{path}: unknown field "{key}"')
    return errors


CDI_MANIFESTS: list[str] = [
    # CDI doc/datavolumes.md: http import
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: example-import-dv
spec:
  source:
    http:
      url: "https://download.cirros-cloud.net/0.4.0/cirros-0.4.0-x86_64-disk.img"
      secretRef: "endpoint-secret"
      certConfigMap: "tls-certs"
  pvc:
    accessModes:
      - ReadWriteOnce
    resources:
      requests:
        storage: "500Mi"
""",
    # storage API with a blank source and preallocation
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: blank-dv
  annotations:
    cdi.kubevirt.io/storage.bind.immediate.requested: "true"
spec:
  source:
    blank: {}
  preallocation: true
  storage:
    volumeMode: Block
    storageClassName: local
    resources:
      requests:
        storage: 1Gi
""",
    # registry, archive-free, node pull, multi-arch platform
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: registry-image-datavolume
spec:
  source:
    registry:
      url: "docker://quay.io/kubevirt/cirros-container-disk-demo"
      pullMethod: node
      platform:
        architecture: arm64
  storage:
    resources:
      requests:
        storage: 5Gi
""",
    # http with checksum, headers and an archive into a filesystem volume
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: archive-dv
spec:
  contentType: archive
  priorityClassName: high
  source:
    http:
      url: "http://server/archive.tar"
      checksum: "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"
      extraHeaders: ["X-Auth: token"]
      secretExtraHeaders: ["more-headers"]
      insecureSkipVerify: false
  pvc:
    accessModes: [ReadWriteMany]
    volumeMode: Filesystem
    selector:
      matchLabels: {disk: fast}
      matchExpressions:
      - {key: zone, operator: In, values: [a, b]}
    resources:
      requests:
        storage: 10Gi
""",
    # clone via sourceRef, size from the source
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata:
  name: fedora-clone
spec:
  sourceRef:
    kind: DataSource
    name: fedora
    namespace: golden-images
  storage: {}
""",
    # pvc and snapshot clones, upload target, s3/gcs
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: clone}
spec:
  source:
    pvc: {namespace: source-ns, name: source-pvc}
  pvc: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
""",
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: snap}
spec:
  source:
    snapshot: {namespace: ns, name: snap}
  storage: {}
""",
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: upload}
spec:
  source: {upload: {}}
  storage: {resources: {requests: {storage: 2Gi}}}
""",
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: s3}
spec:
  source:
    s3: {url: "https://bucket.s3.amazonaws.com/disk.img", secretRef: s3-creds}
  pvc: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
""",
    # warm migration from VMware
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: vddk}
spec:
  source:
    vddk:
      backingFile: "[datastore1] vm/vm.vmdk"
      url: "https://vcenter.corp.com"
      uuid: "52260566-b032-36cb-55b1-79bf29e30490"
      thumbprint: "20:6C:8A:5D:44:40:B3:79:4B:28:EA:76:13:60:90:6E:49:D9:D9:A3"
      secretRef: "vddk-credentials"
      initImageURL: "registry:5000/vddk-init:latest"
  checkpoints:
    - previous: ""
      current: "snapshot-1"
  finalCheckpoint: false
  pvc: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 10Gi}}}
""",
    # a DataVolume as CDI stores it, with status
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: DataVolume
metadata: {name: done}
spec:
  source: {imageio: {url: "https://engine/ovirt-engine/api", diskId: d1, secretRef: s,
                     certConfigMap: c}}
  pvc: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
status:
  claimName: done
  phase: Succeeded
  progress: 100.0%
  restartCount: 0
  conditions:
  - type: Ready
    status: "True"
    reason: ""
    message: ""
    lastTransitionTime: "2024-01-01T00:00:00Z"
    lastHeartbeatTime: "2024-01-01T00:00:00Z"
""",
    # StorageProfile and CDIConfig as CDI writes them
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: StorageProfile
metadata: {name: local}
spec:
  cloneStrategy: copy
  claimPropertySets:
  - accessModes: [ReadWriteOnce]
    volumeMode: Filesystem
status:
  storageClass: local
  provisioner: kubernetes.io/no-provisioner
  cloneStrategy: copy
  claimPropertySets:
  - accessModes: [ReadWriteOnce]
    volumeMode: Block
""",
    """
apiVersion: cdi.kubevirt.io/v1beta1
kind: CDIConfig
metadata: {name: config}
spec:
  featureGates: [HonorWaitForFirstConsumer]
  filesystemOverhead:
    global: "0.055"
    storageClass: {local: "0.1"}
  importProxy: {HTTPProxy: "http://proxy:3128", HTTPSProxy: "http://proxy:3128",
                noProxy: ".cluster.local", trustedCAProxy: proxy-ca}
  podResourceRequirements:
    limits: {cpu: "4", memory: 2Gi}
    requests: {cpu: 100m, memory: 60M}
  scratchSpaceStorageClass: local
  uploadProxyURLOverride: "https://upload.example"
  insecureRegistries: ["registry:5000"]
  preallocation: false
  tlsSecurityProfile: {type: Intermediate, intermediate: {}}
status:
  uploadProxyURL: "https://upload.example"
  filesystemOverhead: {global: "0.055", storageClass: {local: "0.1"}}
  defaultPodResourceRequirements: {limits: {cpu: 750m, memory: 600M}}
""",
]


@pytest.mark.parametrize("text", CDI_MANIFESTS, ids=range(len(CDI_MANIFESTS)))
def test_cdi_manifest_fits_the_schema(text: str) -> None:
    manifest = yaml.safe_load(text)
    assert violations(manifest, schema_of(manifest["kind"])) == []


@pytest.mark.parametrize(
    ("manifest", "expected"),
    [
        (
            {"spec": {"contentType": "invalid", "pvc": {}}},
            '.spec.contentType: Unsupported value: "invalid"',
        ),
        ({"spec": {"source": {"http": {}}, "pvc": {}}}, ".spec.source.http.url: Required value"),
        (
            {"spec": {"source": {"pvc": {"namespace": "ns"}}, "pvc": {}}},
            ".spec.source.pvc.name: Required value",
        ),
        (
            {"spec": {"pvc": {"resources": {"requests": {"storage": "2Ng"}}}}},
            ".spec.pvc.resources.requests.storage: should match",
        ),
        ({"spec": {"source": {"http": None}}}, ".spec.source.http: must be of type object"),
        ({}, ".spec: Required value"),
        ({"spec": {"sourse": {}}}, '.spec: unknown field "sourse"'),
    ],
    ids=["contentType", "http url", "pvc source name", "quantity", "http null", "no spec", "typo"],
)
def test_schema_rejects_what_cdis_schema_rejects(manifest: dict[str, Any], expected: str) -> None:
    errors = violations(manifest, schema_of("DataVolume"))
    assert any(e.startswith(expected) for e in errors), errors
