"""Decode JSON objects into frozen dataclasses (and back) from their type hints alone.

The API types are plain frozen dataclasses; their field names and hints are the schema. One
decoder walks the hints (``str``, ``bool``, ``int``, ``Quantity``, nested API objects,
``tuple[X, ...]``, ``dict[str, X]``, ``X | None``, ``Any``), so adding a CDI field is one line
and every type fails the same way: ``SchemaError`` naming the JSON path, e.g.
``spec.source.http.url: expected string, got integer``.

JSON names are the camelCase of the field name unless ``api_field(json=...)`` says otherwise.
A key present with ``null`` counts as absent (Go's ``omitempty`` pointers). ``encode`` omits
``None``, ``""`` and empty lists/maps (as Go's ``omitempty`` does), but keeps empty objects:
``blank: {}`` means "blank source".
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, Self, TypeVar, Union

from cdi.api.quantity import Quantity, QuantityError

T = TypeVar("T")


class SchemaError(ValueError):
    """An object does not have the shape the API declares. ``path`` is the JSON path."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}" if path else detail)
        self.path = path
        self.detail = detail


def child(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def api_field(*, json: str | None = None, default: Any = None, keep_empty: bool = False) -> Any:
    """A dataclass field with an explicit JSON name (and a default, None unless given).
    ``keep_empty`` writes ``""`` back instead of omitting it (for required strings that may be
    empty, like a first checkpoint's ``previous``)."""
    metadata: dict[str, Any] = {"keep_empty": keep_empty}
    if json:
        metadata["json"] = json
    return dataclasses.field(default=default, metadata=metadata)


def json_name(field: dataclasses.Field[Any]) -> str:
    explicit = field.metadata.get("json")
    if explicit:
        return str(explicit)
    head, *rest = field.name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


class ApiObject:
    """Mixin giving a frozen dataclass ``from_dict`` and ``to_dict``."""

    @classmethod
    def from_dict(cls, data: object, path: str = "") -> Self:
        return decode(cls, data, path)

    def to_dict(self) -> dict[str, Any]:
        return encode(self)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(value: object) -> str:
    names = {
        dict: "object",
        list: "array",
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
    }
    return names.get(type(value), type(value).__name__)


def decode(cls: type[T], data: object, path: str = "") -> T:
    """Build ``cls`` (a dataclass) from a decoded JSON object."""
    if not isinstance(data, Mapping):
        raise SchemaError(path, f"expected object, got {_type_name(data)}")
    hints = _hints(typing.cast(type, cls))
    kwargs: dict[str, Any] = {}
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = json_name(field)
        raw = data.get(key)
        if raw is None:
            if field.default is dataclasses.MISSING and (
                field.default_factory is dataclasses.MISSING
            ):
                raise SchemaError(child(path, key), "Required value")
            continue
        kwargs[field.name] = _decode_value(hints[field.name], raw, child(path, key))
    return cls(**kwargs)


def _optional_inner(hint: Any) -> Any:
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _decode_value(hint: Any, raw: object, path: str) -> Any:
    hint = _optional_inner(hint)
    origin = typing.get_origin(hint)
    if hint is Any:
        return copy.deepcopy(raw)
    if origin is tuple:
        if not isinstance(raw, list):
            raise SchemaError(path, f"expected array, got {_type_name(raw)}")
        item = typing.get_args(hint)[0]
        return tuple(_decode_value(item, v, child(path, i)) for i, v in enumerate(raw))
    if origin is dict:
        if not isinstance(raw, Mapping):
            raise SchemaError(path, f"expected object, got {_type_name(raw)}")
        value_hint = typing.get_args(hint)[1]
        return {str(k): _decode_value(value_hint, v, child(path, str(k))) for k, v in raw.items()}
    if dataclasses.is_dataclass(hint) and hint is not Quantity:
        return decode(typing.cast(type, hint), raw, path)
    return _decode_scalar(hint, raw, path)


def _decode_scalar(hint: Any, raw: object, path: str) -> Any:
    if hint is Quantity:
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            raise SchemaError(path, f"expected quantity, got {_type_name(raw)}")
        try:
            return Quantity.parse(raw)
        except QuantityError as exc:
            raise SchemaError(path, str(exc)) from exc
    if hint is bool:
        if not isinstance(raw, bool):
            raise SchemaError(path, f"expected boolean, got {_type_name(raw)}")
        return raw
    if hint is int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise SchemaError(path, f"expected integer, got {_type_name(raw)}")
        return raw
    if hint is str:
        if not isinstance(raw, str):
            raise SchemaError(path, f"expected string, got {_type_name(raw)}")
        return raw
    raise TypeError(f"{path}: unsupported type hint {hint!r}")  # a bug in cdi.api, not input


def encode(obj: object) -> dict[str, Any]:
    """The JSON object of a dataclass, omitting None, "" and empty lists/maps."""
    out: dict[str, Any] = {}
    for field in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, field.name)
        if value == "" and field.metadata.get("keep_empty"):
            out[json_name(field)] = value
            continue
        if value is None or value == "" or (isinstance(value, tuple | dict) and not value):
            continue
        out[json_name(field)] = _encode_value(value)
    return out


def _encode_value(value: Any) -> Any:
    if isinstance(value, Quantity):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return encode(value)
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return copy.deepcopy(value)
    return value
