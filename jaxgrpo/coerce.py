# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Values read from YAML, checked against a dataclass field's annotation: the typing half of `jaxgrpo.config`.

Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` (the value must be one of its
arguments), ``dict[str, T]``, ``Any``, and ``T | None`` of these. ``int`` accepts ``8.0`` but not ``8.5``; ``float``
accepts ``1e-6`` written without a dot (a string in YAML 1.1, a float in YAML 1.2). Every mistake is a `ConfigError`
naming the key, what it must be, and (for a typo or a bad choice) the closest valid name.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import yaml

from jaxgrpo.errors import ConfigError


class _YamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, plus YAML 1.2 floats without a dot (``1e-6``), which YAML 1.1 would read as text."""


_YamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def yaml_load(text: str) -> Any:
    """`text` parsed as YAML (a SafeLoader subclass: no arbitrary objects)."""
    return yaml.load(text, Loader=_YamlLoader)


def suggest(name: str, valid: Sequence[str], prefix: str = "") -> str:
    """``"did you mean 'x'? "`` for the closest valid name, or ``""``."""
    close = difflib.get_close_matches(name, list(valid), n=1, cutoff=0.6)
    return f"did you mean {prefix + close[0]!r}? " if close else ""


def unknown_key(key: str, name: str, valid: Sequence[str], section: str | None) -> ConfigError:
    """The error for an unknown key `key` (last component `name`) of `section` (None: the top level)."""
    where = f"in section {section!r}" if section else "(sections and top-level keys)"
    suggestion = suggest(name, valid, f"{section}." if section else "")
    return ConfigError(f"unknown key {key!r}; {suggestion}valid keys {where}: {', '.join(valid)}")


def check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    """ConfigError naming `key`, the closest choice and all choices unless `value` is one of `choices`."""
    if not any(type(value) is type(c) and value == c for c in choices):
        close = suggest(value, [str(c) for c in choices]) if isinstance(value, str) else ""
        raise ConfigError(f"{key}={value!r} is not a valid choice; {close}valid choices: "
                          f"{', '.join(str(c) for c in choices)}")


def optional_inner(tp: Any) -> tuple[Any, bool]:
    """(T, True) for ``T | None``, else (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def literal_choices(tp: Any) -> tuple[Any, ...] | None:
    """The arguments of a ``Literal[...]`` annotation (or of ``Literal[...] | None``), else None."""
    inner, _ = optional_inner(tp)
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else None


def type_name(tp: Any) -> str:
    """A short human name of an annotation: ``int``, ``float or null``, ``one of a, b``."""
    inner, optional = optional_inner(tp)
    choices = literal_choices(inner)
    if choices is not None:
        name = f"one of {', '.join(str(c) for c in choices)}"
    elif typing.get_origin(inner) is list:
        name = f"a list, each {type_name(typing.get_args(inner)[0])}"
    else:
        name = getattr(inner, "__name__", str(inner)) if typing.get_origin(inner) is None else str(inner)
    return f"{name} or null" if optional else name


def _number(value: Any, kind: type, key: str, bad: ConfigError) -> int | float:
    if isinstance(value, bool):
        raise bad
    if isinstance(value, str):  # YAML 1.1 reads "1e-6" (no dot) as a string
        try:
            value = float(value) if kind is float or any(c in value.lower() for c in ".e") else int(value)
        except ValueError:
            raise bad from None
    if kind is int:
        if isinstance(value, int):
            return value
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        raise bad
    if isinstance(value, int | float):
        if not math.isfinite(value):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return float(value)
    raise bad


def coerce(value: Any, tp: Any, key: str) -> Any:
    """`value` as the annotated type `tp`, or ConfigError naming `key`."""
    inner, optional = optional_inner(tp)
    if value is None:
        if optional or inner is Any:
            return None
        raise ConfigError(f"{key} may not be null; expected {type_name(tp)}")
    if inner is Any:
        return value
    choices = literal_choices(inner)
    if choices is not None:
        check_choice(key, value, choices)
        return value
    bad = ConfigError(f"{key} must be {type_name(tp)}, got {value!r} ({type(value).__name__})")
    if inner is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if inner is int or inner is float:
        return _number(value, inner, key, bad)
    if inner is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):  # YAML read the text as a number: its
            raise ConfigError(f"{key}: {value!r} was read as a number, which loses the text as written (1.10, 007, "
                              f"1234e56); quote it: {key}: \"...\"")  # (an override keeps its text as written)
        raise bad
    if typing.get_origin(inner) is dict:
        if not isinstance(value, Mapping):
            raise bad
        _, val_tp = typing.get_args(inner)
        out = {}
        for k, v in value.items():
            if v is None and val_tp is not Any:
                _check_spaced(key, str(k))
                continue  # `section.dict.key=null` removes the key
            out[str(k)] = coerce(v, val_tp, f"{key}.{k}")
        return out
    if typing.get_origin(inner) is list:
        if not isinstance(value, list | tuple):
            raise bad
        (item_tp,) = typing.get_args(inner)
        return [coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
    raise ConfigError(f"{key}: unsupported field type {tp!r} (a bug in jaxgrpo.config)")


def _check_spaced(key: str, entry: str) -> None:
    """A mapping entry written ``{name:1.0}`` reads in YAML as the key ``"name:1.0"`` with no value (a flow mapping
    needs a space after the colon): a `ConfigError` saying so, rather than dropping it as ``null``."""
    name, sep, value = entry.rpartition(":")
    try:
        float(value)
    except ValueError:
        return
    if sep and name:
        raise ConfigError(f"{key}: the entry {entry!r} has no value; YAML needs a space after the colon: "
                          f"{key}={{{name}: {value}}}")  # fmt: skip


def dataclass_from_mapping(name: str, cls: type, raw: Any,
                           moved: Callable[[str, Any], ConfigError | None] = lambda key, value: None) -> Any:
    """``cls(**raw)`` with every value coerced to its field's annotation; `name` is the section's name in errors.

    ``moved(f"{name}.{key}", value)`` may return the error for a key that has moved elsewhere (checked before the
    unknown-key error)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config section {name!r} must be a mapping of keys to values, got {raw!r}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for k, v in raw.items():
        if k not in hints:
            raise moved(f"{name}.{k}", v) or unknown_key(f"{name}.{k}", str(k), valid, name)
        kwargs[k] = coerce(v, hints[k], f"{name}.{k}")
    return cls(**kwargs)
