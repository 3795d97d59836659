"""Quantity parsing accepts and rejects what Kubernetes does, with exact values."""

from __future__ import annotations

from fractions import Fraction

import pytest

from cdi.api.quantity import ERR_FORMAT_WRONG, ERR_SUFFIX, Quantity, QuantityError


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Ki", 1024),
        ("1Mi", 1 << 20),
        ("10Gi", 10 << 30),
        ("2Ti", 2 << 40),
        ("1Pi", 1 << 50),
        ("1Ei", 1 << 60),
        ("1k", 1000),
        ("500M", 500_000_000),
        ("3G", 3 * 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1E", 10**18),
        ("1e9", 10**9),
        ("1E3", 1000),
        ("5e+2", 500),
        ("000500Mi", 500 << 20),
        ("1.5Gi", 3 << 29),
        (".5Gi", 1 << 29),
        ("1.G", 10**9),
        ("+1Ki", 1024),
        ("1073741824", 1 << 30),
        ("0", 0),
        ("0G", 0),
    ],
)
def test_valid_quantities_parse_to_exact_values(text: str, value: int) -> None:
    assert Quantity.parse(text).amount == value


@pytest.mark.parametrize(
    ("text", "amount", "rounded"),
    [
        ("500m", Fraction(1, 2), 1),
        ("1500m", Fraction(3, 2), 2),
        ("-500m", Fraction(-1, 2), -1),
        ("100n", Fraction(1, 10**7), 1),
        ("1u", Fraction(1, 10**6), 1),
        ("1e-3", Fraction(1, 1000), 1),
    ],
)
def test_fractions_round_away_from_zero_like_go_value(
    text: str, amount: Fraction, rounded: int
) -> None:
    quantity = Quantity.parse(text)
    assert quantity.amount == amount
    assert quantity.value() == rounded


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2Ng", ERR_FORMAT_WRONG),
        ("invalid_size", ERR_FORMAT_WRONG),
        ("", ERR_FORMAT_WRONG),
        ("Mi", ERR_FORMAT_WRONG),
        ("1 Gi", ERR_FORMAT_WRONG),
        ("1Gi ", ERR_FORMAT_WRONG),
        ("1Gb", ERR_FORMAT_WRONG),
        ("12K", ERR_SUFFIX),
        ("5e", ERR_SUFFIX),
        ("1iG", ERR_SUFFIX),
    ],
)
def test_invalid_quantities_fail_with_kubernetes_message(text: str, message: str) -> None:
    with pytest.raises(QuantityError) as err:
        Quantity.parse(text)
    assert str(err.value) == message


def test_quantities_compare_by_value_and_keep_their_text() -> None:
    assert Quantity.parse("1Gi") == Quantity.parse("1024Mi")
    assert Quantity.parse("1G") < Quantity.parse("1Gi")
    assert str(Quantity.parse("000500Mi")) == "000500Mi"
    assert hash(Quantity.parse("1Gi")) == hash(Quantity.parse("1073741824"))


def test_json_numbers_are_quantities() -> None:
    assert Quantity.parse(1073741824).value() == 1 << 30
    assert str(Quantity.parse(2.0)) == "2"
    with pytest.raises(QuantityError):
        Quantity.parse(True)  # type: ignore[arg-type]
