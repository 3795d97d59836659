"""The importer's edge: any failure ends as a typed termination message, and a bug's text
(which may hold a URL's credentials) reaches only the log, redacted."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import subprocess
import sys
from pathlib import Path

from cdi.api.errors import SourceNotFound
from cdi.api.redact import redact_text as redact
from cdi.api.termination import TerminationMessage
from importer.failure import INTERNAL_MESSAGE, guarded

SECRET_URL = "https://alice:hunter2@images.example/disk.img?X-Amz-Signature=abc123&x=1"


def _logger() -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    log = logging.getLogger(f"test-{id(out)}")
    log.addHandler(logging.StreamHandler(out))
    log.propagate = False
    return log, out


def test_redact_removes_userinfo_and_query_from_every_url() -> None:
    text = redact(f"failed on {SECRET_URL} and 'http://bob:pw@h:8080/x?t=1#frag' too")
    assert "hunter2" not in text and "alice" not in text and "abc123" not in text
    assert "pw@" not in text and "t=1" not in text
    assert "https://REDACTED@images.example/disk.img?REDACTED" in text
    assert "http://REDACTED@h:8080/x?REDACTED#REDACTED" in text


def test_an_unexpected_exception_becomes_an_internal_error(tmp_path: Path) -> None:
    log, out = _logger()
    term = tmp_path / "term"

    async def crash() -> TerminationMessage:
        raise RuntimeError(f"bug while reading {SECRET_URL}")

    message = asyncio.run(guarded(crash, str(term), log))
    assert message.reason == "InternalError" and not message.succeeded
    assert message.message == INTERNAL_MESSAGE
    assert TerminationMessage.from_json(term.read_text()) == message
    assert "hunter2" not in term.read_text() and "Traceback" not in term.read_text()
    logged = out.getvalue()
    assert "Traceback" in logged and "RuntimeError" in logged
    assert "hunter2" not in logged and "abc123" not in logged


def test_a_typed_error_keeps_its_reason_and_message(tmp_path: Path) -> None:
    log, out = _logger()

    async def missing() -> TerminationMessage:
        raise SourceNotFound("no such image")

    message = asyncio.run(guarded(missing, str(tmp_path / "term"), log))
    assert (message.reason, message.message) == ("SourceNotFound", "no such image")
    assert out.getvalue() == ""


def test_the_pod_ends_with_a_typed_message_on_a_bug_in_its_environment(tmp_path: Path) -> None:
    """A malformed number in the environment raises ValueError, not a WorkerError: the pod
    still leaves a typed termination message, without the exception's text."""
    term = tmp_path / "term"
    env = {
        **os.environ,
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": SECRET_URL,
        "IMPORTER_TERMINATION_PATH": str(term),
        "IMPORTER_DATA_DIR": str(tmp_path),
        "IMPORTER_CHECKPOINT_INTERVAL": "lots",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "importer"], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1
    message = TerminationMessage.from_json(term.read_text())
    assert (message.reason, message.message) == ("InternalError", INTERNAL_MESSAGE)
    assert "lots" not in term.read_text()
    assert "ValueError" in proc.stderr and "hunter2" not in proc.stderr + proc.stdout
