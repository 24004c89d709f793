# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of jaxgrpo.rollout.env: TRL ``environment_factory`` classes run unchanged, plain tool functions, config
errors.

`MyEnv` and `EchoToolEnv` below are copied verbatim from TRL's documentation, "OpenEnv Integration for Training
LLMs with Environments" (https://huggingface.co/docs/trl/main/openenv; source docs/source/openenv.md of
huggingface/trl), sections "Tips for environment classes" and "Quick start". Their remote clients (``MyClient``,
``EchoEnv``, ``EchoAction``, ``ENV_URL``) are the only things defined here: small local stand-ins for the network
services the documentation connects to.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest

from jaxgrpo.errors import ConfigError
from jaxgrpo.example import Example
from jaxgrpo.rollout import env as E
from jaxgrpo.rollout.tools import ToolCall, ToolRunner


# ----------------------------------------------------------------- local stand-ins for the documented remote clients
class MyClient:
    def __init__(self, base_url):
        self.base_url = base_url


@dataclasses.dataclass
class EchoAction:
    message: str


class EchoEnv:
    def __init__(self, base_url):
        self.base_url = base_url

    def step(self, action):
        obs = types.SimpleNamespace(echoed_message=action.message, reward=len(action.message) * 0.1)
        return types.SimpleNamespace(observation=obs)


# ----------------------------------------------------------------- verbatim from TRL's documentation (see docstring)
ENV_URL = "https://my-env.hf.space"

class MyEnv:
    def __init__(self):
        self.client = MyClient(base_url=ENV_URL)  # captured from enclosing scope
        self.reward = 0.0

    def reset(self, **kwargs) -> str | None:
        self.reward = 0.0
        return "Initial observation for the model"

    def my_tool(self, arg1: str, arg2: int) -> str:
        """
        Description of what this tool does.

        Args:
            arg1: Description of arg1
            arg2: Description of arg2

        Returns:
            The result message.
        """
        self.reward = 1.0
        return "Tool result"


class EchoToolEnv:
    def __init__(self):
        self.env = EchoEnv(base_url=ENV_URL)
        self.reward = 0.0

    def reset(self, **kwargs) -> str | None:
        self.reward = 0.0
        return None

    def echo(self, message: str) -> str:
        """
        Echo the message back from the environment.

        Args:
            message: The message to echo

        Returns:
            The echoed message.
        """
        observation = self.env.step(EchoAction(message=message))
        self.reward = observation.observation.reward
        return observation.observation.echoed_message
# ----------------------------------------------------------------- end of the verbatim copy


class Counter:
    """A stateful environment with get_reward, reset taking named fields only, and a tool that raises."""

    def __init__(self):
        self.total = 0
        self.target = None

    def reset(self, answer: str) -> None:
        self.total, self.target = 0, int(answer)

    def increment(self, by: int) -> int:
        """Add to the counter.

        Args:
            by: How much to add.
        """
        if by < 0:
            raise ValueError("only positive increments")
        self.total += by
        return self.total

    def get_reward(self) -> float:
        return float(self.total == self.target)

    def _hidden(self, x: int) -> int:
        return x


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def test_trl_documented_environment_runs_unchanged():
    box = E.Toolbox(MyEnv)
    (ep,) = box.episodes([{"prompt": "hi", "answer": "1", "extra_column": 3}])
    assert ep.observation == "Initial observation for the model"
    assert list(ep.tools) == ["my_tool"]
    (schema,) = ep.schemas
    assert schema["function"]["name"] == "my_tool"
    arg2 = schema["function"]["parameters"]["properties"]["arg2"]
    assert arg2 == {"type": "integer", "description": "Description of arg2"}
    (r,), = ToolRunner(workers=1).run([[ToolCall("my_tool", {"arg1": "a", "arg2": 2})]], [ep.tools])
    assert r.content == "Tool result" and not r.error
    assert ep.env.reward == 1.0  # the state a TRL reward function reads through `environments`
    assert ep.reward() is None  # no get_reward: the reward functions score the trajectory


def test_trl_quickstart_environment_is_one_instance_per_trajectory():
    box = E.Toolbox(EchoToolEnv)
    eps = box.episodes([{"prompt": "p"}] * 3)
    assert len({id(ep.env) for ep in eps}) == 3 and all(ep.observation is None for ep in eps)
    calls = [[ToolCall("echo", {"message": "Hello World!"})], [], [ToolCall("echo", {"message": "ab"})]]
    out = ToolRunner(workers=2).run(calls, [ep.tools for ep in eps])
    assert out[0][0].content == "Hello World!" and out[1] == [] and out[2][0].content == "ab"
    assert [ep.env.reward for ep in eps] == pytest.approx([1.2, 0.0, 0.2])  # state stays per trajectory


def test_stateful_environment_with_get_reward_and_named_reset_fields():
    box = E.Toolbox(Counter, [multiply])
    ex = Example(prompt="count to five", answer="5", meta={"source": "test"})
    (ep,) = box.episodes([ex])
    assert sorted(ep.tools) == ["increment", "multiply"]  # not reset, get_reward or _hidden
    runner = ToolRunner(workers=0, timeout=None)
    out = runner.run([[ToolCall("increment", {"by": 2}), ToolCall("increment", {"by": -1}),
                       ToolCall("increment", {"by": 3}), ToolCall("multiply", {"a": 6, "b": 7})]], [ep.tools])[0]
    assert [r.content for r in out] == ["2", "Error: increment raised ValueError: only positive increments", "5", "42"]
    assert ep.reward() == 1.0
    (fresh,) = box.episodes([{"answer": "5"}])
    assert fresh.env.total == 0 and fresh.reward() == 0.0


def test_from_config_imports_by_path(monkeypatch):
    mod = types.ModuleType("jaxgrpo_test_envmod")
    mod.Counter, mod.multiply, mod.no_docs = Counter, multiply, lambda x: x
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    assert E.Toolbox.from_config(None, []) is None
    box = E.Toolbox.from_config("jaxgrpo_test_envmod:Counter", ["jaxgrpo_test_envmod:multiply"])
    assert box.environment is Counter and box.functions == [multiply]
    box = E.Toolbox.from_config(None, ["jaxgrpo_test_envmod:multiply"])
    (ep,) = box.episodes([{"prompt": "x"}])
    assert ep.env is None and list(ep.tools) == ["multiply"] and ep.reward() is None
    with pytest.raises(ConfigError, match="data.environment='nomodule_xyz:Env' cannot be imported"):
        E.Toolbox.from_config("nomodule_xyz:Env", [])
    with pytest.raises(ConfigError, match="must be 'package.module:name'"):
        E.Toolbox.from_config("Counter", [])
    with pytest.raises(ConfigError, match="docstring"):
        E.Toolbox.from_config(None, ["jaxgrpo_test_envmod:no_docs"])


def test_reset_must_return_text_or_none():
    class Bad:
        def reset(self, **kwargs):
            return 3

        def t(self, x: int) -> int:
            """T.

            Args:
                x: x
            """
            return x

    with pytest.raises(ConfigError, match="Bad.reset returned int"):
        E.Toolbox(Bad).episodes([{}])


def test_readme_ten_line_environment_runs():
    import pathlib
    import re

    readme = (pathlib.Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("## Environments and tools", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 -- the project's own README example
    (ep,) = E.Toolbox(namespace["Counter"]).episodes([Example(prompt="Count to 5.", answer="5")])
    assert ep.observation == "The counter is at 0."
    out = ToolRunner(workers=0, timeout=None).run([[ToolCall("add", {"n": 2}), ToolCall("add", {"n": 3})]], [ep.tools])
    assert [r.content for r in out[0]] == ["2", "5"] and ep.reward() == 1.0
