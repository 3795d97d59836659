"""Kubernetes ``resource.Quantity`` parsing, exact and with the API server's error messages.

Sizes in a DataVolume are Quantities (``10Gi``, ``500M``, ``1e9``, ``000500Mi``). The webhook must
accept and reject exactly what Kubernetes does and say so with the same words, so this follows
``k8s.io/apimachinery/pkg/api/resource`` (``parseQuantityString`` and the suffixer) step by step,
and keeps the value as an exact ``Fraction``: no float rounding can turn ``1Mi - 1`` into ``1Mi``.

``Quantity.value()`` rounds like Go's ``Value()``: up, away from zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Final

SPLIT_RE_STRING: Final = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT_WRONG: Final = f"quantities must match the regular expression '{SPLIT_RE_STRING}'"
ERR_NUMERIC: Final = "unable to parse numeric part of quantity"
ERR_SUFFIX: Final = "unable to parse quantity's suffix"

_BINARY: Final = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL: Final = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_SUFFIX_CHARS: Final = frozenset("eEinumkKMGTP")
_DIGITS: Final = frozenset("0123456789")


class QuantityError(ValueError):
    """A string that Kubernetes would not accept as a Quantity; the message is Kubernetes'."""


@dataclass(frozen=True, eq=False)
class Quantity:
    """An exact quantity plus the text it was written as (kept for round-tripping).

    Equality is by value, as Kubernetes' semantic equality: ``1Gi == 1024Mi``.
    """

    amount: Fraction
    text: str

    @classmethod
    def parse(cls, value: str | int | float) -> Quantity:
        if isinstance(value, bool):
            raise QuantityError(ERR_FORMAT_WRONG)
        if isinstance(value, int):
            return cls(Fraction(value), str(value))
        if isinstance(value, float):
            # JSON numbers arrive as floats; Kubernetes would format them canonically.
            return cls(Fraction(repr(value)), _format_float(value))
        return cls(parse_quantity(value), value)

    @classmethod
    def from_bytes(cls, count: int) -> Quantity:
        return cls(Fraction(count), str(count))

    def value(self) -> int:
        """The integer value, rounded away from zero like Go's ``Quantity.Value()``."""
        if self.amount >= 0:
            return math.ceil(self.amount)
        return -math.ceil(-self.amount)

    def is_zero(self) -> bool:
        return self.amount == 0

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.amount == other.amount

    def __hash__(self) -> int:
        return hash(self.amount)

    def __lt__(self, other: Quantity) -> bool:
        return self.amount < other.amount

    def __le__(self, other: Quantity) -> bool:
        return self.amount <= other.amount


def _format_float(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def parse_quantity(text: str) -> Fraction:
    """Parse a Quantity string to its exact value or raise ``QuantityError``."""
    if not text:
        raise QuantityError(ERR_FORMAT_WRONG)
    positive, num, denom, suffix = _split(text)
    base, exponent = _interpret_suffix(suffix)
    try:
        magnitude = Fraction(int(num or "0")) + (
            Fraction(int(denom), 10 ** len(denom)) if denom else Fraction(0)
        )
    except ValueError as exc:  # pragma: no cover - _split only lets digits through
        raise QuantityError(ERR_NUMERIC) from exc
    scaled = magnitude * Fraction(base) ** exponent
    return scaled if positive else -scaled


def _scan_digits(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in _DIGITS:
        pos += 1
    return pos


def _split(text: str) -> tuple[bool, str, str, str]:
    """Go's ``parseQuantityString``: sign, numerator digits, denominator digits, suffix."""
    pos, positive = 0, True
    if text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    num_end = _scan_digits(text, pos)
    num = text[pos:num_end]
    pos = num_end
    denom = ""
    if pos < len(text) and text[pos] == ".":
        denom_end = _scan_digits(text, pos + 1)
        denom = text[pos + 1 : denom_end]
        pos = denom_end
    if pos == num_end and not num:
        # No digits and no "." before the suffix: the regular expression needs [0-9.]+.
        raise QuantityError(ERR_FORMAT_WRONG)
    suffix_start = pos
    while pos < len(text) and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < len(text) and text[pos] in "+-":
        pos += 1
    pos = _scan_digits(text, pos)
    if pos != len(text):
        raise QuantityError(ERR_FORMAT_WRONG)
    return positive, num, denom, text[suffix_start:]


def _interpret_suffix(suffix: str) -> tuple[int, int]:
    """Return (base, exponent) for a suffix, as Go's suffixer does."""
    if suffix in _BINARY:
        return 2, _BINARY[suffix]
    if suffix in _DECIMAL:
        return 10, _DECIMAL[suffix]
    if len(suffix) > 1 and suffix[0] in "eE":
        try:
            return 10, int(suffix[1:])
        except ValueError:
            pass
    raise QuantityError(ERR_SUFFIX)


def scratch_ceiling(capacity: int) -> int:
    """The largest image file a target of ``capacity`` bytes can need: its virtual size plus
    metadata (an eighth, plus 64 MiB for small disks). Past it, an image is a bomb. Shared by
    the importer (its staging limit) and the renderers (the scratch emptyDir's sizeLimit)."""
    return capacity + capacity // 8 + (64 << 20)


def parse_rate(text: str | None) -> int | None:
    """A rate in bytes per second written as a quantity ("50Mi" is 50 MiB/s): None when unset
    or empty; ``QuantityError`` naming the text when it is not a positive quantity. The
    importer (``IMPORTER_BANDWIDTH_LIMIT``) and the controller (CDIConfig's cap, the
    DataVolume's annotation) read a bandwidth cap with it and add where it came from."""
    if text is None or not str(text).strip():
        return None
    try:
        rate = Quantity.parse(str(text).strip()).value()
    except QuantityError as exc:
        raise QuantityError(
            f"{text!r} is not a quantity of bytes per second (e.g. 50Mi): {exc}"
        ) from exc
    if rate <= 0:
        raise QuantityError(f"{text!r} must be more than 0 bytes per second")
    return rate
