"""The image filesystem's one disk file, streamed out of its layers in one pass, no scratch.

CDI unpacks every layer into scratch space and then looks at ``/disk/``. We read the layers
top-down instead (a blob can be fetched in any order, by digest) and keep an overlay view of
what the layers above have hidden: OCI whiteouts (``.wh.<name>`` deletes a lower entry,
``.wh..wh..opq`` makes a directory opaque), and any entry an upper layer already provides. The
first visible regular file directly under ``disk/`` is the disk: its bytes are yielded as the
tar delivers them. The rest of that layer and every lower one are still read (headers; data is
skipped by reading it) so that a second visible file, or a directory, under ``disk/`` fails the
import with CDI's message, as the unpacked tree would have shown it. Lower layers are not read
once ``disk/`` is opaque or deleted above them: nothing there can be visible.

Memory is bounded as in archive extraction (``datapath.decode.tarbounds``, security review
N11): a pax or GNU long-name header over ``MAX_HEADER_BYTES`` is refused before tarfile reads
it (a 200 MiB pax record is a 0.2 MiB gzip layer), tarfile's list of every member read is
emptied member by member (nothing here looks back), and the paths the overlay keeps over all
layers are bounded in number and bytes (``MAX_LAYER_PATHS``, ``MAX_LAYER_NAME_BYTES``). Past a
bound the import fails with ``UnsafeImage``.

Every blob is checked as it streams: more bytes than its descriptor's size fail at once, and the
hash is compared when the blob ends (each layer is read to its end), before the source reports
its last byte, so a tampered layer fails the import and nothing is marked complete.
"""

from __future__ import annotations

import hashlib
import posixpath
import tarfile
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

from cdi.api.errors import InvalidImage
from datapath.decode.decompress import decompress
from datapath.decode.tarbounds import BoundedTarInfo, TarBudget
from datapath.formats import SNIFF_BYTES, sniff
from datapath.streams import CHUNK_SIZE, IterReader, Peekable
from importer.registry.errors import DigestMismatch, RegistryImageInvalid
from importer.registry.manifest import Descriptor

DISK_DIR = "disk"
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
EMPTY = "image file does not exist in image directory - directory is empty"
SEVERAL = "image directory contains more than one file"
SUBDIR = "image directory contains another directory"
# Entries of all layers together (a containerDisk has a handful; one built on a base image its
# files, ~10,000 for a minimal distribution) and their names, link names and pax records:
# ~240 B per path kept (docs/importer.md, memory table).
MAX_LAYER_PATHS = 50_000
MAX_LAYER_NAME_BYTES = 4 * 1024 * 1024

Opener = Callable[[Descriptor], Generator[bytes, None, None]]  # a blob's bytes, as served


def verified(chunks: Iterator[bytes], blob: Descriptor) -> Iterator[bytes]:
    """``chunks`` unchanged, failing when they are not the blob's size and digest."""
    digest, seen = hashlib.sha256(), 0
    for chunk in chunks:
        seen += len(chunk)
        if seen > blob.size:
            raise DigestMismatch(f"blob {blob.digest} is longer than its {blob.size} bytes")
        digest.update(chunk)
        yield chunk
    got = "sha256:" + digest.hexdigest()
    if seen != blob.size or got != blob.digest:
        raise DigestMismatch(
            f"blob {blob.digest} was served as {seen} bytes hashing to {got}: "
            "the registry's content does not match the image's digest"
        )


@dataclass
class Overlay:
    """What the layers read so far (the upper ones) hide from the layers below."""

    hidden: set[str] = field(default_factory=set)  # deleted, or replaced by a non-directory
    opaque: set[str] = field(default_factory=set)  # directories whose lower content is hidden
    present: set[str] = field(default_factory=set)  # entries upper layers provide
    # every entry read counts, in every layer: what the sets above (and _Layer's) can hold
    budget: TarBudget = field(
        default_factory=lambda: TarBudget(MAX_LAYER_PATHS, MAX_LAYER_NAME_BYTES)
    )

    def visible(self, path: str) -> bool:
        if path in self.present:
            return False
        parts = path.split("/")
        for i in range(1, len(parts) + 1):
            ancestor = "/".join(parts[:i])
            if ancestor in self.hidden or (i < len(parts) and ancestor in self.opaque):
                return False
        return True

    def closed(self, folder: str) -> bool:
        """Nothing under ``folder`` in lower layers can be visible."""
        return not self.visible(folder + "/x") or folder in self.opaque


@dataclass
class _Layer:
    """One layer's effect, applied to the overlay only once the layer is read."""

    hidden: set[str] = field(default_factory=set)
    opaque: set[str] = field(default_factory=set)
    present: set[str] = field(default_factory=set)

    def apply(self, overlay: Overlay) -> None:
        overlay.hidden |= self.hidden
        overlay.opaque |= self.opaque
        overlay.present |= self.present


def disk_bytes(layers: Sequence[Descriptor], open_blob: Opener) -> Generator[bytes, None, None]:
    """The disk file's bytes; ``layers`` bottom first, as the manifest lists them."""
    overlay = Overlay()
    found: list[str] = []
    for blob in reversed(layers):
        if overlay.closed(DISK_DIR):
            break
        served = open_blob(blob)
        try:  # closed here, on this thread, whether the walk ends or fails
            raw = verified(served, blob)
            layer = _Layer()
            yield from _walk(_untar(raw, blob), overlay, layer, found)
            for _ in raw:  # the tar's end padding, then the digest check
                pass
        finally:
            served.close()
        layer.apply(overlay)
    if not found:
        raise RegistryImageInvalid(EMPTY)


def _untar(raw: Iterator[bytes], blob: Descriptor) -> Iterator[bytes]:
    """A layer's tar stream: gzip or zstd (or any one compression we decode) peeled by its
    first bytes, a plain tar as it is."""
    stream = Peekable(raw)
    fmt = sniff(stream.peek(SNIFF_BYTES))
    if fmt.is_compression:
        return decompress(fmt, stream)
    return stream


def _walk(
    tar: Iterator[bytes], overlay: Overlay, layer: _Layer, found: list[str]
) -> Iterator[bytes]:
    try:
        reader = IterReader(tar)
        with tarfile.open(fileobj=reader, mode="r|", tarinfo=BoundedTarInfo) as archive:
            while (member := archive.next()) is not None:
                # tarfile keeps every TarInfo it read (undeclared in typeshed); we never look back
                archive.members.clear()  # type: ignore[attr-defined]
                overlay.budget.count(member)
                path = _normal(member.name)
                if path is None:
                    continue
                if _record_whiteout(path, layer):
                    continue
                layer.present.add(path)
                if not member.isdir():
                    layer.hidden.add(path)
                if overlay.visible(path):
                    yield from _disk_entry(archive, member, path, found)
    except tarfile.TarError as exc:
        raise InvalidImage(f"an image layer is corrupt or truncated: {exc}") from exc


def _disk_entry(
    archive: tarfile.TarFile, member: tarfile.TarInfo, path: str, found: list[str]
) -> Iterator[bytes]:
    """Judge one visible entry; stream it if it is the disk."""
    folder, _, name = path.partition("/")
    if folder != DISK_DIR or not name:
        return
    if "/" in name or member.isdir():
        raise RegistryImageInvalid(SUBDIR)
    if found:
        raise RegistryImageInvalid(f"{SEVERAL}: {found[0]}, {path}")
    if not member.isfile():
        raise RegistryImageInvalid(f"{path} in the image is not a regular file")
    found.append(path)
    fh = archive.extractfile(member)
    assert fh is not None  # a regular file always has a reader
    while piece := fh.read(CHUNK_SIZE):
        yield piece


def _record_whiteout(path: str, layer: _Layer) -> bool:
    folder, base = posixpath.split(path)
    if not base.startswith(WHITEOUT):
        return False
    if base == OPAQUE:
        layer.opaque.add(folder)
    elif not base.startswith(WHITEOUT + WHITEOUT):  # other .wh..wh. names are bookkeeping
        layer.hidden.add(posixpath.join(folder, base[len(WHITEOUT) :]))
    return True


def _normal(name: str) -> str | None:
    """A member name as a path relative to the image root; None for the root or outside it."""
    path = posixpath.normpath("/" + name).lstrip("/")
    return path if path and path != "." else None
