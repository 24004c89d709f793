# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tool calls in the model family's own format: their JSON schemas, parsing them from generated text, running them.

Schemas: ``transformers.utils.get_json_schema`` of each tool (a function or a bound method with type hints and a
Google-style docstring with ``Args:``), the format ``apply_chat_template(..., tools=...)`` takes.

Call formats parsed from a policy turn's text (`parse_tool_calls`):

* ``"hermes"`` (Qwen2.5, Qwen3, and what jaxgrpo asks of SmolLM2, whose template has no tool syntax of its own):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them; the JSON may also be a list of
  such objects (SmolLM2-1.7B's model card format) and ``arguments`` a JSON string of an object. A block left
  open at the end of the turn (generation cut off, or stopped at ``</tool_call>``) is parsed as if closed.
* ``"llama3"`` (Llama 3.1/3.2 JSON tool calling, the HF template's instruction ``{"name": function name,
  "parameters": dictionary of argument name and its value}``): the turn, after an optional ``<|python_tag|>``, is
  one or more such objects separated by ``;`` or white space. A turn that does not start with ``{`` is an answer.

A call that cannot be parsed or run is never an exception: it becomes a `MalformedCall`, and `ToolRunner` answers
it (and unknown tools, bad arguments, a tool that raises, times out, or returns something that is not text) with an
error message the model sees as the tool's reply. Tools run in `jaxgrpo.reward_pool.RewardPool` worker threads
with a per-call timeout (``rollout.tool_timeout``), one trajectory's calls in the order written (`ToolRunner.run`).

`calculator` is a built-in tool (``data.tools: [jaxgrpo.rollout.tools:calculator]``): arithmetic on numbers, parsed
with `ast` (no ``eval``); errors are the model's replies like any tool's.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import operator
import re
from collections.abc import Callable, Sequence
from typing import Any, Literal

from transformers.utils import get_json_schema

from jaxgrpo.errors import ConfigError, RewardError
from jaxgrpo.reward_pool import RewardPool

CallFormat = Literal["hermes", "llama3"]
CALL_FORMATS: tuple[str, ...] = ("hermes", "llama3")
Tool = Callable[..., Any]

_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
_PYTHON_TAG = "<|python_tag|>"


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A parsed call: the tool's name and its keyword arguments."""

    name: str
    arguments: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MalformedCall:
    """Text that tried to be a call and is not one; ``error`` is what the model is told."""

    raw: str
    error: str


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One call's reply: the tool message's text, and whether it is an error (``timed_out`` among them)."""

    name: str
    content: str
    error: bool = False
    timed_out: bool = False

    def message(self) -> dict[str, str]:
        """The chat message answering the call."""
        return {"role": "tool", "name": self.name, "content": self.content}


def tool_schema(fn: Tool) -> dict[str, Any]:
    """The JSON schema of a tool (``get_json_schema``), or a `ConfigError` saying what the tool lacks."""
    try:
        return get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 -- transformers raises several types; the message is what matters
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"tool {name} has no usable JSON schema ({e}); give it type hints and a Google-style docstring with an "
            "'Args:' line for every parameter"
        ) from e


def call_format(chat_template: str | None) -> CallFormat:
    """The call format a chat template teaches: ``llama3`` for Llama 3.1's JSON calls, else ``hermes``."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return "hermes"
    if _PYTHON_TAG in t or ('"parameters"' in t and "ipython" in t):
        return "llama3"
    return "hermes"


def as_call(obj: Any, raw: str, args_key: tuple[str, ...]) -> ToolCall | MalformedCall:
    """One call read from its JSON object: a non-empty ``name`` and arguments under the first key of ``args_key``
    present (a JSON object, a JSON string of one, or null / absent for none); else a `MalformedCall` of ``raw``."""
    if not isinstance(obj, dict):
        return MalformedCall(raw, f"a tool call must be a JSON object with 'name' and '{args_key[0]}'")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return MalformedCall(raw, "the tool call has no 'name' string")
    args: Any = {}
    for key in args_key:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models write the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return MalformedCall(raw, f"the '{args_key[0]}' of {name} are not valid JSON")
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return MalformedCall(raw, f"the '{args_key[0]}' of {name} must be a JSON object")
    return ToolCall(name, args)


def _parse_hermes(text: str) -> list[ToolCall | MalformedCall]:
    out: list[ToolCall | MalformedCall] = []
    for m in _HERMES_BLOCK.finditer(text):
        raw = m.group(1).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            out.append(MalformedCall(raw, f"invalid JSON in <tool_call>: {e.msg} at character {e.pos}"))
            continue
        objs = obj if isinstance(obj, list) else [obj]
        if not objs:
            out.append(MalformedCall(raw, "empty list of tool calls"))
        out.extend(as_call(o, raw, ("arguments", "parameters")) for o in objs)
    return out


def _parse_llama3(text: str) -> list[ToolCall | MalformedCall]:
    s = text.strip()
    if s.startswith(_PYTHON_TAG):
        s = s[len(_PYTHON_TAG) :].strip()
    if not s.startswith("{"):
        return []
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(s):
        try:
            obj, end = decoder.raw_decode(s, i)
        except json.JSONDecodeError as e:
            out.append(MalformedCall(s[i:], f"invalid JSON tool call: {e.msg} at character {e.pos - i}"))
            break
        out.append(as_call(obj, s[i:end], ("parameters", "arguments")))
        i = end
        while i < len(s) and (s[i].isspace() or s[i] == ";"):
            i += 1
    return out


def parse_tool_calls(text: str, fmt: CallFormat) -> list[ToolCall | MalformedCall]:
    """The calls in one policy turn's text (empty: the turn is an answer). Never raises on model output."""
    if fmt == "hermes":
        return _parse_hermes(text)
    if fmt == "llama3":
        return _parse_llama3(text)
    raise ConfigError(f"unknown tool call format {fmt!r}; choose one of {CALL_FORMATS}")


def format_calls(calls: Sequence[ToolCall], fmt: CallFormat, content: str | None = None) -> str:
    """The text of an assistant turn that makes ``calls`` after ``content``, written as the family's template writes
    a message's ``tool_calls`` (what `parse_tool_calls` reads back): hermes, as Qwen2.5's template, the content and
    then one ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>`` block per call, joined by newlines;
    llama3 the calls' ``{"name": ..., "parameters": ...}`` objects joined by ``"; "`` (the format has no room for
    text beside calls: content with calls is a `ConfigError`)."""
    if fmt == "hermes":
        blocks = [f"<tool_call>\n{json.dumps({'name': c.name, 'arguments': c.arguments}, ensure_ascii=False)}\n"
                  "</tool_call>" for c in calls]  # fmt: skip
        return "\n".join([content, *blocks] if content else blocks)
    if fmt == "llama3":
        if content and calls:
            raise ConfigError("a llama3-format assistant turn is either tool calls or text, not both; put the text "
                              "in a turn of its own")  # fmt: skip
        objs = [json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls]
        return "; ".join(objs) if calls else (content or "")
    raise ConfigError(f"unknown tool call format {fmt!r}; choose one of {CALL_FORMATS}")


def _render(value: Any, max_chars: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    if len(text) > max_chars:
        text = text[:max_chars] + f"... [truncated {len(text) - max_chars} characters]"
    return text


def _invoke(fn: Tool, call: ToolCall) -> Any:
    try:
        inspect.signature(fn).bind(**call.arguments)
    except TypeError as e:
        raise _BadArguments(str(e)) from None
    except ValueError:  # no signature (a builtin): let the call itself check
        pass
    return fn(**call.arguments)


class _BadArguments(Exception):
    pass


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}  # fmt: skip


def _arith(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _arith(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        a, b = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
            raise ValueError("exponent or base too large")
        return _OPS[type(node.op)](a, b)
    raise ValueError("only numbers, + - * / // % ** and parentheses are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: The expression, with numbers, + - * / // % ** and parentheses, e.g. (12 + 7) * 3.
    """
    if len(expression) > 200:
        raise ValueError("expression longer than 200 characters")
    value = _arith(ast.parse(expression.strip(), mode="eval").body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


class ToolRunner:
    """Runs the calls of many trajectories at once in worker threads, each cut off after ``timeout`` seconds.

    ``workers = 0`` runs them in the calling thread (no timeout possible). ``max_chars`` caps each reply's length,
    error replies included. A call past its timeout is abandoned where it is (a thread cannot be killed); once
    ``stuck_limit`` abandoned calls are still running (`jaxgrpo.reward_pool.RewardPool`), `run` stops the run with a
    one-line `RewardError` naming the tools that hang.
    """

    def __init__(self, workers: int = 4, timeout: float | None = 10.0, max_chars: int = 2000):
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"rollout.tool_timeout must be > 0 seconds or null, got {timeout}")
        self.pool = RewardPool(workers, timeout if workers else None)
        self.timeout, self.max_chars = timeout, max_chars

    def run(
        self,
        calls: Sequence[Sequence[ToolCall | MalformedCall]],
        tools: Sequence[dict[str, Tool]],
    ) -> list[list[ToolResult]]:
        """``calls[i]`` of trajectory i against its own tools ``tools[i]`` (name -> callable); replies in order.

        One trajectory's calls run one after another, in the order written (its tools may share an environment's
        state); different trajectories' run side by side: the k-th calls of every trajectory together, then the
        (k+1)-th. After a call of trajectory i timed out, its later calls of the turn are not run (the abandoned
        call may still be changing its environment); each answers so."""
        out: list[list[ToolResult | None]] = [[None] * len(c) for c in calls]
        stalled: dict[int, str] = {}  # trajectory -> the tool whose call timed out
        error = lambda name, text: ToolResult(name, _render(text, self.max_chars), True)  # noqa: E731
        for k in range(max((len(c) for c in calls), default=0)):
            jobs, where = [], []
            for i, (cs, ts) in enumerate(zip(calls, tools, strict=True)):
                if k >= len(cs):
                    continue
                c = cs[k]
                if isinstance(c, MalformedCall):
                    out[i][k] = error("error", f"Error: {c.error}. Write the call as the tool format asks.")
                elif i in stalled:
                    out[i][k] = error(c.name, f"Error: {c.name} was not run: the call of {stalled[i]} before it in "
                                      "this turn timed out.")  # fmt: skip
                elif c.name not in ts:
                    names = ", ".join(sorted(ts)) or "none"
                    out[i][k] = error(c.name, f"Error: unknown tool {c.name!r}; the tools are: {names}.")
                else:
                    jobs.append(lambda fn=ts[c.name], c=c: _render(_invoke(fn, c), self.max_chars))
                    where.append((i, c.name))
            results = self.pool.run(jobs, labels=[name for _, name in where]) if jobs else []
            for (i, name), r in zip(where, results, strict=True):
                if r.timed_out:
                    stalled[i] = name
                    out[i][k] = ToolResult(name, f"Error: {name} timed out after {self.timeout} s.", True, True)
                elif isinstance(r.error, _BadArguments):
                    out[i][k] = error(name, f"Error: bad arguments for {name}: {r.error}.")
                elif r.error is not None:
                    out[i][k] = error(name, f"Error: {name} raised {type(r.error).__name__}: {r.error}")
                else:
                    out[i][k] = ToolResult(name, r.value)
            stuck = self.pool.stuck
            if sum(stuck.values()) >= self.pool.stuck_limit:
                raise RewardError(f"{sum(stuck.values())} calls of tool {', '.join(map(repr, stuck))} are still "
                                  f"running long past rollout.tool_timeout={self.timeout:g}s: the tool hangs",
                                  "fix it so that every call returns")  # fmt: skip
        return out  # type: ignore[return-value]

    def close(self) -> None:
        self.pool.close()
