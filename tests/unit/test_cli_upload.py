"""``cdi upload``'s command line and its checks of existing targets: virtctl's messages, word
for word, without a cluster (``commands.upload.options``), and the exit status and stderr line
of the real ``cdi`` entry point for a refused command line."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from cdi.api.constants import (
    ANN_CONTENT_TYPE,
    ANN_DELETE_AFTER_COMPLETION,
    ANN_IMMEDIATE_BINDING,
    ANN_POD_PHASE,
    ANN_PVC_PRIME_NAME,
    ANN_UPLOAD_REQUEST,
    ANN_USE_POPULATOR,
)
from cdi.kube.client import load_user_client
from cdi.kube.errors import KubeError
from commands.main import main
from commands.upload.main import add_upload_parser, open_image
from commands.upload.options import (
    ProxyUrlNotFound,
    TargetNotReady,
    TargetRefused,
    UploadOptions,
    UsageError,
    check_existing_pvc,
    no_datavolume,
    options_from_args,
    populator_prime_name,
    proxy_base,
    proxy_url_from_config,
    render_datasource,
    render_datavolume,
    render_pvc,
    updated_datasource,
    wffc_refusal,
    with_scheme,
)
from commands.upload.progress import ProgressBar


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="cdi")
    add_upload_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["upload", *argv])


def options(*argv: str) -> UploadOptions:
    return options_from_args(parse(*argv))


def refused(*argv: str) -> str:
    with pytest.raises(UsageError) as err:
        options(*argv)
    return err.value.message


# -- the command line -------------------------------------------------------------------------


def test_dv_and_pvc_name_the_target_and_its_kind() -> None:
    dv = options("dv", "disk", "--image-path=a.img", "--size=1Gi")
    assert (dv.create_pvc, dv.name, dv.path, dv.archive, dv.kind) == (
        False,
        "disk",
        "a.img",
        False,
        "DataVolume",
    )
    pvc = options("PVC", "disk", "--archive-path=a.tar")
    assert (pvc.create_pvc, pvc.archive, pvc.kind) == (True, True, "PersistentVolumeClaim")
    assert (dv.wait_secs, dv.retry, dv.insecure, dv.no_create) == (300, 5, False, False)


def test_an_image_or_an_archive_is_required() -> None:
    assert refused("dv", "x") == "either image-path or archive-path must be provided"


def test_not_both_an_image_and_an_archive() -> None:
    assert refused("dv", "x", "--image-path=a", "--archive-path=b") == (
        "cannot handle both image-path and archive-path, provide only one"
    )


def test_an_archive_goes_only_to_a_filesystem_volume() -> None:
    assert refused("dv", "x", "--archive-path=a.tar", "--volume-mode=block") == (
        "In archive upload the volume mode should always be filesystem"
    )


def test_volume_mode_is_block_or_filesystem() -> None:
    assert refused("dv", "x", "--image-path=a", "--volume-mode=raw") == (
        "Invalid volume mode 'raw'. Valid values are 'block' and 'filesystem'."
    )


def test_deprecated_block_volume_means_block_and_conflicts_with_filesystem() -> None:
    assert options("dv", "x", "--image-path=a", "--block-volume").volume_mode == "block"
    assert refused("dv", "x", "--image-path=a", "--block-volume", "--volume-mode=filesystem") == (
        "incompatible --volume-mode 'filesystem' and --block-volume"
    )


def test_two_positional_arguments_are_expected() -> None:
    assert refused("dv", "--image-path=a") == "expecting two args"
    assert refused("--image-path=a") == "expecting two args"


def test_the_resource_type_is_dv_or_pvc() -> None:
    assert refused("vm", "x", "--image-path=a") == "invalid resource type vm"


def test_deprecated_pvc_name_means_pvc_and_excludes_arguments() -> None:
    o = options("--pvc-name=disk", "--image-path=a")
    assert (o.create_pvc, o.name) == (True, "disk")
    assert refused("dv", "x", "--pvc-name=disk", "--image-path=a") == (
        "cannot use --pvc-name and args"
    )


def test_deprecated_pvc_size_is_size_but_not_a_different_one() -> None:
    assert options("dv", "x", "--image-path=a", "--pvc-size=2Gi").size == "2Gi"
    assert options("dv", "x", "--image-path=a", "--pvc-size=2Gi", "--size=2Gi").size == "2Gi"
    assert refused("dv", "x", "--image-path=a", "--pvc-size=2Gi", "--size=3Gi") == (
        "--pvc-size and --size can not be specified at the same time"
    )


def test_retry_and_wait_are_bounded() -> None:
    assert refused("dv", "x", "--image-path=a", "--retry=0") == "--retry must be at least 1: 0"
    assert "must not be negative" in refused("dv", "x", "--image-path=a", "--wait-secs=-1")


def test_the_first_complaint_is_virtctls_first() -> None:
    # virtctl checks sizes, then the volume mode, then the paths, then the arguments.
    assert refused("vm", "--size=1", "--pvc-size=2") == (
        "--pvc-size and --size can not be specified at the same time"
    )
    assert refused("vm", "--volume-mode=x") == (
        "Invalid volume mode 'x'. Valid values are 'block' and 'filesystem'."
    )


# -- what gets created --------------------------------------------------------------------------


def test_the_datavolume_uses_the_storage_api_and_the_upload_source() -> None:
    o = options(
        "dv",
        "disk",
        "--image-path=a",
        "--size=2Gi",
        "--storage-class=fast",
        "--access-mode=ReadWriteMany",
        "--volume-mode=block",
        "--force-bind",
    )
    assert render_datavolume(o, "ns") == {
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": "disk", "namespace": "ns", "annotations": {ANN_IMMEDIATE_BINDING: ""}},
        "spec": {
            "source": {"upload": {}},
            "contentType": "kubevirt",
            "storage": {
                "resources": {"requests": {"storage": "2Gi"}},
                "storageClassName": "fast",
                "accessModes": ["ReadWriteMany"],
                "volumeMode": "Block",
            },
        },
    }


def test_the_datavolume_leaves_what_was_not_asked_to_the_storage_profile() -> None:
    dv = render_datavolume(options("dv", "d", "--archive-path=a.tar", "--size=1Gi"), "ns")
    assert dv["spec"]["storage"] == {"resources": {"requests": {"storage": "1Gi"}}}
    assert dv["spec"]["contentType"] == "archive"
    assert dv["metadata"]["annotations"] == {}


def test_the_pvc_is_an_annotated_upload_target() -> None:
    o = options("pvc", "d", "--archive-path=a.tar", "--size=1Gi", "--volume-mode=filesystem")
    pvc = render_pvc(o, "ns")
    assert pvc["metadata"]["annotations"] == {ANN_UPLOAD_REQUEST: "", ANN_CONTENT_TYPE: "archive"}
    assert pvc["metadata"]["labels"] == {"cdi.kubevirt.io/applyStorageProfile": "true"}
    assert pvc["spec"] == {
        "resources": {"requests": {"storage": "1Gi"}},
        "accessModes": ["ReadWriteOnce"],
        "volumeMode": "Filesystem",
    }


def test_default_instancetype_and_preference_label_the_volume_and_the_datasource() -> None:
    o = options(
        "dv", "disk", "--image-path=a.img", "--size=1Gi", "--datasource",
        "--default-instancetype=u1.small", "--default-preference=fedora",
        "--default-preference-kind=VirtualMachinePreference",
    )  # fmt: skip
    labels = {
        "instancetype.kubevirt.io/default-instancetype": "u1.small",
        "instancetype.kubevirt.io/default-preference": "fedora",
        "instancetype.kubevirt.io/default-preference-kind": "VirtualMachinePreference",
    }
    assert o.datasource
    assert render_datavolume(o, "vms")["metadata"]["labels"] == labels
    pvc = render_pvc(o, "vms")["metadata"]["labels"]
    assert pvc == {"cdi.kubevirt.io/applyStorageProfile": "true", **labels}
    ds = render_datasource(o, "vms")
    assert ds["kind"] == "DataSource" and ds["metadata"] == {
        "name": "disk", "namespace": "vms", "labels": labels}  # fmt: skip
    assert ds["spec"] == {"source": {"pvc": {"name": "disk", "namespace": "vms"}}}
    plain = options("dv", "disk", "--image-path=a.img", "--size=1Gi")
    assert "labels" not in render_datavolume(plain, "vms")["metadata"]


def test_an_existing_datasource_is_repointed_and_keeps_its_labels() -> None:
    o = options("dv", "disk", "--image-path=a.img", "--size=1Gi", "--default-preference=p")
    existing = {
        "metadata": {"name": "disk", "resourceVersion": "7", "labels": {"team": "a"}},
        "spec": {"source": {"snapshot": {"name": "old", "namespace": "vms"}}},
    }
    out = updated_datasource(existing, o, "vms")
    assert out["metadata"]["resourceVersion"] == "7"
    assert out["metadata"]["labels"] == {
        "team": "a", "instancetype.kubevirt.io/default-preference": "p"}  # fmt: skip
    assert out["spec"]["source"] == {"pvc": {"name": "disk", "namespace": "vms"}}
    assert existing["metadata"]["labels"] == {"team": "a"}  # not changed in place


def test_the_default_flags_are_checked_as_virtctl_checks_them() -> None:
    base = ("pvc", "disk", "--image-path=a.img")
    assert refused(*base, "--no-create", "--default-preference=p") == (
        "--default-instancetype, --default-instancetype-kind, --default-preference and "
        "--default-preference-kind cannot be used with --no-create"
    )
    assert refused(*base, "--default-instancetype-kind=k") == (
        "--default-instancetype must be provided with --default-instancetype-kind"
    )
    assert refused(*base, "--default-preference-kind=k") == (
        "--default-preference must be provided with --default-preference-kind"
    )


def test_creating_needs_a_size() -> None:
    with pytest.raises(UsageError, match=r"^when creating a resource, the size must be specified$"):
        render_datavolume(options("dv", "d", "--image-path=a"), "ns")


def test_an_invalid_size_gets_kubernetes_words() -> None:
    with pytest.raises(UsageError) as err:
        render_pvc(options("pvc", "d", "--image-path=a", "--size=ten"), "ns")
    assert err.value.message.startswith("validation failed for size=ten: quantities must match")


def test_a_read_only_volume_cannot_take_an_upload() -> None:
    for render in (render_pvc, render_datavolume):
        with pytest.raises(UsageError) as err:
            render(
                options("dv", "d", "--image-path=a", "--size=1", "--access-mode=ReadOnlyMany"), "n"
            )
        assert err.value.message == (
            "cannot upload to a readonly volume, use either ReadWriteOnce or ReadWriteMany "
            "if supported"
        )


# -- existing targets ------------------------------------------------------------------------


def pvc(annotations: dict[str, str], phase: str = "Pending") -> dict[str, object]:
    return {"metadata": {"name": "d", "annotations": annotations}, "status": {"phase": phase}}


def refusal(o: UploadOptions, obj: dict[str, object]) -> str:
    with pytest.raises(TargetRefused) as err:
        check_existing_pvc(o, obj)
    return err.value.message


def test_a_pvc_that_already_holds_its_data_is_refused() -> None:
    o = options("pvc", "d", "--image-path=a", "--no-create")
    done = pvc({ANN_UPLOAD_REQUEST: "", ANN_POD_PHASE: "Succeeded"})
    assert refusal(o, done) == "PVC d already successfully imported/cloned/updated"


def test_a_pvc_that_is_not_an_upload_target_is_refused_unless_no_create() -> None:
    plain = pvc({})
    assert refusal(options("pvc", "d", "--image-path=a"), plain) == (
        "PVC d not available for upload"
    )
    check_existing_pvc(options("pvc", "d", "--image-path=a", "--no-create"), plain)


def test_an_archive_needs_an_archive_pvc() -> None:
    o = options("pvc", "d", "--archive-path=a.tar")
    assert refusal(o, pvc({ANN_UPLOAD_REQUEST: "", ANN_CONTENT_TYPE: "kubevirt"})) == (
        "PVC d doesn't have archive contentType annotation"
    )
    check_existing_pvc(o, pvc({ANN_UPLOAD_REQUEST: "", ANN_CONTENT_TYPE: "archive"}))


def test_a_pvc_without_its_datavolume_explains_which_case_it_is() -> None:
    assert no_datavolume(pvc({}), "ns", "d").message == (
        "No DataVolume is associated with the existing PVC ns/d"
    )
    collected = pvc({ANN_DELETE_AFTER_COMPLETION: "true", ANN_POD_PHASE: "Succeeded"})
    assert no_datavolume(collected, "ns", "d").message == (
        "DataVolume already garbage-collected: Assuming PVC ns/d is successfully populated"
    )


def test_a_populator_datavolume_uploads_into_pvc_prime() -> None:
    dv = {"metadata": {"annotations": {ANN_USE_POPULATOR: "true"}}}
    assert populator_prime_name({"metadata": {}}, pvc({}), "ns", "d") is None
    assert populator_prime_name(dv, pvc({ANN_PVC_PRIME_NAME: "prime-1"}), "ns", "d") == "prime-1"
    with pytest.raises(TargetRefused, match=r"^PVC d already successfully populated$"):
        populator_prime_name(dv, pvc({}, phase="Bound"), "ns", "d")
    with pytest.raises(TargetRefused, match=r"^Unable to get PVC Prime name from PVC ns/d$"):
        populator_prime_name(dv, pvc({}), "ns", "d")


def test_waiting_for_the_first_consumer_needs_force_bind() -> None:
    for phase in ("WaitForFirstConsumer", "PendingPopulation"):
        err = wffc_refusal(phase, force_bind=False)
        assert isinstance(err, TargetNotReady)
        assert err.message == (
            f"cannot upload to DataVolume in {phase} phase, make sure the PVC is Bound, "
            "or use force-bind flag"
        )
        assert wffc_refusal(phase, force_bind=True) is None
    assert wffc_refusal("UploadScheduled", force_bind=False) is None


# -- where the bytes go --------------------------------------------------------------------------


def test_the_proxy_url_comes_from_the_override_then_the_status() -> None:
    both = {"spec": {"uploadProxyURLOverride": "a.example"}, "status": {"uploadProxyURL": "b"}}
    assert proxy_url_from_config(both) == "a.example"
    assert proxy_url_from_config({"spec": {}, "status": {"uploadProxyURL": "b"}}) == "b"
    with pytest.raises(ProxyUrlNotFound, match=r"^uploadproxy URL not found$"):
        proxy_url_from_config({"spec": {}, "status": {}})


def test_a_proxy_address_without_scheme_is_https() -> None:
    assert with_scheme("proxy.example:443") == "https://proxy.example:443"
    assert with_scheme("http://127.0.0.1:8080") == "http://127.0.0.1:8080"


def test_an_upload_path_in_the_proxy_url_is_taken_off() -> None:
    assert proxy_base("https://p/") == "https://p"
    assert proxy_base("https://p:8443/base/") == "https://p:8443/base"
    assert proxy_base("https://p/v1beta1/upload") == "https://p"
    assert proxy_base("https://p/cdi/v1alpha1/upload-async") == "https://p/cdi"
    assert proxy_base("https://p/v1beta1/upload-form-async/") == "https://p"


# -- the entry point ----------------------------------------------------------------------------


def test_a_missing_image_is_refused_before_the_cluster_is_asked(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        open_image(str(tmp_path / "none.img"))
    assert err.value.message == f"open {tmp_path / 'none.img'}: no such file or directory"
    image = tmp_path / "a.img"
    image.write_bytes(b"x" * 1000)
    assert open_image(str(image)) == 1000


def test_the_command_exits_2_with_reason_and_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["upload", "dv", "x"]) == 2
    assert capsys.readouterr().err == (
        "cdi upload: InvalidArgument: either image-path or archive-path must be provided\n"
    )
    missing = tmp_path / "kubeconfig"
    image = tmp_path / "a.img"
    image.write_bytes(b"x")
    code = main(["upload", "dv", "x", f"--image-path={image}", f"--kubeconfig={missing}"])
    assert code == 1
    assert capsys.readouterr().err.startswith(
        f"cdi upload: InvalidKubeconfig: kubeconfig {missing}"
    )


def test_the_bar_follows_the_transfer_without_a_terminal() -> None:
    bar = ProgressBar(enabled=False)
    with bar.shown(100):
        bar.update(40, 100)
        bar.update(30, 100)  # a resume from the server's offset may step back
    assert (bar.done, bar.total) == (30, 100)


def kubeconfig(path: Path, contexts: dict[str, str | None], current: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {
                "name": n,
                "context": {"cluster": "c", "user": "u", **({"namespace": ns} if ns else {})},
            }
            for n, ns in contexts.items()
        ],
        "current-context": current,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_namespace_is_the_chosen_contexts_else_default(tmp_path: Path) -> None:
    path = kubeconfig(tmp_path / "config", {"a": "team-a", "b": None}, current="a")
    assert load_user_client(str(path))[1] == "team-a"
    assert load_user_client(str(path), "b")[1] == "default"
    other = kubeconfig(tmp_path / "other", {"x": "team-x"}, current="x")
    _, namespace = load_user_client(f"{tmp_path / 'missing'}:{other}")  # a KUBECONFIG list
    assert namespace == "team-x"
    with pytest.raises(KubeError) as err:
        load_user_client(str(path), "nope")
    assert err.value.reason == "InvalidKubeconfig"
