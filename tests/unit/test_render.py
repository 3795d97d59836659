"""The renderers produce the PVC and importer pod CDI would, deterministically."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from cdi.api.config import CDIConfig, CDIConfigSpec, StorageProfile
from cdi.api.quantity import scratch_ceiling
from cdi.api.types import DataVolume
from cdi.render import RenderError
from cdi.render.importer_pod import ImporterPodConfig, render_importer_pod
from cdi.render.naming import fnv32a, get_name, importer_pod_name, scratch_pvc_name
from cdi.render.proxy_auth import relayed, render_proxy_auth_secret, with_import_proxy
from cdi.render.proxy_ca import render_proxy_ca_config_map
from cdi.render.pvc import render_pvc, required_space
from cdi.render.worker_pod import Metrics
from importer import config as importer_config

GI = 1 << 30


def datavolume(spec: dict[str, Any], annotations: dict[str, str] | None = None) -> DataVolume:
    return DataVolume.from_dict(
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "metadata": {
                "name": "disk",
                "namespace": "vms",
                "uid": "dv-uid",
                "labels": {"team": "a"},
                "annotations": annotations or {},
            },
            "spec": {"source": {"http": {"url": "https://h/disk.qcow2"}}, **spec},
        }
    )


def profile(*sets: dict[str, Any], minimum: str | None = None) -> StorageProfile:
    annotations = {"cdi.kubevirt.io/minimumSupportedPvcSize": minimum} if minimum else {}
    return StorageProfile.from_dict(
        {
            "metadata": {"name": "local", "annotations": annotations},
            "status": {"storageClass": "local", "claimPropertySets": list(sets)},
        }
    )


FS_RWO = {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}
BLOCK_RWX = {"accessModes": ["ReadWriteMany"], "volumeMode": "Block"}


GiB = 1 << 30


def storage(size: str | None = "1Gi", **fields: Any) -> dict[str, Any]:
    spec: dict[str, Any] = dict(fields)
    if size:
        spec["resources"] = {"requests": {"storage": size}}
    return {"storage": spec}


# --- PVC ----------------------------------------------------------------------------------------


def test_pvc_api_is_copied_verbatim_with_owner_labels_and_annotations() -> None:
    pvc_spec = {
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Block",
        "storageClassName": "fast",
        "resources": {"requests": {"storage": "5Gi"}},
    }
    dv = datavolume(
        {"pvc": pvc_spec},
        annotations={"user": "note", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
    )
    pvc = render_pvc(dv, None, CDIConfig())
    assert pvc["spec"] == pvc_spec
    meta = pvc["metadata"]
    assert (meta["name"], meta["namespace"]) == ("disk", "vms")
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "cdi.kubevirt.io/v1beta1",
            "kind": "DataVolume",
            "name": "disk",
            "uid": "dv-uid",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert meta["labels"]["app"] == "containerized-data-importer"
    assert meta["labels"]["team"] == "a"
    ann = meta["annotations"]
    assert ann["user"] == "note"
    assert "kubectl.kubernetes.io/last-applied-configuration" not in ann
    assert ann["cdi.kubevirt.io/storage.import.source"] == "http"
    assert ann["cdi.kubevirt.io/storage.import.endpoint"] == "https://h/disk.qcow2"
    assert ann["cdi.kubevirt.io/storage.contentType"] == "kubevirt"
    assert ann["cdi.kubevirt.io/createdForDataVolume"] == "dv-uid"
    assert ann["cdi.kubevirt.io/storage.pod.restarts"] == "0"


def test_storage_api_takes_modes_from_the_profile_and_adds_filesystem_overhead() -> None:
    pvc = render_pvc(datavolume(storage()), profile(FS_RWO), CDIConfig())
    assert pvc["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
        "storageClassName": "local",
        "resources": {"requests": {"storage": str(1142278537)}},  # ceil(1Gi / 0.94), CDI's bytes
    }


def test_overhead_comes_from_cdiconfig_per_storage_class() -> None:
    config = CDIConfig.from_dict(
        {"status": {"filesystemOverhead": {"global": "0.1", "storageClass": {"local": "0.2"}}}}
    )
    pvc = render_pvc(datavolume(storage()), profile(FS_RWO), config)
    assert pvc["spec"]["resources"]["requests"]["storage"] == str(required_space(0.2, GI))
    assert required_space(0.2, GI) == 1342177280


def test_block_volumes_get_no_overhead() -> None:
    pvc = render_pvc(
        datavolume(storage(volumeMode="Block")), profile(FS_RWO, BLOCK_RWX), CDIConfig()
    )
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]  # first set with that volume mode
    assert pvc["spec"]["resources"]["requests"]["storage"] == str(GI)


def test_access_modes_given_pick_the_matching_volume_mode() -> None:
    dv = datavolume(storage(accessModes=["ReadWriteMany"]))
    pvc = render_pvc(dv, profile(FS_RWO, BLOCK_RWX), CDIConfig())
    assert pvc["spec"]["volumeMode"] == "Block"


def test_from_storage_profile_volume_mode_means_ask_the_profile() -> None:
    dv = datavolume(storage(volumeMode="FromStorageProfile"))
    assert render_pvc(dv, profile(BLOCK_RWX), CDIConfig())["spec"]["volumeMode"] == "Block"


def test_size_is_aligned_to_mib_before_overhead() -> None:
    assert required_space(0.0, 1) == 1 << 20
    assert required_space(0.06, (1 << 20) + 1) == required_space(0.06, 2 << 20)


def test_minimum_supported_size_raises_small_claims() -> None:
    pvc = render_pvc(datavolume(storage()), profile(FS_RWO, minimum="4Gi"), CDIConfig())
    assert pvc["spec"]["resources"]["requests"]["storage"] == str(4 * GI)


def test_archive_forces_filesystem() -> None:
    dv = datavolume({**storage(), "contentType": "archive"})
    assert (
        render_pvc(dv, profile(BLOCK_RWX, FS_RWO), CDIConfig())["spec"]["volumeMode"]
        == "Filesystem"
    )


@pytest.mark.parametrize(
    ("spec", "sp", "message"),
    [
        (
            {**storage(volumeMode="Block"), "contentType": "archive"},
            profile(BLOCK_RWX),
            "DataVolume with ContentType Archive cannot have block volumeMode",
        ),
        (storage(), None, "PVC spec is missing accessMode and no storageClass to choose profile"),
        (storage(), profile(), "no accessMode specified in StorageProfile local"),
        (
            storage(volumeMode="Block"),
            profile(FS_RWO),
            "no accessMode specified in StorageProfile local for volume mode Block",
        ),
        (storage(size=None), profile(FS_RWO), "PVC Spec is not valid - missing storage size"),
        (
            storage(size="1000k"),
            profile(FS_RWO),
            "PVC Spec is not valid - storage size should be at least 1MiB",
        ),
        ({}, profile(FS_RWO), "DataVolume has neither spec.pvc nor spec.storage"),
    ],
    ids=[
        "archive block",
        "no profile",
        "empty profile",
        "no set for mode",
        "no size",
        "too small",
        "no claim",
    ],
)
def test_unrenderable_claims_say_why(
    spec: dict[str, Any], sp: StorageProfile | None, message: str
) -> None:
    with pytest.raises(RenderError) as err:
        render_pvc(datavolume(spec), sp, CDIConfig())
    assert err.value.message == message
    assert err.value.reason == "ErrClaimNotValid"


def test_clone_with_storage_api_may_leave_the_size_to_the_source() -> None:
    dv = DataVolume.from_dict(
        {
            "metadata": {"name": "c", "namespace": "n", "uid": "u"},
            "spec": {"source": {"pvc": {"namespace": "a", "name": "b"}}, "storage": {}},
        }
    )
    assert "resources" not in render_pvc(dv, profile(FS_RWO), CDIConfig())["spec"]


def test_rendering_is_deterministic() -> None:
    dv = datavolume(storage())
    assert render_pvc(dv, profile(FS_RWO), CDIConfig()) == render_pvc(
        dv, profile(FS_RWO), CDIConfig()
    )


# --- naming -------------------------------------------------------------------------------------


def test_child_names_follow_cdi() -> None:
    assert importer_pod_name("disk") == "importer-disk"
    assert scratch_pvc_name("disk") == "disk-scratch"
    assert fnv32a("") == "811c9dc5"
    assert fnv32a("a") == "e40c292c"


def test_long_names_are_shortened_with_a_hash_within_the_limit() -> None:
    long = "a" * 250
    name = scratch_pvc_name(long)
    assert len(name) == 253
    assert name == f"{'a' * 236}-{fnv32a(long)}-scratch"  # 253 - len('-hash-') - len(suffix)
    pod = importer_pod_name(long)
    assert len(pod) <= 253 and pod == f"importer-{fnv32a('importer-' + long)}"
    assert get_name("base", "suffix", 0) == ""


# --- importer pod -------------------------------------------------------------------------------


def pod_for(
    spec: dict[str, Any],
    sp: StorageProfile | None = None,
    config: ImporterPodConfig | None = None,
    **kw: Any,
) -> dict[str, Any]:
    dv = datavolume(spec, **kw)
    pvc = render_pvc(dv, sp or profile(FS_RWO, BLOCK_RWX), CDIConfig())
    return render_importer_pod(dv, pvc, config or ImporterPodConfig(image="importer:dev"))


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}


def test_filesystem_import_pod() -> None:
    pod = pod_for(storage(), annotations={"k8s.v1.cni.cncf.io/networks": "net1", "x": "y"})
    assert pod["metadata"]["name"] == "importer-disk"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "dv-uid"
    assert pod["metadata"]["labels"]["cdi.kubevirt.io"] == "importer"
    assert pod["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/networks": "net1",
        "sidecar.istio.io/inject": "false",
        "linkerd.io/inject": "disabled",
    }
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    container = spec["containers"][0]
    assert {"name": "cdi-data-vol", "mountPath": "/data"} in container["volumeMounts"]
    assert "volumeDevices" not in container
    assert {"name": "cdi-data-vol", "persistentVolumeClaim": {"claimName": "disk"}} in spec[
        "volumes"
    ]
    assert container["terminationMessagePath"] == "/dev/termination-log"
    assert container["ports"] == [{"name": "metrics", "containerPort": 8443, "protocol": "TCP"}]
    assert container["resources"]["limits"] == {"cpu": "750m", "memory": "600M"}
    env = env_of(pod)
    assert env["IMPORTER_SOURCE"] == "http"
    assert env["IMPORTER_ENDPOINT"] == "https://h/disk.qcow2"
    assert env["IMPORTER_IMAGE_SIZE"] == "1142278537"
    assert env["FILESYSTEM_OVERHEAD"] == "0.06"
    assert env["OWNER_UID"] == "dv-uid"
    assert env["IMPORTER_CONTENTTYPE"] == "kubevirt"


def test_block_import_pod_gets_the_device() -> None:
    pod = pod_for(storage(volumeMode="Block"))
    container = pod["spec"]["containers"][0]
    assert container["volumeDevices"] == [
        {"name": "cdi-data-vol", "devicePath": "/dev/cdi-block-volume"}
    ]
    assert all(m["mountPath"] != "/data" for m in container["volumeMounts"])
    assert env_of(pod)["FILESYSTEM_OVERHEAD"] == "0"


def test_block_import_pod_has_no_scratch_until_the_importer_asks_for_it() -> None:
    """Issue 27: a first pod into a Block claim has no /scratch (a streamable image never needs
    one; the read-only root makes the importer ask); once asked, the controller's scratch claim
    is mounted, or the emptyDir fallback sized to the largest image the claim can need."""
    pod = pod_for(storage(volumeMode="Block"))  # 1Gi: Block claims get no overhead
    container = pod["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert "IMPORTER_SCRATCH_DIR" not in env_of(pod)
    assert importer_config.SCRATCH_DIR not in {m["mountPath"] for m in container["volumeMounts"]}
    assert "cdi-scratch-vol" not in {v["name"] for v in pod["spec"]["volumes"]}

    fallback = ImporterPodConfig(image="importer:dev", scratch_empty_dir=True)
    pod = pod_for(storage(volumeMode="Block"), config=fallback)
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert not mounts[importer_config.SCRATCH_DIR].get("readOnly")
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    scratch = volumes[mounts[importer_config.SCRATCH_DIR]["name"]]
    assert scratch["emptyDir"] == {"sizeLimit": str(scratch_ceiling(GiB))}


def test_filesystem_import_pod_needs_no_scratch_volume() -> None:
    """It stages beside disk.img on its own claim; a controller's scratch claim still wins."""
    pod = pod_for(storage())
    assert "/scratch" not in {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    config = ImporterPodConfig(image="importer:dev", scratch_pvc_name="disk-scratch")
    pod = pod_for(storage(volumeMode="Block"), config=config)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["cdi-scratch-vol"]["persistentVolumeClaim"] == {"claimName": "disk-scratch"}


def test_pod_runs_restricted() -> None:
    pod = pod_for(storage())
    assert pod["spec"]["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 107,
        "runAsGroup": 107,
        "fsGroup": 107,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["spec"]["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
    }
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["enableServiceLinks"] is False


def test_auth_secret_is_mounted_as_files_and_ca_configmap_mounted() -> None:
    spec = {
        "source": {
            "http": {
                "url": "https://h/d.img",
                "secretRef": "creds",
                "certConfigMap": "ca",
                "checksum": "md5:" + "a" * 32,
                "extraHeaders": ["X-A: 1"],
                "secretExtraHeaders": ["hdrs"],
                "insecureSkipVerify": True,
            }
        },
        **storage(),
    }
    pod = pod_for(spec)
    env = env_of(pod)
    assert "IMPORTER_SECRET_KEY" not in env and "IMPORTER_ACCESS_KEY_ID" not in env
    assert env["IMPORTER_ACCESS_KEY_ID_FILE"] == "/var/run/cdi/auth/accessKeyId"
    assert env["IMPORTER_SECRET_KEY_FILE"] == "/var/run/cdi/auth/secretKey"
    assert env["IMPORTER_CERT_DIR"] == "/certs"
    assert env["IMPORTER_CHECKSUM"] == "md5:" + "a" * 32
    assert env["IMPORTER_EXTRA_HEADER_0"] == "X-A: 1"
    assert env["INSECURE_TLS"] == "true"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["cdi-auth-secret-vol"]["secret"]["secretName"] == "creds"
    assert volumes["cdi-cert-vol"]["configMap"] == {"name": "ca"}
    assert volumes["cdi-secret-extra-headers-vol-0"]["secret"]["secretName"] == "hdrs"
    mounts = {m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert {"/certs", "/var/run/cdi/auth", "/extraheaders/0", "/tmp"} <= mounts


def test_a_gcs_secret_is_mounted_at_google_with_its_credentials_json_only() -> None:
    """CDI's layout: the service-account key at /google/credentials.json, named by
    GOOGLE_APPLICATION_CREDENTIALS; none of the S3 key-pair variables."""
    pod = pod_for({"source": {"gcs": {"url": "gs://b/o.img", "secretRef": "sa"}}, **storage()})
    env = env_of(pod)
    assert env["IMPORTER_SOURCE"] == "gcs" and env["IMPORTER_ENDPOINT"] == "gs://b/o.img"
    assert env["GOOGLE_APPLICATION_CREDENTIALS"] == "/google/credentials.json"
    assert "IMPORTER_ACCESS_KEY_ID_FILE" not in env and "IMPORTER_SECRET_KEY_FILE" not in env
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "cdi-auth-secret-vol" not in volumes
    secret = volumes["cdi-gcs-secret-vol"]["secret"]
    assert secret["secretName"] == "sa"
    assert secret["items"] == [{"key": "credentials.json", "path": "credentials.json"}]
    mounts = {m["name"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["cdi-gcs-secret-vol"]["mountPath"] == "/google"
    assert mounts["cdi-gcs-secret-vol"]["readOnly"] is True


def test_a_public_gcs_object_mounts_no_secret() -> None:
    pod = pod_for({"source": {"gcs": {"url": "gs://b/o.img"}}, **storage()})
    assert "GOOGLE_APPLICATION_CREDENTIALS" not in env_of(pod)
    assert not any("secret" in v for v in pod["spec"]["volumes"])
    assert "IMPORTER_GCS_ENDPOINT" not in env_of(pod)  # Google's endpoint


def _gcs_endpoint_config(endpoint: str) -> ImporterPodConfig:
    spec = CDIConfigSpec(gcs_endpoint=endpoint)
    return ImporterPodConfig(image="importer:dev", cdi_config=CDIConfig(spec=spec))


@pytest.mark.parametrize(
    ("written", "rendered"),
    [
        ("http://127.0.0.1:4443", "http://127.0.0.1:4443"),
        ("https://gcs.corp.example/", "https://gcs.corp.example"),
        ("gcs.corp.example:8080", "http://gcs.corp.example:8080"),
    ],
)
def test_cdiconfig_gcs_endpoint_reaches_gcs_importers_only(written: str, rendered: str) -> None:
    config = _gcs_endpoint_config(written)
    gcs = pod_for({"source": {"gcs": {"url": "gs://b/o.img"}}, **storage()}, config=config)
    assert env_of(gcs)["IMPORTER_GCS_ENDPOINT"] == rendered
    http = pod_for(storage(), config=config)
    assert "IMPORTER_GCS_ENDPOINT" not in env_of(http)


@pytest.mark.parametrize(
    "bad", ["ftp://h", "http://user:pw-SECRET@h", "http://h/path", "http://h?x=1", "http://"]
)
def test_a_bad_cdiconfig_gcs_endpoint_is_a_render_error_naming_the_field(bad: str) -> None:
    config = _gcs_endpoint_config(bad)
    with pytest.raises(RenderError, match=r"CDIConfig spec\.gcsEndpoint") as raised:
        pod_for({"source": {"gcs": {"url": "gs://b/o.img"}}, **storage()}, config=config)
    assert "SECRET" not in str(raised.value)


def test_cluster_config_flows_into_the_pod() -> None:
    cdi = CDIConfig.from_dict(
        {
            "spec": {
                "importProxy": {"HTTPProxy": "http://p:3128", "noProxy": ".local"},
                "imagePullSecrets": [{"name": "pull"}],
                "preallocation": True,
                "podResourceRequirements": {"limits": {"memory": "2Gi"}},
            },
        }
    )
    config = ImporterPodConfig(
        image="importer:dev",
        cdi_config=cdi,
        scratch_pvc_name="disk-scratch",
        proxy_ca_config_map="import-proxy-cm-disk",
        direct_io=True,
    )
    pod = pod_for({**storage(), "priorityClassName": "high"}, config=config)
    env = env_of(pod)
    assert env["http_proxy"] == "http://p:3128" and env["no_proxy"] == ".local"
    assert env["IMPORTER_PROXY_CERT_DIR"] == "/proxycerts/"
    assert env["CACHE_MODE"] == "TRYNONE"
    assert env["PREALLOCATION"] == "true"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "pull"}]
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {"memory": "2Gi"}}
    mounts = {m["name"]: m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["cdi-scratch-vol"] == "/scratch"


def test_blank_and_registry_sources() -> None:
    blank = pod_for({"source": {"blank": {}}, **storage()})
    assert env_of(blank)["IMPORTER_SOURCE"] == "none"
    assert "IMPORTER_ENDPOINT" not in env_of(blank)
    reg = pod_for({"source": {"registry": {"url": "docker://quay.io/a/b"}}, **storage()})
    assert env_of(reg)["IMPORTER_PULL_METHOD"] == "pod"


def test_sources_without_an_importer_are_refused() -> None:
    dv = datavolume({"source": {"upload": {}}, **storage()})
    pvc = render_pvc(dv, profile(FS_RWO), CDIConfig())
    with pytest.raises(RenderError):
        render_importer_pod(dv, pvc, ImporterPodConfig(image="importer:dev"))


def test_import_policy_reaches_the_importer_env_with_the_controllers_cluster_ranges() -> None:
    cdi = CDIConfig.from_dict(
        {"spec": {"importPolicy": {"allowedSourceCIDRs": ["10.20.0.0/16", "fd00::/8"]}}}
    ).with_cluster_cidrs(("10.244.0.0/16", "10.96.0.0/12"))
    env = env_of(pod_for(storage(), config=ImporterPodConfig(image="i", cdi_config=cdi)))
    assert env["IMPORTER_ALLOWED_SOURCE_CIDRS"] == "10.20.0.0/16,fd00::/8"
    assert env["IMPORTER_CLUSTER_CIDRS"] == "10.244.0.0/16,10.96.0.0/12"
    plain = env_of(pod_for(storage()))
    assert "IMPORTER_ALLOWED_SOURCE_CIDRS" not in plain and "IMPORTER_CLUSTER_CIDRS" not in plain
    assert cdi.with_cluster_cidrs(("10.96.0.0/12",)).import_policy.cluster_cidrs == (
        "10.244.0.0/16",
        "10.96.0.0/12",
    )


def test_import_proxy_credentials_stay_out_of_the_pod_and_its_secret() -> None:
    """S4: the importer gets the relay's address and a ticket, never the proxy's password."""
    cdi = CDIConfig.from_dict(
        {
            "spec": {
                "importProxy": {
                    "HTTPProxy": "http://al%40ice:pw-SECRET@proxy.corp:3128",
                    "HTTPSProxy": "http://proxy.corp:3129",
                    "noProxy": ".svc",
                }
            }
        }
    )
    dv = datavolume(storage())
    secret = render_proxy_auth_secret(dv, "disk", cdi, "vms~disk~99:TICKET")
    assert secret is not None
    assert secret["metadata"]["namespace"] == "vms"
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "dv-uid"
    assert secret["data"] == {"http": base64.b64encode(b"vms~disk~99:TICKET").decode()}
    relayed_config = with_import_proxy(cdi, relayed(cdi.import_proxy, "http://10.96.0.9:3128"))
    config = ImporterPodConfig(
        image="i", cdi_config=relayed_config, proxy_auth_secret=secret["metadata"]["name"]
    )
    pod = pod_for(storage(), config=config)
    assert "SECRET" not in json.dumps(pod) and "SECRET" not in json.dumps(secret)
    env = env_of(pod)
    assert env["http_proxy"] == "http://10.96.0.9:3128"  # the relay holds the credentials
    assert env["https_proxy"] == "http://proxy.corp:3129"  # none: dialled directly
    assert env["IMPORTER_PROXY_AUTH_DIR"] == "/var/run/cdi/proxy-auth"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["cdi-proxy-auth-vol"]["secret"]["secretName"] == secret["metadata"]["name"]
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {
        "name": "cdi-proxy-auth-vol",
        "mountPath": "/var/run/cdi/proxy-auth",
        "readOnly": True,
    } in mounts


def test_proxy_auth_secret_name_follows_its_ticket_and_is_absent_without_credentials() -> None:
    def config(url: str) -> CDIConfig:
        return CDIConfig.from_dict({"spec": {"importProxy": {"HTTPProxy": url}}})

    dv = datavolume(storage())
    a = render_proxy_auth_secret(dv, "disk", config("http://u:1@p:3128"), "t1")
    b = render_proxy_auth_secret(dv, "disk", config("http://u:1@p:3128"), "t2")
    assert a and b and a["metadata"]["name"] != b["metadata"]["name"]
    assert render_proxy_auth_secret(dv, "disk", config("http://p:3128"), "t") is None
    assert render_proxy_auth_secret(dv, "disk", CDIConfig(), "t") is None


def test_trusted_ca_proxy_copy_is_cdis_configmap_owned_by_the_datavolume_and_mounted() -> None:
    spec = {"importProxy": {"HTTPSProxy": "https://p:3129", "trustedCAProxy": "proxy-ca"}}
    cdi = CDIConfig.from_dict({"spec": spec})
    assert cdi.import_proxy is not None and cdi.import_proxy.trusted_ca_proxy == "proxy-ca"
    assert cdi.import_proxy.to_dict() == spec["importProxy"]  # CDI's spelling, both ways
    dv = datavolume(storage())
    copy = render_proxy_ca_config_map(dv, "disk", {"ca.pem": "-----BEGIN CERTIFICATE-----"})
    assert copy["metadata"]["name"] == "import-proxy-cm-disk"  # CDI's name
    assert copy["metadata"]["namespace"] == "vms"
    assert copy["metadata"]["ownerReferences"][0]["uid"] == "dv-uid"
    assert copy["data"] == {"ca.pem": "-----BEGIN CERTIFICATE-----"}
    config = ImporterPodConfig(image="i", proxy_ca_config_map=copy["metadata"]["name"])
    pod = pod_for(storage(), config=config)
    assert env_of(pod)["IMPORTER_PROXY_CERT_DIR"] == "/proxycerts/"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["cdi-proxy-cert-vol"]["configMap"] == {"name": "import-proxy-cm-disk"}
    mounts = pod["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "cdi-proxy-cert-vol", "mountPath": "/proxycerts/", "readOnly": True} in mounts


def test_attempt_labels_and_metrics_are_inputs_of_the_final_pod() -> None:
    config = ImporterPodConfig(
        image="importer:dev",
        command=(),
        attempt=3,
        labels={"team": "b", "cdi.kubevirt.io": "not-importer"},
        metrics=Metrics(port=9443, on_pod_ip=True),
    )
    pod = pod_for(storage(), config=config)
    meta = pod["metadata"]
    assert meta["name"] == "importer-disk-retry-3"
    assert meta["labels"]["cdi.kubevirt.io/importAttempt"] == "3"
    assert meta["labels"]["team"] == "b"  # the extra label wins over the claim's
    assert meta["labels"]["cdi.kubevirt.io"] == "importer"  # CDI's win over extra ones
    container = pod["spec"]["containers"][0]
    assert "command" not in container  # the image's ENTRYPOINT
    assert container["ports"] == [{"name": "metrics", "containerPort": 9443, "protocol": "TCP"}]
    env = {e["name"]: e for e in container["env"]}
    assert env["IMPORTER_METRICS_PORT"]["value"] == "9443"
    assert env["IMPORTER_METRICS_ADDR"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_default_metrics_add_no_environment() -> None:
    env = env_of(pod_for(storage()))
    assert "IMPORTER_METRICS_ADDR" not in env and "IMPORTER_METRICS_PORT" not in env
