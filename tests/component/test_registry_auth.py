"""Registry authentication and trust against the real registry: htpasswd (Basic) and the
docker token flow (Bearer, from a token server that checks credentials), a TLS registry's CA
or CDIConfig ``insecureRegistries``, the import network policy, and the typed failure for each
refusal (CDI's ``ImagePullFailed`` for unknown images and refused credentials)."""

from __future__ import annotations

from pathlib import Path

from cdi.api.netpolicy import NetPolicy
from testkit.containerdisk import add_disk
from tests.component.conftest import ImageFactory, same_content
from tests.component.registry_fixtures import (  # noqa: F401 (fixture)
    PASSWORD,
    USER,
    Registries,
    import_image,
    registries_fixture,
)


async def test_bearer_token_flow_with_credentials(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    reg = registries.bearer
    assert reg.token is not None
    registries.publish(reg, "private/disk", [add_disk(("disk.qcow2", image.path))])
    issued = reg.token.issued
    target = tmp_path / "disk.img"
    result = await import_image(
        reg.url("private/disk", "v1"),
        target,
        registries=registries,
        username=USER,
        password=PASSWORD,
    )
    assert result.succeeded, result
    assert same_content(target, image.reference)
    assert reg.token.issued == issued + 1, "one token for the whole pull"
    refused = await import_image(
        reg.url("private/disk", "v1"),
        tmp_path / "x.img",
        registries=registries,
        username=USER,
        password="wrong",
    )
    assert refused.reason == "ImagePullFailed", refused
    assert refused.message.startswith("failed to pull image: ")
    assert "wrong" not in refused.message and PASSWORD not in refused.message
    anonymous = await import_image(
        reg.url("private/disk", "v1"), tmp_path / "y.img", registries=registries
    )
    assert anonymous.reason == "ImagePullFailed", anonymous


async def test_basic_auth_refuses_wrong_or_missing_credentials(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    reg = registries.basic
    registries.publish(reg, "basic/disk", [add_disk(("disk.qcow2", image.path))])
    url = reg.url("basic/disk", "v1")
    wrong = await import_image(
        url, tmp_path / "a.img", registries=registries, username=USER, password="nope"
    )
    assert wrong.reason == "ImagePullFailed" and "refused access" in wrong.message, wrong
    missing = await import_image(url, tmp_path / "b.img", registries=registries)
    assert missing.reason == "ImagePullFailed" and "requires credentials" in missing.message
    assert not (tmp_path / "a.img").exists() and not (tmp_path / "b.img").exists()


async def test_tls_registry_needs_its_ca_unless_listed_insecure(
    registries: Registries, images: ImageFactory, tmp_path: Path
) -> None:
    image = images.make("qcow2")
    reg = registries.basic
    registries.publish(reg, "tls/disk", [add_disk(("disk.qcow2", image.path))])
    url = reg.url("tls/disk", "v1")
    creds = {"username": USER, "password": PASSWORD}
    no_ca = await import_image(url, tmp_path / "a.img", registries=registries, ca=False, **creds)
    assert no_ca.reason == "ImagePullFailed" and "certificate" in no_ca.message, no_ca
    insecure = await import_image(
        url, tmp_path / "b.img", registries=registries, ca=False, insecure_registry=True,
        http={"insecure": True}, **creds,
    )  # fmt: skip
    assert insecure.succeeded, insecure
    assert same_content(tmp_path / "b.img", image.reference)


async def test_unknown_image_or_tag_is_image_pull_failed(
    registries: Registries, tmp_path: Path
) -> None:
    reg = registries.anonymous
    result = await import_image(
        reg.url("myorg/myimage", "wrongtag"), tmp_path / "d.img", insecure_registry=True
    )
    assert result.reason == "ImagePullFailed", result
    assert (
        result.message.startswith("failed to pull image: ") and "manifest unknown" in result.message
    )


async def test_registry_outside_the_import_policy_is_never_contacted(
    registries: Registries, tmp_path: Path
) -> None:
    reg = registries.anonymous
    result = await import_image(
        reg.url("disks/anything", "v1"), tmp_path / "d.img", insecure_registry=True,
        http={"policy": NetPolicy()},
    )  # fmt: skip
    assert result.reason == "SourceForbidden", result
    assert "not allowed by the import policy" in result.message


async def test_blob_redirected_to_another_origin_gets_no_credentials(tmp_path: Path) -> None:
    """Registries hand blobs to a CDN with a redirect: the registry's Authorization must not
    follow it. A small registry front (aiohttp) redirects blob GETs to a second origin, which
    records the headers it was sent."""
    import base64
    import gzip
    import hashlib
    import json

    from aiohttp import web

    from testkit.containerdisk import disk_layer_tar

    disk = bytes(range(256)) * 1024
    layer = gzip.compress(disk_layer_tar({"disk.img": disk}))
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {}}).encode()

    def digest(data: bytes) -> str:
        return "sha256:" + hashlib.sha256(data).hexdigest()

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "x", "digest": digest(config), "size": len(config)},
            "layers": [{"mediaType": "x", "digest": digest(layer), "size": len(layer)}],
        }
    ).encode()
    basic = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    cdn_saw: list[str | None] = []

    async def cdn(request: web.Request) -> web.Response:
        cdn_saw.append(request.headers.get("Authorization"))
        return web.Response(body=layer)

    cdn_app = web.Application()
    cdn_app.router.add_get("/blob", cdn)
    cdn_runner = web.AppRunner(cdn_app)
    await cdn_runner.setup()
    cdn_site = web.TCPSite(cdn_runner, "127.0.0.1", 0)
    await cdn_site.start()
    cdn_port = cdn_site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def registry(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != basic:
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="r"'})
        what = request.match_info["what"]
        if what.startswith("manifests/"):
            return web.Response(body=manifest, content_type="application/json")
        if what == f"blobs/{digest(config)}":
            return web.Response(body=config)
        raise web.HTTPTemporaryRedirect(f"http://127.0.0.1:{cdn_port}/blob")

    app = web.Application()
    app.router.add_get("/v2/disks/cdn/{what:.*}", registry)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        target = tmp_path / "disk.img"
        result = await import_image(
            f"docker://127.0.0.1:{port}/disks/cdn:v1",
            target,
            insecure_registry=True,
            username=USER,
            password=PASSWORD,
        )
        assert result.succeeded, result
        assert target.read_bytes() == disk
        assert cdn_saw == [None], "the registry's credentials followed the redirect"
    finally:
        await runner.cleanup()
        await cdn_runner.cleanup()
