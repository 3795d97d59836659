"""The two process edges: ``cdi import`` and the pod's ``python -m importer``."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import aiohttp

from cdi.api.termination import TerminationMessage
from tests.component.conftest import ImageFactory, MiB, Server, same_content

CDI = [sys.executable, "-m", "commands.main"]


async def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cli_import_json_success(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("qcow2", "zst")
    target = tmp_path / "vol" / "disk.img"
    target.parent.mkdir()
    code, out, err = await _run(
        *CDI, "import", server.link("nohead", image.path), str(target), "--size", "64Mi", "--json"
    )
    assert code == 0, err
    result = json.loads(out)
    assert result["reason"] == "Completed"
    assert result["format_chain"] == ["zst", "qcow2"]
    assert target.stat().st_size == 64 * MiB


async def test_cli_failure_exits_nonzero_with_reason(server: Server, tmp_path: Path) -> None:
    code, out, err = await _run(
        *CDI, "import", f"{server.url}/ok/nothing.img", str(tmp_path / "disk.img")
    )
    assert code == 1
    assert "SourceNotFound" in err and "404" in err
    assert "FAILED" in out


async def test_cli_refuses_to_overwrite_and_rejects_bad_checksum(tmp_path: Path) -> None:
    existing = tmp_path / "disk.img"
    existing.write_bytes(b"precious")
    code, _, err = await _run(*CDI, "import", "blank:", str(existing), "--size", "1Mi")
    assert code != 0 and "exists" in err
    assert existing.read_bytes() == b"precious"
    code, _, err = await _run(
        *CDI,
        "import",
        "blank:",
        str(tmp_path / "x.img"),
        "--size",
        "1Mi",
        "--checksum",
        "sha256:abc",
    )
    assert code == 2 and "InvalidConfig" in err


async def test_cli_metrics_endpoint_reports_cdi_progress(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw", "xz1")
    port = 20000 + os.getpid() % 20000
    proc = await asyncio.create_subprocess_exec(
        *CDI,
        "import",
        server.link("ok", image.path),
        str(tmp_path / "d.img"),
        "--quiet",
        "--metrics-port",
        str(port),
        "--owner-uid",
        "uid-1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    seen = ""
    async with aiohttp.ClientSession() as session:
        for _ in range(100):
            try:
                async with session.get(f"http://127.0.0.1:{port}/metrics") as resp:
                    seen = await resp.text()
                    break
            except aiohttp.ClientError:
                await asyncio.sleep(0.05)
    await proc.communicate()
    assert proc.returncode == 0
    assert re.search(r'kubevirt_cdi_import_progress_total\{ownerUID="uid-1"\} [0-9.]+', seen)
    assert 'cdi_import_bytes_total{ownerUID="uid-1"}' in seen
    assert 'cdi_import_phase{ownerUID="uid-1",phase="Transferring"}' in seen


async def test_pod_entry_point_reads_cdi_environment(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("qcow2", "gz")
    term = tmp_path / "termination-log"
    (tmp_path / "auth").mkdir()
    env = {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": server.link("header", image.path),
        "IMPORTER_CONTENTTYPE": "kubevirt",
        "IMPORTER_IMAGE_SIZE": "40Mi",
        "IMPORTER_EXTRA_HEADER_0": "X-Token: t0ken",
        "IMPORTER_EXTRA_HEADER_1": "X-Plain: yes",
        "IMPORTER_TERMINATION_PATH": str(term),
        "IMPORTER_METRICS_PORT": "0",
        "IMPORTER_METRICS_ADDR": "127.0.0.1",
        "OWNER_UID": "u",
        "FILESYSTEM_OVERHEAD": "0",
        "IMPORTER_DATA_DIR": str(tmp_path / "data"),
        "IMPORTER_AUTH_DIR": str(tmp_path / "auth"),
        "IMPORTER_ALLOWED_SOURCE_CIDRS": "127.0.0.0/8",  # the server is on loopback
    }
    (tmp_path / "data").mkdir()
    code, _, err = await _run(sys.executable, "-m", "importer", env=env)
    assert code == 0, err
    message = TerminationMessage.from_json(term.read_text())
    assert message.succeeded and message.format_chain == ("gz", "qcow2")
    disk = tmp_path / "data" / "disk.img"
    assert disk.stat().st_size == 40 * MiB
    assert same_content(disk, image.reference, image.reference.stat().st_size)


def _pod_env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The pod's environment for a 40Mi import from ``url`` into ``tmp_path/data``."""
    return {
        "IMPORTER_SOURCE": "http",
        "IMPORTER_ENDPOINT": url,
        "IMPORTER_IMAGE_SIZE": "40Mi",
        "IMPORTER_TERMINATION_PATH": str(tmp_path / "term"),
        "IMPORTER_METRICS_PORT": "0",
        "IMPORTER_METRICS_ADDR": "127.0.0.1",
        "IMPORTER_DATA_DIR": str(tmp_path / "data"),
        "FILESYSTEM_OVERHEAD": "0",
        "IMPORTER_ALLOWED_SOURCE_CIDRS": "127.0.0.0/8",  # the server is on loopback
        **extra,
    }


async def _start_importer(env: dict[str, str]) -> asyncio.subprocess.Process:
    """``python -m importer`` in the background, to be killed mid-import."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "importer",
        env={**os.environ, **env},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )


async def test_killed_importer_resumes_from_its_checkpoint(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """A raw import killed with SIGKILL continues where its last durable (and attested)
    checkpoint was, and the checksum still covers every byte."""
    import hashlib

    image = images.make("raw")
    digest = "sha256:" + hashlib.sha256(image.path.read_bytes()).hexdigest()
    data = tmp_path / "data"
    data.mkdir()
    env = _pod_env(
        server.link("slow", image.path),
        tmp_path,
        IMPORTER_CHECKSUM=digest,
        IMPORTER_CHECKPOINT_INTERVAL=str(4 * MiB),
    )
    checkpoint = data / ".cdi-import-checkpoint"
    proc = await _start_importer(env)
    for _ in range(400):
        if checkpoint.exists() and json.loads(checkpoint.read_text())["offset"] >= 8 * MiB:
            break
        await asyncio.sleep(0.025)
    proc.kill()
    await proc.wait()
    server.recorder.counters["fast"] = 1
    saved = json.loads(checkpoint.read_text())
    offset = saved["offset"]
    assert 0 < offset < image.path.stat().st_size
    # The pod resumes only a prefix attested from outside the volume: the controller passes
    # what it scraped from the killed attempt's cdi_import_checkpoint_bytes (here: the file).
    env["IMPORTER_CHECKPOINT_ATTESTED"] = f"{offset}:{saved['digest']}"
    code, _, err = await _run(sys.executable, "-m", "importer", env=env)
    assert code == 0, err
    message = TerminationMessage.from_json((tmp_path / "term").read_text())
    assert message.succeeded and message.resumed_from >= offset
    assert message.checksum == digest
    assert same_content(data / "disk.img", image.reference, image.path.stat().st_size)
    assert not checkpoint.exists()
    resumed = [r for m, _, r in server.recorder.requests if m == "GET" and r]
    assert any(r.startswith(f"bytes={message.resumed_from}-") for r in resumed)


async def test_killed_qcow2_import_restarts_and_says_so(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    """A streamed qcow2 cannot resume mid-way (decoder state is not persisted): the next
    attempt starts from byte 0, succeeds, and its message says it restarted."""
    image = images.make("qcow2")
    data = tmp_path / "data"
    data.mkdir()
    env = _pod_env(server.link("slow", image.path), tmp_path)
    proc = await _start_importer(env)
    for _ in range(400):  # killed once the body is flowing
        if any(m == "GET" for m, _, _ in server.recorder.requests):
            break
        await asyncio.sleep(0.025)
    await asyncio.sleep(0.2)
    proc.kill()
    await proc.wait()
    assert (data / ".cdi-import-checkpoint").exists()
    server.recorder.counters["fast"] = 1
    code, _, err = await _run(sys.executable, "-m", "importer", env=env)
    assert code == 0, err
    message = TerminationMessage.from_json((tmp_path / "term").read_text())
    assert message.succeeded and message.resumed_from == 0
    assert "restarted from byte 0" in message.message
    assert same_content(data / "disk.img", image.reference, image.reference.stat().st_size)
    assert not (data / ".cdi-import-checkpoint").exists()


async def test_cli_allows_loopback_by_default_and_refuses_it_with_allow_none(
    server: Server, tmp_path: Path
) -> None:
    url = f"{server.url}/ok/nothing.img"
    code, _, err = await _run(*CDI, "import", url, str(tmp_path / "a.img"))
    assert code == 1 and "SourceNotFound" in err  # reached the server
    code, _, err = await _run(
        *CDI, "import", url, str(tmp_path / "b.img"), "--allow-source-cidr", "none"
    )
    assert code == 1 and "SourceForbidden" in err, err
    assert len(server.recorder.requests) == 2  # HEAD and GET of the first import only


async def test_pod_without_a_policy_refuses_a_loopback_source(
    images: ImageFactory, server: Server, tmp_path: Path
) -> None:
    image = images.make("raw")
    env = _pod_env(server.link("ok", image.path), tmp_path)
    del env["IMPORTER_ALLOWED_SOURCE_CIDRS"]
    (tmp_path / "data").mkdir()
    code, _, err = await _run(sys.executable, "-m", "importer", env=env)
    assert code != 0, err
    message = TerminationMessage.from_json((tmp_path / "term").read_text())
    assert message.reason == "SourceForbidden" and not message.transient, message
    assert not server.recorder.requests


async def test_pod_refuses_injected_or_forbidden_headers_with_a_typed_reason(
    server: Server, tmp_path: Path
) -> None:
    for header in ("X-A: b\r\nX-Injected: 1", "Host: metadata.internal"):
        env = _pod_env(f"{server.url}/ok/disk.img", tmp_path, IMPORTER_EXTRA_HEADER_0=header)
        code, _, err = await _run(sys.executable, "-m", "importer", env=env)
        assert code == 1, err
        message = TerminationMessage.from_json((tmp_path / "term").read_text())
        assert message.reason == "InvalidConfig" and "IMPORTER_EXTRA_HEADER_0" in message.message
    assert not server.recorder.requests


# A container's root filesystem as a kubelet makes it with readOnlyRootFilesystem: the process
# sees the whole root read-only and only its volumes writable (here: one folder, bound on itself
# in a private mount namespace before the root is remounted read-only; the host is untouched).
READ_ONLY_ROOT = 'mount --bind "$1" "$1" && mount -o remount,bind,ro / && shift && exec "$@"'


async def test_pod_imports_qcow2_into_a_block_device_on_a_read_only_root(
    images: ImageFactory, server: Server, tmp_path: Path, loopdev: str
) -> None:
    """The importer writes only to its volumes: a qcow2 that streams into the device needs no
    scratch folder, so none is made (a real node's read-only root refused ``mkdir /scratch``;
    where staging is needed the pod mounts a scratch volume, see the importer pod renderer)."""
    image = images.make("qcow2")
    volume = tmp_path / "volume"  # the pod's one writable mount: the termination log, TMPDIR
    volume.mkdir()
    scratch = tmp_path / "scratch"  # no volume mounted here: on the read-only root
    env = _pod_env(
        server.link("ok", image.path),
        volume,
        IMPORTER_BLOCK_PATH=loopdev,
        IMPORTER_SCRATCH_DIR=str(scratch),
        IMPORTER_TERMINATION_PATH=str(volume / "term"),
        TMPDIR=str(volume),
    )
    wrap = ["unshare", "--mount", "--propagation", "private", "sh", "-c", READ_ONLY_ROOT, "sh"]
    code, _, err = await _run(*wrap, str(volume), sys.executable, "-m", "importer", env=env)
    assert code == 0, err
    message = TerminationMessage.from_json((volume / "term").read_text())
    assert message.succeeded and message.format_chain == ("qcow2",)
    assert not scratch.exists()
    size = image.reference.stat().st_size
    assert same_content(Path(loopdev), image.reference, size)
