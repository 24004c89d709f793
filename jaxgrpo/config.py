# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Run configuration: frozen dataclasses, one per section, loaded from YAML with dotted overrides.

Sections: ``model``, ``data``, ``rollout``, ``algo`` (what is optimized), ``perf`` (how fast and in how much memory:
switches that do not change what is computed), ``optim``, ``train``, ``mesh``, ``checkpoint``, ``log``,
``warm_start`` (supervised fine-tuning before RL), plus the top-level ``seed``. Every field has a default; a YAML
file or an override only names what it changes.

* ``load_config(path, overrides)``: the defaults, updated by the YAML file at `path` (or a packaged config named
  like ``"default"`` → ``jaxgrpo/configs/default.yaml``), then by overrides ``section.key=value`` / ``seed=3``.
  Values are parsed by YAML rules (``null``, ``true``, ``[1, 2]``, ``{k: 4}``) and then checked against the field's
  annotation (`jaxgrpo.coerce`). Dict fields take a whole mapping or one key: ``algo.estimator_args.k=4``,
  ``data.rewards.format=0.1``; ``data.rewards.format=null`` removes that key.
* Enum-like fields are annotated with the ``Literal`` type of the module that implements them (``algo.estimator``:
  `jaxgrpo.advantages.Estimator`, ``perf.remat``: `jaxgrpo.models.layers.RematPolicy`, ...); `CHOICES` lists them.
* Every mistake is a `ConfigError` whose message names the key and what would be valid: the valid keys (with the
  closest match for a typo), the valid choices of enum-like fields, or the allowed range. A key that moved to
  another section (`MOVED_KEYS`, e.g. ``algo.remat`` → ``perf.remat``) names its new place. The checks of ranges
  and of values that must agree across sections are `jaxgrpo.config_checks.validate`.
* ``to_dict`` / ``to_yaml`` / ``from_dict``: the resolved config, written into the run directory; loading it back
  gives an equal `Config`.
* ``parse_cli(argv)`` and ``cli_error(msg)`` for ``python -m jaxgrpo.train [--config FILE] [--run-dir DIR] [k=v ...]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from jaxgrpo import coerce
from jaxgrpo.cli import build_parser
from jaxgrpo.config_checks import async_hosts_refusal, validate
from jaxgrpo.config_sections import (
    CHOICES,
    SCHEDULES,
    SECTIONS,
    AlgoConfig,
    CheckpointConfig,
    Config,
    DataConfig,
    LogConfig,
    LoraConfig,
    MeshConfig,
    ModelSection,
    OptimConfig,
    PerfConfig,
    RolloutConfig,
    TrainConfig,
)
from jaxgrpo.errors import ConfigError, cli_error

__all__ = ["Config", "ModelSection", "DataConfig", "RolloutConfig", "AlgoConfig", "PerfConfig", "OptimConfig",
           "TrainConfig", "MeshConfig", "CheckpointConfig", "LogConfig", "LoraConfig", "ConfigError", "cli_error",
           "load_config", "from_dict", "to_dict", "to_yaml", "validate", "async_hosts_refusal",
           "parse_cli", "apply_override", "CHOICES", "MOVED_KEYS", "SCHEDULES"]  # fmt: skip

# -- loading and validation ------------------------------------------------------------------------------------------


PACKAGED_CONFIGS = pathlib.Path(__file__).resolve().parent / "configs"
DEFAULT_CONFIG = "default"  # what `python -m jaxgrpo.train` runs without --config
TOP_LEVEL_SCALARS = ("seed",)


# Keys that moved to another section: old dotted key -> (new dotted key, what its values mean, old value -> new).
MOVED_KEYS: dict[str, tuple[str, str, dict[Any, Any]]] = {
    "algo.prefix_sharing": ("perf.prefix_sharing", "", {}),
    "algo.logprob_chunk": ("perf.logprob_chunk", "", {}),
    "algo.remat": ("perf.remat", " with values none|projections|full (true was full, false was projections)",
                   {True: "full", False: "projections"}),
}


# Keys that were retired: dotted key -> (the value that meant "off", why). A saved config (a run directory's
# config.yaml, written before) may hold the off value: it is dropped; any other value is refused.
RETIRED_KEYS: dict[str, tuple[Any, str]] = {
    "perf.reuse_projections": (False, "projection reuse was retired (the rollout engine records no projections; it "
                                      "saved ~3% of a CPU step and applied to one device and one update per rollout)"),
    "algo.reuse_projections": (False, "projection reuse was retired (see perf.reuse_projections)"),
}


def _retired(key: str, value: Any) -> bool:
    """Whether ``key`` is one of `RETIRED_KEYS` at its off value (to be dropped); ConfigError at any other value."""
    if key not in RETIRED_KEYS:
        return False
    off, why = RETIRED_KEYS[key]
    if value != off:
        raise ConfigError(f"{key}={value!r}: {why}; remove the key")
    return True


def drop_retired(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` without the `RETIRED_KEYS` that hold their off value (`_retired`)."""
    return {s: {k: v for k, v in sec.items() if not _retired(f"{s}.{k}", v)} if isinstance(sec, Mapping) else sec
            for s, sec in raw.items()}  # fmt: skip


def _moved(key: str, value: Any) -> ConfigError | None:
    """The error for a key of `MOVED_KEYS` (None for any other key), suggesting the new key with `value`."""
    if key not in MOVED_KEYS:
        return None
    new, meaning, translate = MOVED_KEYS[key]
    if isinstance(value, bool | int | float | str):
        value = translate.get(value, value)
        example = f"{new}={str(value).lower() if isinstance(value, bool) else value}"
    else:
        example = f"{new}=..."
    return ConfigError(f"{key} moved to {new}{meaning}; set {example} instead")


def from_dict(raw: Mapping[str, Any] | None) -> Config:
    """A validated Config from a nested mapping (sections → keys); missing keys keep their defaults."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise ConfigError(f"a config must be a mapping of sections, got {type(raw).__name__}")
    valid = [*SECTIONS, *TOP_LEVEL_SCALARS]
    kwargs: dict[str, Any] = {}
    for k, v in drop_retired(raw).items():
        if k in SECTIONS:
            kwargs[k] = coerce.dataclass_from_mapping(k, SECTIONS[k], v, _moved)
        elif k in TOP_LEVEL_SCALARS:
            kwargs[k] = coerce.coerce(v, typing.get_type_hints(Config)[k], k)
        else:
            raise coerce.unknown_key(str(k), str(k), valid, None)
    cfg = Config(**kwargs)
    validate(cfg)
    return cfg


def to_dict(cfg: Config) -> dict[str, Any]:
    """Plain nested dict of every field (sections, then seed)."""
    return dataclasses.asdict(cfg)


def to_yaml(cfg: Config) -> str:
    """The resolved config as YAML; ``from_dict(yaml.safe_load(to_yaml(cfg))) == cfg``."""
    header = "# jaxgrpo resolved config: every field, after the config file and the command-line overrides\n"
    return header + yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False, allow_unicode=True)


def resolve_config_path(path: str) -> pathlib.Path:
    """A YAML file path, or the name of a packaged config (``"default"`` → ``jaxgrpo/configs/default.yaml``). The
    README's ``configs/<name>.yaml`` is the repository's link to the packaged configs, so where no such file exists
    (a ``pip install``, run from another directory) it names the packaged config too."""
    p = pathlib.Path(path).expanduser()
    if p.is_file():
        return p
    name = p.name if p.parent == pathlib.Path("configs") else path
    packaged = PACKAGED_CONFIGS / (name if name.endswith((".yaml", ".yml")) else f"{name}.yaml")
    if "/" not in name and packaged.is_file():
        return packaged
    names = sorted(x.stem for x in PACKAGED_CONFIGS.glob("*.yaml")) if PACKAGED_CONFIGS.is_dir() else []
    raise ConfigError(f"config file {path!r} not found; give a YAML path or a packaged config: {', '.join(names)}")


def config_name(path: str | None) -> str:
    """Short name of a config for run directories: the file's stem, or ``"default"``."""
    return DEFAULT_CONFIG if path is None else pathlib.Path(path).stem


def _yaml_problem(e: yaml.YAMLError) -> str:
    """A YAML error on one line: where (1-based line and column) and what, e.g. ``line 6, column 1: could not find
    expected ':' (while scanning a simple key started at line 5, column 3)``."""
    mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
    if mark is None or not problem:
        return " ".join(str(e).split())
    context, start = getattr(e, "context", None), getattr(e, "context_mark", None)
    where = f" started at line {start.line + 1}, column {start.column + 1}" if start is not None else ""
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context}{where})" if context else "")


def _read_yaml(path: str) -> dict[str, Any]:
    file = resolve_config_path(path)
    try:
        raw = coerce.yaml_load(file.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        raise ConfigError(f"{file}: invalid YAML: {_yaml_problem(e)}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections (model:, data:, ...)")
    return raw


def _field_type(section: str, key: str) -> Any:
    return typing.get_type_hints(SECTIONS[section])[key]


def apply_override(raw: dict[str, Any], override: str) -> None:
    """Sets ``section.key[.subkey...]=value`` (or ``seed=value``) in the raw nested dict, checking the key."""
    if not isinstance(override, str) or "=" not in override:
        raise ConfigError(f"override {override!r} must look like section.key=value (e.g. algo.estimator=sign)")
    dotted, _, text = override.partition("=")
    parts = dotted.strip().split(".")
    if any(not p for p in parts):
        raise ConfigError(f"override {override!r}: empty key component in {dotted!r}")
    try:
        value = coerce.yaml_load(text) if text.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"override {override!r}: the value is not valid YAML ({_yaml_problem(e)})") from None
    head = parts[0]
    valid_top = [*SECTIONS, *TOP_LEVEL_SCALARS]
    if head in TOP_LEVEL_SCALARS:
        if len(parts) != 1:
            raise ConfigError(f"override {override!r}: {head!r} is a top-level value, write {head}=...")
        raw[head] = value
        return
    if head not in SECTIONS:
        raise coerce.unknown_key(dotted, head, valid_top, None)
    cls = SECTIONS[head]
    valid = [f.name for f in dataclasses.fields(cls)]
    if len(parts) == 1:
        raise ConfigError(f"override {override!r} names a whole section; set one key: {head}.KEY=... "
                          f"with KEY one of: {', '.join(valid)}")
    key = parts[1]
    if _retired(f"{head}.{key}", value):
        return
    if key not in valid:
        raise _moved(f"{head}.{key}", value) or coerce.unknown_key(f"{head}.{key}", key, valid, head)
    tp, _ = coerce.optional_inner(_field_type(head, key))
    choices = coerce.literal_choices(tp)
    textual = tp is str or (choices is not None and all(isinstance(c, str) for c in choices))
    if textual and value is not None and not isinstance(value, str):
        value = text.strip()  # keep the text as written ("1.10" stays "1.10")
    section = raw.get(head)
    if section is None:
        section = raw[head] = {}
    elif not isinstance(section, dict):
        raise ConfigError(f"config section {head!r} must be a mapping, got {section!r}")
    if len(parts) == 2:
        section[key] = value
        return
    if typing.get_origin(tp) is not dict:
        raise ConfigError(f"override {override!r}: {head}.{key} is {coerce.type_name(tp)}, not a mapping with sub-keys")
    if section.get(key) is None:
        section[key] = dict(getattr(cls(), key))  # start from the default mapping
    node = section[key] = dict(section[key]) if isinstance(section[key], Mapping) else section[key]
    if not isinstance(node, dict):
        raise ConfigError(f"{head}.{key} must be a mapping, got {node!r}")
    for p in parts[2:-1]:
        child = node.get(p)
        if child is None:
            child = {}
        elif not isinstance(child, Mapping):
            raise ConfigError(f"override {override!r}: {p!r} is {child!r}, not a mapping with sub-keys")
        node[p] = dict(child)
        node = node[p]
    node[parts[-1]] = value


def load_config(path: str | None, overrides: Sequence[str] = ()) -> Config:
    """Defaults ← the YAML at `path` (None: none) ← `overrides` (``section.key=value``), validated."""
    raw = _read_yaml(path) if path is not None else {}
    raw = {k: (dict(v) if isinstance(v, Mapping) else v) for k, v in raw.items()}
    if isinstance(overrides, str):
        raise ConfigError("overrides must be a list of 'section.key=value' strings, not one string")
    for override in overrides:
        apply_override(raw, override)
    return from_dict(raw)


# -- command line ----------------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    return build_parser()


def parse_cli(argv: Sequence[str]) -> tuple[str, str | None, list[str]]:
    """(config path or packaged name, run dir or None, overrides) from the command line.

    `--help` and unknown options are handled by argparse (usage on stderr, exit status 2); a positional argument
    that is not ``key=value`` is a ConfigError.
    """
    args = _parser().parse_intermixed_args(list(argv))
    for o in args.overrides:
        if "=" not in o:
            raise ConfigError(f"argument {o!r} is not an override; overrides look like section.key=value "
                              "(e.g. train.steps=50); options are --config FILE and --run-dir DIR")
    return (args.config if args.config is not None else DEFAULT_CONFIG), args.run_dir, list(args.overrides)
