"""The clone size rule across volume modes (issue 29; ``cdi.render.clone.size_problem``): a
``storage``-API filesystem source into a block target is measured by what its ``disk.img`` can
be (the source's usable space), not by its claim's overhead-inflated request; a block source
into a filesystem target must fit after the target's overhead. Within one mode, and for
``pvc``-API clones, CDI's raw request compare."""

from __future__ import annotations

import pytest

from cdi.render import clone as plan
from cdi.render.pvc import required_space
from tests.unit.test_clone_render import claim

MiB = 1024 * 1024
OVERHEAD = 0.055
STORAGE = plan.CloneSizes(storage_api=True, source_overhead=OVERHEAD, target_overhead=OVERHEAD)
PVC_API = plan.CloneSizes(storage_api=False, source_overhead=OVERHEAD, target_overhead=OVERHEAD)


def fs(size: int) -> dict:
    return claim(str(size), mode="Filesystem")


def block(size: int) -> dict:
    return claim(str(size), cls="blk", mode="Block")


def inflated(size: int) -> int:
    return required_space(OVERHEAD, size)


def test_usable_space_undoes_the_storage_api_inflation_for_whole_mebibytes() -> None:
    for mib in (1, 64, 256, 1000, 10240):
        assert plan.usable_space(OVERHEAD, inflated(mib * MiB)) == mib * MiB
    assert plan.usable_space(OVERHEAD, 256 * MiB) < 256 * MiB


def test_the_issue_case_a_storage_api_fs_golden_into_an_equal_block_target_is_admitted() -> None:
    # 256Mi asked on both sides; the source claim was inflated for its filesystem's overhead
    assert plan.size_problem(fs(inflated(256 * MiB)), block(256 * MiB), STORAGE) is None


def test_fs_to_block_is_measured_by_what_the_source_disk_img_can_be() -> None:
    source = fs(inflated(256 * MiB))
    assert plan.size_problem(source, block(300 * MiB), STORAGE) is None
    assert plan.size_problem(source, block(255 * MiB), STORAGE) == (
        f"{plan.SMALLER} {255 * MiB} < {256 * MiB}"
    )
    # a class with more overhead leaves less room for disk.img in the same claim
    roomy = plan.CloneSizes(True, source_overhead=0.2)
    assert plan.size_problem(source, block(255 * MiB), roomy) is None


def test_fs_to_block_with_the_pvc_api_keeps_cdis_raw_compare() -> None:
    source = fs(inflated(256 * MiB))
    assert plan.size_problem(source, block(256 * MiB), PVC_API) == (
        f"{plan.SMALLER} {256 * MiB} < {inflated(256 * MiB)}"
    )
    assert plan.size_problem(source, block(inflated(256 * MiB)), PVC_API) is None


@pytest.mark.parametrize("sizes", [STORAGE, PVC_API])
def test_block_to_fs_needs_the_device_to_fit_after_the_target_overhead(
    sizes: plan.CloneSizes,
) -> None:
    device = 256 * MiB
    assert plan.size_problem(block(device), fs(inflated(device)), sizes) is None
    # the same raw size (CDI admits it with the pvc API, and the copy runs out of room)
    room = plan.usable_space(OVERHEAD, device)
    assert plan.size_problem(block(device), fs(device), sizes) == (
        f"{plan.SMALLER} {room} < {device}"
    )


def test_block_to_fs_with_the_pvc_api_is_refused_first_by_the_raw_compare() -> None:
    assert plan.size_problem(block(256 * MiB), fs(128 * MiB), PVC_API) == (
        f"{plan.SMALLER} {128 * MiB} < {256 * MiB}"
    )


@pytest.mark.parametrize("sizes", [STORAGE, PVC_API, None])
def test_within_one_mode_the_requests_compare_as_cdi_does(sizes: plan.CloneSizes | None) -> None:
    for make in (fs, block):
        assert plan.size_problem(make(64 * MiB), make(64 * MiB), sizes) is None
        assert plan.size_problem(make(64 * MiB), make(128 * MiB), sizes) is None
        assert plan.size_problem(make(64 * MiB), make(32 * MiB), sizes) == (
            f"{plan.SMALLER} {32 * MiB} < {64 * MiB}"
        )


def test_a_claim_without_a_size_is_not_judged() -> None:
    assert plan.size_problem(claim(None), block(MiB), STORAGE) is None
    assert plan.size_problem(block(MiB), claim(None), STORAGE) is None


# -- sizing an unsized host-assisted clone from the image (issue 27, CDI detectCloneSize) -----


def test_an_unsized_clone_asks_for_the_image_plus_the_targets_overhead() -> None:
    source = fs(inflated(256 * MiB))  # its disk.img was grown to 256 MiB
    content = plan.content_size(source, OVERHEAD)
    assert content == 256 * MiB
    roomier = plan.sized_from_content(claim(None), source, content, 0.2)
    assert plan.requested(roomier) == required_space(0.2, 256 * MiB)
    assert "cdi.kubevirt.io/permissiveClone" not in roomier["metadata"]["annotations"]
    # a block target asks for the image alone: less than the source's claim, so permissive
    device = plan.sized_from_content(claim(None, cls="blk", mode="Block"), source, content, 0.0)
    assert plan.requested(device) == 256 * MiB
    assert device["metadata"]["annotations"]["cdi.kubevirt.io/permissiveClone"] == "true"
    assert plan.permissive(device) and not plan.permissive(roomier)


def test_cdis_cached_measurement_counts_for_the_current_capacity_within_the_volume() -> None:
    source = fs(inflated(256 * MiB))
    source["status"] = {"capacity": {"storage": "300Mi"}}
    cached = {"cdi.Kubervirt.io/virtualSize": str(100 * MiB),
              "cdi.Kubervirt.io/sourceCapacity": "300Mi"}  # fmt: skip
    source["metadata"]["annotations"].update(cached)
    assert plan.content_size(source, OVERHEAD) == 100 * MiB
    source["metadata"]["annotations"]["cdi.Kubervirt.io/sourceCapacity"] = "200Mi"  # resized
    assert plan.content_size(source, OVERHEAD) == 256 * MiB
    source["metadata"]["annotations"].update(cached)
    source["metadata"]["annotations"]["cdi.Kubervirt.io/virtualSize"] = str(10 * 1024 * MiB)
    assert plan.content_size(source, OVERHEAD) == 256 * MiB  # never more than the volume holds


def test_only_a_filesystem_source_holding_an_image_is_sized_from_it() -> None:
    assert plan.detects_size(fs(64 * MiB))
    assert not plan.detects_size(block(64 * MiB))
    archive = fs(64 * MiB)
    archive["metadata"]["annotations"]["cdi.kubevirt.io/storage.contentType"] = "archive"
    assert not plan.detects_size(archive)


def test_permissive_clone_is_the_users_true_on_the_datavolume_or_the_claim() -> None:
    dv = {"metadata": {"annotations": {"cdi.kubevirt.io/permissiveClone": "true"}}}
    assert plan.permissive(dv, claim())
    assert not plan.permissive({"metadata": {"annotations": {
        "cdi.kubevirt.io/permissiveClone": "false"}}}, claim())  # fmt: skip
