"""How a DataImportCron tells that the image behind an HTTP URL changed, without downloading it.

Pure and shared by the webhook (the checksum file's URL is checked at admission) and the poller
(the importer in poll mode, in the cron's worker pod). Two ways, the user's choice
(``spec.httpPoll.checksumFile`` on the cron):

- validators (the default): the response headers of a HEAD, or of a one-byte ranged GET when
  HEAD is refused. ``ETag`` and ``Last-Modified`` name a version of the image; the identity is a
  hash over them and the length. ``Content-Length`` alone is not a validator (a raw disk of a
  fixed size keeps its length across releases), so a server that sends neither is
  ``NoValidator``: the cron says so in its condition and never re-imports on every poll.
- a checksum file beside the image (``SHA256SUMS``, Fedora's ``CHECKSUM``): its entry for the
  image's file name, GNU (``<hex>  name``) or BSD (``SHA256 (name) = <hex>``) style, sha256 or
  sha512. The identity is the image's own checksum, and the import checks it, so the volume
  holds exactly the bytes the poll saw.

The checksum file must be on the image's origin: the same credentials and trust apply, and a
cron cannot be pointed at another host's file through it.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from urllib.parse import unquote, urljoin, urlsplit

from cdi.api.checksum import Checksum
from cdi.api.errors import ChecksumFileInvalid, NoValidator

MAX_CHECKSUM_FILE_BYTES = 1024 * 1024
_GNU = re.compile(r"([0-9a-fA-F]{64}|[0-9a-fA-F]{128}) [ *](.+)")
_BSD = re.compile(r"(SHA256|SHA512) \((.+)\) = ([0-9a-fA-F]{64}|[0-9a-fA-F]{128})")
_ALGORITHM_BY_LENGTH = {64: "sha256", 128: "sha512"}


def _sha256_identity(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Validators:
    """What a server says about the version of a resource."""

    etag: str = ""
    last_modified: str = ""
    content_length: int | None = None

    def identity(self, shown_url: str) -> str:
        """``sha256:<hex>`` over the validators; ``NoValidator`` when there are none."""
        if not self.etag and not self.last_modified:
            raise NoValidator(
                f"{shown_url} gives no ETag or Last-Modified: a new image cannot be told "
                "without downloading it; set spec.httpPoll.checksumFile to poll a checksum "
                "file beside it"
            )
        length = "" if self.content_length is None else str(self.content_length)
        return _sha256_identity(f"etag={self.etag}\nlast-modified={self.last_modified}\n{length}")

    def describe(self) -> str:
        """For the record (a termination message holds 4096 bytes: a long ETag is cut)."""
        parts = [f"ETag {self.etag[:256]}" if self.etag else "", self.last_modified[:64]]
        return ", ".join(p for p in parts if p)


def checksum_identity(checksum: Checksum) -> str:
    """The identity a checksum gives an image: the sha256 itself, else a hash of the sum."""
    if checksum.algorithm == "sha256":
        return f"sha256:{checksum.digest}"
    return _sha256_identity(str(checksum))


def checksum_url(image_url: str, checksum_file: str) -> str:
    """The checksum file's URL, relative to the image's; ``ValueError`` if it leaves the
    image's origin (scheme, host and port) or is not HTTP(S)."""
    if not checksum_file or any(c in checksum_file for c in "\r\n\0 "):
        raise ValueError("checksumFile must be a file name or URL without spaces")
    url = urljoin(image_url, checksum_file)
    a, b = urlsplit(image_url), urlsplit(url)
    if b.scheme not in ("http", "https") or (a.scheme, a.netloc) != (b.scheme, b.netloc):
        raise ValueError("checksumFile must be on the image's origin (same scheme, host, port)")
    return url


def image_file_name(image_url: str) -> str:
    return unquote(urlsplit(image_url).path.rpartition("/")[2])


def find_checksum(data: bytes, name: str, shown_url: str) -> Checksum:
    """The checksum a ``SHA256SUMS``-style file lists for ``name`` (a file name, no folder)."""
    if len(data) > MAX_CHECKSUM_FILE_BYTES:
        raise ChecksumFileInvalid(f"{shown_url} is over {MAX_CHECKSUM_FILE_BYTES} bytes")
    text = data.decode("utf-8", errors="replace")
    found: set[Checksum] = set()
    for raw in text.splitlines():
        line = raw.strip()
        gnu, bsd = _GNU.fullmatch(line), _BSD.fullmatch(line)
        if gnu:
            digest, entry = gnu.group(1), gnu.group(2)
            algorithm = _ALGORITHM_BY_LENGTH[len(digest)]
        elif bsd:
            algorithm, entry, digest = bsd.group(1).lower(), bsd.group(2), bsd.group(3)
            if _ALGORITHM_BY_LENGTH[len(digest)] != algorithm:
                continue
        else:
            continue
        if entry.rpartition("/")[2] == name:
            found.add(Checksum(algorithm, digest.lower()))
    if not found:
        raise ChecksumFileInvalid(f"{shown_url} lists no sha256 or sha512 for {name!r}")
    if len({c.algorithm for c in found}) != len(found):
        raise ChecksumFileInvalid(f"{shown_url} lists {name!r} with different checksums")
    return max(found, key=lambda c: len(c.digest))  # sha512 over sha256 when both are listed
