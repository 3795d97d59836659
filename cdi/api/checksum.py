"""The ``algorithm:hex`` checksum string of ``spec.source.http.checksum``.

Parsed in two places that must agree: the validating webhook (reject a bad string before anything
is created) and the importer (verify the downloaded bytes). Rules and messages follow CDI's
``pkg/util/checksum.ParseAndValidate``: md5, sha1, sha256 or sha512, case-insensitive, surrounding
spaces ignored, hex of exactly the digest length.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from cdi.api.constants import CHECKSUM_ALGORITHMS

_HEX = frozenset(string.hexdigits)


class ChecksumFormatError(ValueError):
    """The checksum string is malformed; the message is CDI's."""


@dataclass(frozen=True)
class Checksum:
    algorithm: str  # lower case: md5 | sha1 | sha256 | sha512
    digest: str  # lower-case hex

    @classmethod
    def parse(cls, text: str) -> Checksum:
        algorithm, sep, digest = text.partition(":")
        if not sep:
            raise ChecksumFormatError(
                f"invalid checksum format: expected 'algorithm:hash', got '{text}'"
            )
        algorithm = algorithm.strip().lower()
        digest = digest.strip().lower()
        if not digest:
            raise ChecksumFormatError("checksum hash value cannot be empty")
        expected = CHECKSUM_ALGORITHMS.get(algorithm)
        if expected is None:
            raise ChecksumFormatError(
                f"unsupported hash algorithm '{algorithm}': supported algorithms are: "
                "md5, sha1, sha256, sha512"
            )
        if len(digest) != expected:
            raise ChecksumFormatError(
                f"invalid {algorithm} hash length: expected {expected} hex characters, "
                f"got {len(digest)}"
            )
        if not set(digest) <= _HEX:
            raise ChecksumFormatError("checksum hash is not valid hexadecimal")
        return cls(algorithm, digest)

    def __str__(self) -> str:
        return f"{self.algorithm}:{self.digest}"
