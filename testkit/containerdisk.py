"""containerDisk images built and pushed with real tools, the way KubeVirt users publish them.

A containerDisk is ``FROM scratch`` + ``ADD --chown=107:107 disk.qcow2 /disk/``. We build the
same thing with umoci (OCI image layout: ``init``, ``new``, ``unpack``, copy the disk in owned by
107:107, ``repack``, ``config``) and push it with skopeo, both from Debian's packages. Upper
layers are made the same way (unpack the image, change ``disk/``, repack: umoci writes
whiteouts for deletions). zstd layers are recompressed by ``skopeo copy --dest-compress-format
zstd`` into a second layout; a multi-arch index is written into the layout as the OCI spec
lays it out and pushed with ``skopeo copy --all``. A registry layer that is an uncompressed
tar cannot be pushed by skopeo (it compresses layers for registries), so ``push_plain`` uploads
one through the distribution API directly.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from testkit.registry import Registry

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
Edit = Callable[[Path], None]  # changes a rootfs: one layer's worth


def _run(*argv: str | Path) -> str:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False)
    if proc.returncode:
        raise AssertionError(f"{' '.join(map(str, argv))} failed: {proc.stderr.strip()}")
    return proc.stdout


def add_disk(*files: tuple[str, Path | bytes]) -> Edit:
    """An edit putting files under ``disk/`` owned by 107:107 (``ADD --chown=107:107``)."""

    def edit(rootfs: Path) -> None:
        folder = rootfs / "disk"
        folder.mkdir(exist_ok=True)
        for name, content in files:
            target = folder / name
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                shutil.copyfile(content, target)
            target.chmod(0o440)
            shutil.chown(target, 107, 107)
        shutil.chown(folder, 107, 107)

    return edit


def remove(*paths: str) -> Edit:
    def edit(rootfs: Path) -> None:
        for path in paths:
            target = rootfs / path
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()

    return edit


@dataclass
class Layout:
    """An OCI image layout directory holding tagged images."""

    path: Path

    @classmethod
    def create(cls, path: Path) -> Layout:
        _run("umoci", "init", "--layout", path)
        return cls(path)

    def build(
        self,
        tag: str,
        layers: Sequence[Edit],
        *,
        env: Sequence[str] = (),
        architecture: str = "amd64",
    ) -> str:
        """Image ``tag``: one layer per edit, bottom first; returns the manifest digest."""
        image = f"{self.path}:{tag}"
        _run("umoci", "new", "--image", image)
        with tempfile.TemporaryDirectory(dir=self.path.parent) as work:
            for i, edit in enumerate(layers):
                bundle = Path(work) / f"bundle{i}"
                _run("umoci", "unpack", "--image", image, bundle)
                edit(bundle / "rootfs")
                _run("umoci", "repack", "--image", image, bundle)
        config = [f"--config.env={e}" for e in env]
        _run(
            "umoci",
            "config",
            "--image",
            image,
            "--os",
            "linux",
            "--architecture",
            architecture,
            *config,
        )
        return self.digest(tag)

    def index(self) -> dict[str, object]:
        return dict(json.loads((self.path / "index.json").read_text()))

    def digest(self, tag: str) -> str:
        for entry in self.index()["manifests"]:  # type: ignore[attr-defined]
            if entry.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
                return str(entry["digest"])
        raise KeyError(tag)

    def blob(self, digest: str) -> bytes:
        return (self.path / "blobs/sha256" / digest.removeprefix("sha256:")).read_bytes()

    def manifest(self, tag: str) -> dict[str, object]:
        return dict(json.loads(self.blob(self.digest(tag))))

    def multi_arch(self, tag: str, platforms: dict[str, str]) -> str:
        """An index ``tag`` over images (architecture -> their tag); returns its digest."""
        entries = []
        for arch, source in platforms.items():
            digest = self.digest(source)
            size = len(self.blob(digest))
            entries.append(
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": digest,
                    "size": size,
                    "platform": {"architecture": arch, "os": "linux"},
                }
            )
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries})
        digest = self._put_blob(body.encode())
        index = self.index()
        index["manifests"].append(  # type: ignore[attr-defined]
            {
                "mediaType": OCI_INDEX,
                "digest": digest,
                "size": len(body),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }
        )
        (self.path / "index.json").write_text(json.dumps(index))
        return digest

    def _put_blob(self, data: bytes) -> str:
        hexd = hashlib.sha256(data).hexdigest()
        (self.path / "blobs/sha256" / hexd).write_bytes(data)
        return f"sha256:{hexd}"


def skopeo_dest_args(registry: Registry, creds: tuple[str, str] | None, certs: Path) -> list[str]:
    args = ["--dest-creds", f"{creds[0]}:{creds[1]}"] if creds else []
    if registry.tls is None:
        return [*args, "--dest-tls-verify=false"]
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(registry.tls.ca_pem, certs / "ca.crt")
    return [*args, "--dest-cert-dir", str(certs)]


def push(
    layout: Layout,
    tag: str,
    registry: Registry,
    repo: str,
    *,
    dest_tag: str | None = None,
    creds: tuple[str, str] | None = None,
    zstd: bool = False,
    all_images: bool = False,
) -> str:
    """``skopeo copy`` an image of the layout to the registry; returns the pushed manifest's
    digest as the registry computed it."""
    source = f"oci:{layout.path}:{tag}"
    if zstd:
        recompressed = layout.path.parent / f"{layout.path.name}-zstd"
        _run(
            "skopeo",
            "copy",
            "-q",
            "--dest-compress",
            "--dest-compress-format",
            "zstd",
            source,
            f"oci:{recompressed}:{tag}",
        )
        source = f"oci:{recompressed}:{tag}"
    dest = f"docker://{registry.host}/{repo}:{dest_tag or tag}"
    extra = ["--all"] if all_images else []
    certs = layout.path.parent / "skopeo-certs"
    digest_file = layout.path.parent / "pushed-digest"
    _run(
        "skopeo",
        "copy",
        "-q",
        *extra,
        "--digestfile",
        digest_file,
        *skopeo_dest_args(registry, creds, certs),
        source,
        dest,
    )
    return digest_file.read_text().strip()


def disk_layer_tar(files: dict[str, bytes]) -> bytes:
    """An uncompressed layer tar holding ``disk/`` and the given files (name -> content)."""
    with tempfile.SpooledTemporaryFile() as buf:
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            folder = tarfile.TarInfo("disk")
            folder.type, folder.mode, folder.uid, folder.gid = tarfile.DIRTYPE, 0o755, 107, 107
            tar.addfile(folder)
            for name, content in files.items():
                info = tarfile.TarInfo(f"disk/{name}")
                info.size, info.mode, info.uid, info.gid = len(content), 0o440, 107, 107
                with tempfile.TemporaryFile() as data:
                    data.write(content)
                    data.seek(0)
                    tar.addfile(info, data)
        buf.seek(0)
        return buf.read()


def push_plain(registry: Registry, repo: str, tag: str, layer: bytes | Path) -> str:
    """Push a one-layer image whose layer is an uncompressed tar (distribution API, monolithic
    uploads; a layer given as a file is streamed); anonymous registries only. Returns the
    manifest digest."""
    if isinstance(layer, Path):
        return _push_plain_file(registry, repo, tag, layer)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
        }
    ).encode()
    _upload(registry, repo, config)
    _upload(registry, repo, layer)
    return _put_manifest(registry, repo, tag, config, _digest(layer), len(layer))


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _upload(registry: Registry, repo: str, data: bytes) -> None:
    conn = registry.connection(timeout=60)
    conn.request("POST", f"/v2/{repo}/blobs/uploads/")
    response = conn.getresponse()
    response.read()
    location = response.getheader("Location") or ""
    assert response.status == 202, response.status
    parts = location.split("://", 1)[-1].split("/", 1)[-1]
    sep = "&" if "?" in parts else "?"
    conn.request(
        "PUT",
        f"/{parts}{sep}digest={_digest(data)}",
        data,
        {"Content-Type": "application/octet-stream"},
    )
    response = conn.getresponse()
    response.read()
    assert response.status == 201, response.status
    conn.close()


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while piece := fh.read(4 * 1024 * 1024):
            digest.update(piece)
    return "sha256:" + digest.hexdigest()


def _push_plain_file(registry: Registry, repo: str, tag: str, layer: Path) -> str:
    """``push_plain`` for a layer tar on disk (benchmarks: gigabytes, never held in memory)."""
    digest, size = _file_digest(layer), layer.stat().st_size
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [digest]},
        }
    ).encode()
    _upload(registry, repo, config)
    conn = registry.connection(timeout=600)
    conn.request("POST", f"/v2/{repo}/blobs/uploads/")
    response = conn.getresponse()
    response.read()
    path = (response.getheader("Location") or "").split("://", 1)[-1].split("/", 1)[-1]
    sep = "&" if "?" in path else "?"
    with open(layer, "rb") as body:
        conn.request(
            "PUT",
            f"/{path}{sep}digest={digest}",
            body,
            {"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        response = conn.getresponse()
        response.read()
    assert response.status == 201, response.status
    conn.close()
    return _put_manifest(registry, repo, tag, config, digest, size)


def _put_manifest(
    registry: Registry, repo: str, tag: str, config: bytes, layer_digest: str, layer_size: int
) -> str:
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": _digest(config),
            "size": len(config),
        },
        "layers": [
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            }
        ],
    }
    body = json.dumps(manifest).encode()
    conn = registry.connection(timeout=60)
    conn.request("PUT", f"/v2/{repo}/manifests/{tag}", body, {"Content-Type": OCI_MANIFEST})
    response = conn.getresponse()
    response.read()
    assert response.status == 201, response.status
    conn.close()
    return _digest(body)
