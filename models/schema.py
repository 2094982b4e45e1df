"""Checking what a file holds against a pydantic schema, before it becomes one of parapipe's frozen records.

Plans, cost tables and the board inventory are read from files people edit and tools write. Each is
checked against a schema (a pydantic model) that names the first field that is wrong; what passes is
converted into the frozen dataclasses the rest of parapipe uses. ``record_schema`` makes the schema of
a flat record (strings, numbers, lists of them, nested records) from the dataclass itself, so the two
cannot drift apart; ``load_record`` converts back.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

R = TypeVar("R")

_FRIENDLY = {
    "missing": "missing field",
    "extra_forbidden": "unknown field",
    "model_type": "expected an object (a table) of fields",
    "model_attributes_type": "expected an object (a table) of fields",
}


def field_path(loc: tuple[int | str, ...]) -> str:
    """``("stages", 0, "groups", 1, 0, "pu")`` -> ``stages[0].groups[1][0].pu``; a key a file gave with a line
    break or another unprintable character in it quoted, escaped (the message stays one line)."""
    out = ""
    for part in loc:
        name = str(part) if str(part).isprintable() else repr(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out


def first_problem(exc: ValidationError, prefix: str = "") -> str:
    """One line: the first wrong field, what is wrong with it, and how many more problems there are.

    A field given wrong is named before a field left out: it is what the writer of the file got wrong."""
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] == "missing")
    e = errors[0]
    kind, ctx = e["type"], e.get("ctx", {})
    if kind == "value_error":  # a validator's own message, without pydantic's "Value error, "
        msg = str(ctx.get("error", e["msg"]))
    elif kind == "too_short" and ctx.get("min_length") == 1:
        msg = "must not be empty"
    else:
        msg = _FRIENDLY.get(kind, e["msg"])
        if kind not in _FRIENDLY and "input" in e and not isinstance(e["input"], dict | list):
            msg += f", got {e['input']!r}"
    where = field_path((*([prefix] if prefix else []), *e["loc"]))
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{where}: {msg}{more}" if where else f"{msg}{more}"


def _file_type(hint: Any) -> Any:
    """The type a record's field has in a file: tuples are JSON/TOML lists, nested records their schemas."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return record_schema(hint)  # type: ignore[arg-type]
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return list[_file_type(args[0])]  # type: ignore[misc]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_file_type(a) for a in args)]  # noqa: UP007
    return hint


_SCHEMAS: dict[tuple[type, frozenset[str], str], type[BaseModel]] = {}


def record_schema(
    cls: type, exclude: frozenset[str] = frozenset(), extra: Literal["forbid", "ignore"] = "forbid"
) -> type[BaseModel]:
    """The strict schema of the frozen dataclass ``cls`` as a file holds it (its fields but ``exclude``)."""
    key = (cls, exclude, extra)
    if key not in _SCHEMAS:
        hints = _hints(cls)
        fields: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in exclude:
                continue
            if f.default is not dataclasses.MISSING:
                default: Any = f.default
            elif f.default_factory is not dataclasses.MISSING:
                default = f.default_factory()
            else:
                default = ...
            fields[f.name] = (_file_type(hints[f.name]), default)
        config = ConfigDict(extra=extra, strict=True, frozen=True)
        _SCHEMAS[key] = create_model(f"{cls.__name__}File", __config__=config, **fields)
    return _SCHEMAS[key]


def _record_value(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(value, BaseModel):
        target = next((a for a in (hint, *args) if dataclasses.is_dataclass(a)), None)
        return load_record(target, value) if target is not None else value  # type: ignore[arg-type]
    if origin is tuple and isinstance(value, list):
        return tuple(_record_value(args[0], v) for v in value)
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s field types, resolved once: resolving string annotations compiles each of them, and a cost
    table loads thousands of records."""
    return typing.get_type_hints(cls)


def load_record(cls: type[R], checked: BaseModel, **more: Any) -> R:
    """The ``cls`` record of what ``record_schema(cls)`` checked (plus fields given in ``more``)."""
    hints = _hints(cls)
    values = {name: _record_value(hints[name], getattr(checked, name)) for name in type(checked).model_fields}
    return cls(**values, **more)
