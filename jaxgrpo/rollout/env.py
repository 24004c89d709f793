# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Environments and tools the way the field writes them, for multi-turn rollouts.

An environment is a TRL ``environment_factory``-style class (TRL docs, "OpenEnv Integration", section "How
environment_factory works", https://huggingface.co/docs/trl/main/openenv), accepted unchanged:

* ``__init__(self)`` takes no arguments; one instance per trajectory (`Episode`).
* ``reset(self, **kwargs)`` is called at the start of the trajectory with the example's fields as keyword arguments
  (only those it names, unless it takes ``**kwargs``) and returns ``None`` or a first observation (text appended to
  the user's prompt, in the same user message, as TRL does).
* every other public method (name not starting with ``_``, except ``reset`` and ``get_reward``) is a tool: its
  schema comes from its type hints and docstring (`jaxgrpo.rollout.tools.tool_schema`); an exception it raises is
  the model's tool reply.
* an optional ``get_reward(self) -> float`` scores the finished trajectory (`Episode.reward`).

Plain tool functions (``data.tools: [module:function, ...]``) are stateless tools shared by every trajectory; with
an environment they are added to its methods.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from jaxgrpo.errors import ConfigError
from jaxgrpo.rollout.tools import Tool, tool_schema

_NOT_TOOLS = frozenset({"reset", "get_reward"})


def load_object(spec: str, key: str) -> Any:
    """The object a ``"package.module:name"`` string names; ``key`` is the config key quoted in errors."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ConfigError(f"{key}={spec!r} must be 'package.module:name'")
    module_name, attr = spec.split(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"{key}={spec!r} cannot be imported ({e}); check the module is on PYTHONPATH") from e


def load_tools(specs: Sequence[str]) -> list[Tool]:
    """The functions of ``data.tools``; each must have a JSON schema (checked here, before any rollout)."""
    fns = []
    for spec in specs:
        fn = load_object(spec, "data.tools")
        if not callable(fn):
            raise ConfigError(f"data.tools entry {spec!r} is not callable")
        tool_schema(fn)
        fns.append(fn)
    return fns


def load_environment(spec: str) -> type:
    """The class of ``data.environment``, checked to be instantiable without arguments and to have ``reset``."""
    cls = load_object(spec, "data.environment")
    if not callable(cls):
        raise ConfigError(f"data.environment={spec!r} is not a class or factory")
    if inspect.isclass(cls) and not callable(getattr(cls, "reset", None)):
        raise ConfigError(f"data.environment={spec!r} has no reset(self, **kwargs) method")
    return cls


def environment_tools(env: Any) -> dict[str, Tool]:
    """The public methods of an environment instance that are tools (TRL's rule), by name."""
    tools = {}
    for name in dir(type(env)):
        if name.startswith("_") or name in _NOT_TOOLS:
            continue
        attr = getattr(env, name)
        if inspect.ismethod(attr):
            tools[name] = attr
    return tools


def example_fields(example: Any) -> dict[str, Any]:
    """The keyword arguments ``reset`` receives: a mapping's items, or an `jaxgrpo.example.Example`'s prompt,
    answer and meta fields (the dataset's columns)."""
    if isinstance(example, Mapping):
        return dict(example)
    if dataclasses.is_dataclass(example):
        fields = {f.name: getattr(example, f.name) for f in dataclasses.fields(example) if f.name != "meta"}
        return {**dict(getattr(example, "meta", {}) or {}), **fields}
    raise TypeError(f"an example is a mapping or a dataclass, got {type(example).__name__}")


def _call_reset(env: Any, example: Mapping[str, Any]) -> str | None:
    params = inspect.signature(env.reset).parameters.values()
    if not any(p.kind == p.VAR_KEYWORD for p in params):
        names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        example = {k: v for k, v in example.items() if k in names}
    obs = env.reset(**example)
    if obs is not None and not isinstance(obs, str):
        raise ConfigError(f"{type(env).__name__}.reset returned {type(obs).__name__}; return a string or None")
    return obs


@dataclasses.dataclass
class Episode:
    """One trajectory's tools: the environment instance (or None) and the tools by name, with their schemas."""

    env: Any
    tools: dict[str, Tool]
    schemas: list[dict[str, Any]]
    observation: str | None = None  # what reset returned

    def reward(self) -> float | None:
        """``env.get_reward()`` when the environment has one, else None (the reward functions score the text)."""
        fn = getattr(self.env, "get_reward", None)
        return None if fn is None else float(fn())


class Toolbox:
    """What ``data.environment`` and ``data.tools`` give a rollout: `episodes` builds one `Episode` per trajectory.

    Schemas are computed once (from the first environment instance) and must not change between instances.
    """

    def __init__(self, environment: type | None = None, tools: Sequence[Tool] = ()):
        if environment is None and not tools:
            raise ConfigError("multi-turn rollouts need data.environment or data.tools")
        self.environment, self.functions = environment, list(tools)
        self._fn_tools = {fn.__name__: fn for fn in self.functions}
        self._schemas: list[dict[str, Any]] | None = None

    @classmethod
    def from_config(cls, environment: str | None, tools: Sequence[str]) -> Toolbox | None:
        """From the config keys; None when neither is set (single-turn rollouts)."""
        if environment is None and not tools:
            return None
        return cls(load_environment(environment) if environment else None, load_tools(tools))

    def _tools_of(self, env: Any) -> dict[str, Tool]:
        tools = dict(self._fn_tools)
        if env is not None:
            methods = environment_tools(env)
            clash = sorted(set(methods) & set(tools))
            if clash:
                raise ConfigError(f"data.tools {clash} have the names of methods of the environment; rename them")
            tools.update(methods)
        if not tools:
            raise ConfigError(f"{type(env).__name__} has no public tool methods and data.tools is empty")
        return tools

    def episodes(self, examples: Sequence[Any]) -> list[Episode]:
        """One fresh `Episode` per example (a new environment instance, reset with the example's fields)."""
        out = []
        for example in examples:
            env = self.environment() if self.environment is not None else None
            tools = self._tools_of(env)
            if self._schemas is None:
                self._schemas = [tool_schema(fn) for fn in tools.values()]
            obs = _call_reset(env, example_fields(example)) if env is not None else None
            out.append(Episode(env, tools, self._schemas, obs))
        return out
