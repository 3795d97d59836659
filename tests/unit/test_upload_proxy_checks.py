"""The proxy's pure checks: the Authorization header, the PVC state table, the archive path."""

from __future__ import annotations

from typing import Any

import pytest

from cdi.upload.errors import BadUploadRequest, InvalidToken, UploadNotReady
from cdi.upload.proxy import bearer_token, upload_path
from cdi.upload.readiness import upload_target
from cdi.upload.token import UploadGrant

GRANT = UploadGrant("ns", "disk", "uid-1")


def pvc(uid: str = "uid-1", **annotations: str) -> dict[str, Any]:
    ann = {"cdi.kubevirt.io/storage.upload.target": "", **annotations}
    return {"metadata": {"name": "disk", "uid": uid, "annotations": ann}, "spec": {}}


@pytest.mark.parametrize(
    ("header", "token"),
    [("Bearer abc.def-ghi_~+/", "abc.def-ghi_~+/"), ("bearer   x", "x"), ("BEARER\tx", "x")],
)
def test_bearer_tokens_are_taken_case_insensitively(header: str, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize("header", [None, "", "Beereer valid", "Bearer", "Bearer a b", "Basic x"])
def test_other_authorization_headers_are_bad_requests(header: str | None) -> None:
    with pytest.raises(BadUploadRequest):
        bearer_token(header)


@pytest.mark.parametrize("ready", ["true", "True", "1", "t"])
def test_a_ready_upload_target_is_the_target(ready: str) -> None:
    obj = pvc(**{"cdi.kubevirt.io/storage.pod.ready": ready})
    assert upload_target(GRANT, obj, None) is obj


@pytest.mark.parametrize("ready", [None, "false", "yes"])
def test_a_not_ready_upload_target_means_wait(ready: str | None) -> None:
    ann = {} if ready is None else {"cdi.kubevirt.io/storage.pod.ready": ready}
    assert upload_target(GRANT, pvc(**ann), None) is None


def test_the_uid_is_checked_before_the_pvc_state() -> None:
    with pytest.raises(InvalidToken):
        upload_target(
            GRANT, pvc(uid="uid-2", **{"cdi.kubevirt.io/storage.pod.phase": "Succeeded"}), None
        )
    with pytest.raises(InvalidToken):
        upload_target(UploadGrant("ns", "disk", ""), pvc(), None)  # a token without a UID


def test_a_finished_upload_is_refused_even_when_the_pod_is_ready() -> None:
    done = pvc(
        **{
            "cdi.kubevirt.io/storage.pod.phase": "Succeeded",
            "cdi.kubevirt.io/storage.pod.ready": "true",
        }
    )
    with pytest.raises(UploadNotReady, match="already finished uploading"):
        upload_target(GRANT, done, None)


@pytest.mark.parametrize(
    ("content_type", "path", "expected"),
    [
        (None, "/v1beta1/upload-form", "/v1beta1/upload-form"),
        ("kubevirt", "/v1alpha1/upload", "/v1alpha1/upload"),
        ("archive", "/v1beta1/upload-form-async", "/v1beta1/upload-archive"),
        ("archive", "/v1alpha1/upload-async", "/v1alpha1/upload-archive"),
    ],
)
def test_the_path_follows_the_content_type(
    content_type: str | None, path: str, expected: str
) -> None:
    ann = {} if content_type is None else {"cdi.kubevirt.io/storage.contentType": content_type}
    assert upload_path(pvc(**ann), "disk", path) == expected
