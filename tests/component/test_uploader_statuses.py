"""The upload server's answers, each in its own test: CDI's statuses and texts (200, 400, 401,
404, 409, 500, 503), the tus headers, the termination message and the deadline. Real TLS on
127.0.0.1, real images made by qemu-img (conftest ``images``)."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from cdi.api.termination import TerminationMessage
from tests.component.conftest import VIRTUAL, ImageFactory, same_content
from tests.component.uploader_harness import (
    Pki,
    data_target,
    free_port,
    make_pki,
    running_app,
    running_server,
    server_env,
)
from uploader.config import from_env

MiB = 1024 * 1024


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return make_pki(tmp_path / "pki")


@pytest.fixture
def env(pki: Pki, tmp_path: Path) -> dict[str, str]:
    return server_env(pki, data_target(tmp_path), "64Mi", free_port())


async def call(
    method: str,
    url: str,
    ctx: ssl.SSLContext | bool,
    data: object = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, str, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, data=data, headers=headers, ssl=ctx) as resp,
    ):
        return resp.status, await resp.text(), dict(resp.headers)


async def test_client_certificate_with_another_cn_is_401(pki: Pki, env: dict[str, str]) -> None:
    async with running_server(env) as srv:
        ctx = pki.client_context(pki.stranger)
        status, _, _ = await call("POST", srv.url + "/v1beta1/upload", ctx, b"x" * 4096)
    assert status == 401
    assert not Path(env["DESTINATION"]).exists()


async def test_other_methods_are_404(pki: Pki, env: dict[str, str]) -> None:
    async with running_server(env) as srv:
        for method in ("GET", "PUT", "DELETE"):
            status, _, _ = await call(method, srv.url + "/v1beta1/upload", pki.client_context())
            assert status == 404, method
        status, _, _ = await call("POST", srv.url + "/v1beta1/elsewhere", pki.client_context())
        assert status == 404


async def test_head_on_async_path_is_200_with_tus_offset(pki: Pki, env: dict[str, str]) -> None:
    async with running_server(env) as srv:
        for path in ("/v1beta1/upload-async", "/v1alpha1/upload-async"):
            status, _, headers = await call("HEAD", srv.url + path, pki.client_context())
            assert status == 200
            assert headers["Upload-Offset"] == "0"
            assert headers["Tus-Resumable"] == "1.0.0"
            assert headers["Cache-Control"] == "no-store"
        status, _, headers = await call(
            "OPTIONS", srv.url + "/v1beta1/upload", pki.client_context()
        )
        assert status == 204 and headers["Tus-Version"] == "1.0.0"


async def test_sync_upload_is_200_and_ends_the_pod_with_upload_complete(
    pki: Pki, env: dict[str, str], images: ImageFactory
) -> None:
    image = images.make("qcow2")
    async with running_server(env) as srv:
        status, _, _ = await call(
            "POST", srv.url + "/v1beta1/upload", pki.client_context(), image.path.read_bytes()
        )
        outcome = await asyncio.wait_for(srv.task, 30)
    assert status == 200
    assert outcome.succeeded and outcome.message == "Upload Complete"
    written = TerminationMessage.from_json(srv.termination.read_text())
    assert written.message == "Upload Complete" and written.format_chain == ("qcow2",)
    assert same_content(Path(env["DESTINATION"]), image.reference, VIRTUAL)


async def test_second_upload_while_one_is_in_flight_is_503(
    pki: Pki, env: dict[str, str], images: ImageFactory
) -> None:
    image = images.make("raw").reference.read_bytes()
    release = asyncio.Event()

    async def slow() -> AsyncIterator[bytes]:
        yield image[: 4 * MiB]
        await release.wait()
        yield image[4 * MiB :]

    async with running_server(env) as srv:
        first = asyncio.ensure_future(
            call(
                "POST",
                srv.url + "/v1beta1/upload",
                pki.client_context(),
                slow(),
                {"Content-Length": str(len(image))},
            )
        )
        await asyncio.sleep(0.5)
        second = await call("POST", srv.url + "/v1beta1/upload", pki.client_context(), b"abc")
        release.set()
        assert (await first)[0] == 200
    assert second[0] == 503


async def test_upload_after_completion_is_409(
    pki: Pki, env: dict[str, str], images: ImageFactory
) -> None:
    image = images.make("raw", "gz")
    async with running_app(from_env(env)) as (url, uploads):
        first = await call(
            "POST", url + "/v1beta1/upload", pki.client_context(), image.path.read_bytes()
        )
        again = await call("POST", url + "/v1beta1/upload", pki.client_context(), b"more")
        patch = await call(
            "PATCH",
            url + "/v1beta1/upload",
            pki.client_context(),
            b"more",
            {"Upload-Offset": "5", "Content-Type": "application/offset+octet-stream"},
        )
    assert first[0] == 200 and uploads.outcome is not None
    assert again[0] == 409 and patch[0] == 409


@pytest.mark.parametrize("path", ["/v1beta1/upload", "/v1beta1/upload-async"])
async def test_image_larger_than_the_volume_is_400(
    pki: Pki, tmp_path: Path, images: ImageFactory, path: str
) -> None:
    env = server_env(pki, data_target(tmp_path), "8Mi", free_port())
    async with running_server(env) as srv:
        for kind, compression in (("qcow2", None), ("raw", "xz")):
            body = images.make(kind, compression).path.read_bytes()
            status, text, _ = await call("POST", srv.url + path, pki.client_context(), body)
            assert status == 400, text
            assert text.startswith(
                "Saving stream failed: effective image size is larger than the reported "
                "available storage: "
            )
        assert not srv.task.done()  # still ready for a retry, as CDI
    assert not Path(env["DESTINATION"]).exists()


async def test_corrupt_image_is_500_with_a_typed_message(pki: Pki, env: dict[str, str]) -> None:
    body = b"QFI\xfb" + b"\x00\x00\x00\x03" + b"\xff" * 600_000  # qcow2 magic, hostile header
    async with running_server(env) as srv:
        status, text, _ = await call(
            "POST", srv.url + "/v1beta1/upload", pki.client_context(), body
        )
    assert status == 500
    assert text.startswith("Saving stream failed: ")
    assert "Traceback" not in text and 'File "' not in text


async def test_async_clone_is_refused(pki: Pki, env: dict[str, str]) -> None:
    async with running_server(env) as srv:
        status, text, _ = await call(
            "POST",
            srv.url + "/v1beta1/upload-async",
            pki.client_context(),
            b"x" * 1024,
            {"x-cdi-content-type": "blockdevice-clone"},
        )
    assert (status, text) == (400, "async clone not supported")


async def test_form_without_a_file_part_is_400(pki: Pki, env: dict[str, str]) -> None:
    form = aiohttp.FormData()
    form.add_field("other", b"x" * 100, filename="x.img")
    async with running_server(env) as srv:
        status, _, _ = await call(
            "POST", srv.url + "/v1beta1/upload-form", pki.client_context(), form
        )
    assert status == 400


async def test_retry_from_byte_zero_after_a_cut_succeeds(
    pki: Pki, env: dict[str, str], images: ImageFactory
) -> None:
    """CDI's "succeed on retry after failure": a body that breaks after 2 KiB, then a plain
    POST of the whole image."""
    image = images.make("qcow2")

    async def broken() -> AsyncIterator[bytes]:
        yield image.path.read_bytes()[:2048]
        raise ConnectionResetError("the client gave up")

    async with running_server(env) as srv:
        with pytest.raises(aiohttp.ClientError):
            await call(
                "POST",
                srv.url + "/v1beta1/upload",
                pki.client_context(),
                broken(),
                {"Content-Length": str(image.path.stat().st_size)},
            )
        status, _, _ = await call(
            "POST", srv.url + "/v1beta1/upload", pki.client_context(), image.path.read_bytes()
        )
        assert status == 200
        await asyncio.wait_for(srv.task, 30)
    assert same_content(Path(env["DESTINATION"]), image.reference, VIRTUAL)


async def test_deadline_passed_without_an_upload_ends_the_pod(pki: Pki, tmp_path: Path) -> None:
    target = data_target(tmp_path)
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    env = server_env(pki, target, "64Mi", free_port(), DEADLINE=past)
    async with running_server(env) as srv:
        outcome = await asyncio.wait_for(srv.task, 10)
    assert outcome.reason == "DeadlinePassed" and "deadlinePassed" in outcome.message
    assert TerminationMessage.from_json(srv.termination.read_text()).reason == "DeadlinePassed"
