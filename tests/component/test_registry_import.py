"""Registry imports end to end against the real distribution registry: containerDisks built
with umoci and pushed with skopeo import byte-identical to ``qemu-img convert`` of their disk,
in one streamed pass with zero scratch bytes, whatever the layer compression, platform index or
layer stacking; and every broken image fails with its own typed reason."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testkit.containerdisk import add_disk, disk_layer_tar, push_plain, remove
from tests.component.conftest import ImageFactory, same_content
from tests.component.registry_fixtures import (  # noqa: F401 (fixture)
    Registries,
    import_image,
    registries_fixture,
)

OTHER_DISK = bytes(range(256)) * 4096  # 1 MiB raw, unlike any disk the image factory makes


@pytest.mark.parametrize(
    ("kind", "compression"), [("qcow2", None), ("raw", None), ("raw", "xz"), ("qcow2", "gz")]
)
async def test_containerdisk_imports_byte_identical_without_scratch(
    registries: Registries, images: ImageFactory, tmp_path: Path, kind: str, compression: str | None
) -> None:
    image = images.make(kind, compression)
    reg = registries.anonymous
    repo = f"disks/{kind}{compression or ''}"
    pushed = registries.publish(reg, repo, [add_disk((image.path.name, image.path))])
    target = tmp_path / "disk.img"
    result = await import_image(reg.url(repo, "v1"), target, insecure_registry=True)
    assert result.succeeded, result
    assert same_content(target, image.reference)
    assert result.scratch_bytes == 0 and not result.scratch_used
    assert result.source_digest == pushed, "the tag is resolved once and reported"


async def test_iso_containerdisk_imports_as_is(registries: Registries, tmp_path: Path) -> None:
    """An installer ISO (made by xorriso, as users publish them) is a raw disk: sniffed as
    such and written byte for byte, in one pass with no scratch."""
    content = tmp_path / "iso-root"
    content.mkdir()
    (content / "MARKER.TXT").write_text("cdi-py iso containerDisk\n")
    iso = tmp_path / "installer.iso"
    subprocess.run(
        ["xorriso", "-as", "mkisofs", "-quiet", "-V", "CDIPY", "-o", str(iso), str(content)],
        check=True,
    )
    reg = registries.anonymous
    registries.publish(reg, "disks/iso", [add_disk(("installer.iso", iso))])
    target = tmp_path / "disk.img"
    result = await import_image(reg.url("disks/iso", "v1"), target, insecure_registry=True)
    assert result.succeeded, result
    assert same_content(target, iso)
    assert result.scratch_bytes == 0 and not result.scratch_used


async def test_zstd_and_uncompressed_layers_import(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    reg = registries.anonymous
    registries.publish(reg, "disks/zstd", [add_disk(("disk.qcow2", image.path))], zstd=True)
    result = await import_image(
        reg.url("disks/zstd", "v1"), tmp_path / "z.img", insecure_registry=True
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "z.img", image.reference)
    layer = disk_layer_tar({"disk.qcow2": image.path.read_bytes()})
    push_plain(reg, "disks/plain", "v1", layer)
    result = await import_image(
        reg.url("disks/plain", "v1"), tmp_path / "p.img", insecure_registry=True
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "p.img", image.reference) and result.scratch_bytes == 0


async def test_image_env_becomes_labels_and_credentials_reach_a_tls_registry(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    env = ["TEST_KUBEVIRT_IO_TEST=testvalue", "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora"]
    env += ["PATH=/bin", "BAD_KUBEVIRT_IO_X=not a label value"]
    reg = registries.basic
    registries.publish(reg, "disks/labelled", [add_disk(("disk.qcow2", image.path))], env=env)
    result = await import_image(
        reg.url("disks/labelled", "v1"),
        tmp_path / "disk.img",
        registries=registries,
        username="kubevirt",
        password="s3cret-pass",
    )
    assert result.succeeded, result
    assert result.labels == {
        "test.kubevirt.io/test": "testvalue",
        "instancetype.kubevirt.io/default-preference": "fedora",
    }
    assert same_content(tmp_path / "disk.img", image.reference)


async def test_multi_arch_index_picks_the_platform_or_says_none_matches(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    from testkit.containerdisk import Layout, push

    amd = images.make("qcow2")
    arm = tmp_path / "arm.raw"
    arm.write_bytes(OTHER_DISK)  # a different disk, so picking the wrong one shows
    layout = Layout.create(tmp_path / "layout")
    layout.build("amd", [add_disk(("disk.qcow2", amd.path))], architecture="amd64")
    layout.build("arm", [add_disk(("disk.raw", arm))], architecture="arm64")
    layout.multi_arch("multi", {"amd64": "amd", "arm64": "arm"})
    reg = registries.anonymous
    push(layout, "multi", reg, "disks/multi", all_images=True)
    url = reg.url("disks/multi", "multi")
    for arch, want in (("amd64", amd.reference), ("arm64", arm)):
        target = tmp_path / f"{arch}.img"
        result = await import_image(url, target, insecure_registry=True, architecture=arch)
        assert result.succeeded, result
        assert same_content(target, want)
    result = await import_image(
        url, tmp_path / "x.img", insecure_registry=True, architecture="absent"
    )
    assert result.reason == "Error"
    assert result.message.endswith(
        'no image found in image index for architecture "absent", variant "", OS "linux"'
    )


async def test_upper_layers_overwrite_or_white_out_the_lower_disk(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    old, new = OTHER_DISK, images.make("qcow2")  # distinct contents: the wrong pick shows
    reg = registries.anonymous
    overwritten = [add_disk(("disk.img", old)), add_disk(("disk.img", new.path))]
    registries.publish(reg, "disks/over", overwritten)
    result = await import_image(
        reg.url("disks/over", "v1"), tmp_path / "o.img", insecure_registry=True
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "o.img", new.reference)
    replaced = [
        add_disk(("old.img", old)),
        remove("disk/old.img"),
        add_disk(("new.qcow2", new.path)),
    ]
    registries.publish(reg, "disks/whiteout", replaced)
    result = await import_image(
        reg.url("disks/whiteout", "v1"), tmp_path / "w.img", insecure_registry=True
    )
    assert result.succeeded, result
    assert same_content(tmp_path / "w.img", new.reference)
    registries.publish(reg, "disks/gone", [add_disk(("old.img", old)), remove("disk/old.img")])
    result = await import_image(
        reg.url("disks/gone", "v1"), tmp_path / "g.img", insecure_registry=True
    )
    assert not result.succeeded
    assert "image file does not exist in image directory - directory is empty" in result.message


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (
            {"a.img": b"\0" * 4096, "b.img": b"\0" * 4096},
            "image directory contains more than one file",
        ),
        ({}, "image file does not exist in image directory - directory is empty"),
        ({"sub/x.img": b"\0" * 4096}, "image directory contains another directory"),
    ],
)
async def test_disk_folder_must_hold_exactly_one_file(
    registries: Registries, tmp_path: Path, files: dict[str, bytes], message: str
) -> None:
    reg = registries.anonymous
    repo = f"disks/bad{len(files)}{'sub' if any('/' in f for f in files) else ''}"

    def fill(rootfs: Path) -> None:
        (rootfs / "disk").mkdir()
        (rootfs / "etc").mkdir()
        (rootfs / "etc/os-release").write_text("not a disk\n")
        for name, content in files.items():
            (rootfs / "disk" / name).parent.mkdir(parents=True, exist_ok=True)
            (rootfs / "disk" / name).write_bytes(content)

    registries.publish(reg, repo, [fill])
    target = tmp_path / "disk.img"
    result = await import_image(reg.url(repo, "v1"), target, insecure_registry=True)
    assert result.reason == "InvalidImage", result
    assert message in result.message
    assert not target.exists()


async def test_tampered_blob_fails_with_digest_mismatch_and_leaves_nothing(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("raw")
    reg = registries.anonymous
    digest = registries.publish(reg, "disks/tampered", [add_disk(("disk.img", image.path))])
    url = reg.url("disks/tampered", digest)
    manifest = await _manifest(reg, "disks/tampered", digest)
    layer = reg.blob_path(manifest["layers"][0]["digest"])
    data = bytearray(layer.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the gzip stream
    layer.write_bytes(bytes(data))
    target = tmp_path / "disk.img"
    result = await import_image(url, target, insecure_registry=True)
    assert result.reason in ("DigestMismatch", "InvalidImage"), result
    assert not target.exists()
    # A flip the gzip layer cannot notice: the same length, valid compression, other content.
    reg_layer = disk_layer_tar({"disk.img": b"\1" * 65536})
    pinned = push_plain(reg, "disks/tampered-plain", "v1", reg_layer)
    manifest = await _manifest(reg, "disks/tampered-plain", pinned)
    blob = reg.blob_path(manifest["layers"][0]["digest"])
    blob.write_bytes(blob.read_bytes().replace(b"\1" * 512, b"\2" * 512, 1))
    result = await import_image(
        reg.url("disks/tampered-plain", pinned), target, insecure_registry=True
    )
    assert result.reason == "DigestMismatch", result
    assert not target.exists()


async def _manifest(reg: object, repo: str, digest: str) -> dict:  # type: ignore[type-arg]
    import json

    from testkit.registry import Registry

    assert isinstance(reg, Registry)
    conn = reg.connection()
    conn.request(
        "GET",
        f"/v2/{repo}/manifests/{digest}",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
    )
    body = conn.getresponse().read()
    conn.close()
    return dict(json.loads(body))
