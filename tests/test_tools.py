# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""Tests of jaxgrpo.rollout.tools: per-family call parsing (well-formed and malformed calls), call-format
detection, schemas, and running calls (errors, unknown tools, bad arguments, a hanging tool, garbage returns).

The expected calls are written out by hand from each family's documented format: Qwen2.5/Qwen3 (Hermes)
``<tool_call>{"name", "arguments"}</tool_call>``, SmolLM2-1.7B's model card (a JSON list inside ``<tool_call>``),
Llama 3.1's ``{"name", "parameters"}`` JSON (optionally after ``<|python_tag|>``).
"""

from __future__ import annotations

import threading
import time

import pytest

from jaxgrpo.errors import ConfigError
from jaxgrpo.rollout import tools as T
from jaxgrpo.rollout.tools import MalformedCall, ToolCall


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def no_docs(a: int) -> int:
    return a


# ------------------------------------------------------------------------------------------------ parsing
HERMES_CASES = [
    ("The answer is 4.", []),
    ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>', [ToolCall("add", {"a": 2, "b": 3})]),
    # Qwen3 with a think block, two calls in one turn
    ('<think>need two sums</think>\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 1}}\n</tool_call>\n'
     '<tool_call>\n{"name": "add", "arguments": {"a": 5, "b": 6}}\n</tool_call>',
     [ToolCall("add", {"a": 1, "b": 1}), ToolCall("add", {"a": 5, "b": 6})]),
    # SmolLM2-1.7B model card style: a list inside one block
    ('<tool_call>[{"name": "add", "arguments": {"a": 7, "b": 8}}]</tool_call>', [ToolCall("add", {"a": 7, "b": 8})]),
    # arguments as a JSON string (seen from some fine-tunes)
    ('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 2}"}</tool_call>',
     [ToolCall("add", {"a": 1, "b": 2})]),
    # generation stopped at the closing tag (stop string removed): parsed as closed
    ('<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}', [ToolCall("add", {"a": 3, "b": 4})]),
]


@pytest.mark.parametrize("text,expected", HERMES_CASES)
def test_hermes_parses_wellformed_calls(text, expected):
    assert T.parse_tool_calls(text, "hermes") == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ('<tool_call>{"name": "add", "arguments": {"a": 2, </tool_call>', "invalid JSON"),
        ("<tool_call>add(2, 3)</tool_call>", "invalid JSON"),
        ('<tool_call>{"arguments": {"a": 2}}</tool_call>', "no 'name'"),
        ('<tool_call>{"name": "add", "arguments": [2, 3]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "add", "arguments": "a=2"}</tool_call>', "not valid JSON"),
        ('<tool_call>"add"</tool_call>', "JSON object"),
        ("<tool_call>[]</tool_call>", "empty list"),
        ('<tool_call>{"name": "add", "arguments": {"a": 1, "b"', "invalid JSON"),  # cut off mid-call
    ],
)
def test_hermes_malformed_calls_are_reported_not_raised(text, fragment):
    (call,) = T.parse_tool_calls(text, "hermes")
    assert isinstance(call, MalformedCall)
    assert fragment in call.error


def test_hermes_mixed_good_and_bad_calls_keep_order():
    text = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call><tool_call>{oops}</tool_call>'
    good, bad = T.parse_tool_calls(text, "hermes")
    assert good == ToolCall("add", {"a": 1, "b": 2})
    assert isinstance(bad, MalformedCall) and bad.raw == "{oops}"


LLAMA_CASES = [
    ("The sum is 5.", []),
    ('{"name": "add", "parameters": {"a": 2, "b": 3}}', [ToolCall("add", {"a": 2, "b": 3})]),
    ('<|python_tag|>{"name": "add", "parameters": {"a": 2, "b": 3}}', [ToolCall("add", {"a": 2, "b": 3})]),
    ('{"name": "add", "parameters": {"a": 1, "b": 2}}; {"name": "add", "parameters": {"a": 3, "b": 4}}',
     [ToolCall("add", {"a": 1, "b": 2}), ToolCall("add", {"a": 3, "b": 4})]),
    ('  {"name": "add", "arguments": {"a": 9, "b": 9}}\n', [ToolCall("add", {"a": 9, "b": 9})]),
]


@pytest.mark.parametrize("text,expected", LLAMA_CASES)
def test_llama3_parses_wellformed_calls(text, expected):
    assert T.parse_tool_calls(text, "llama3") == expected


@pytest.mark.parametrize(
    "text,fragment",
    [
        ('{"name": "add", "parameters": {"a": 2,', "invalid JSON"),
        ('{"parameters": {"a": 2}}', "no 'name'"),
        ('{"name": "add", "parameters": 5}', "must be a JSON object"),
        ("{name: add}", "invalid JSON"),
    ],
)
def test_llama3_malformed_calls_are_reported_not_raised(text, fragment):
    calls = T.parse_tool_calls(text, "llama3")
    assert len(calls) == 1 and isinstance(calls[0], MalformedCall)
    assert fragment in calls[0].error


def test_unknown_format_is_a_config_error():
    with pytest.raises(ConfigError, match="hermes"):
        T.parse_tool_calls("x", "mistral")


def test_call_format_detection_from_templates():
    assert T.call_format("{% for tool in tools %}<tools>{{ tool }}</tools>{% endfor %}<tool_call>") == "hermes"
    assert T.call_format('... "parameters": dictionary ... {%- if message.role == "ipython" %}') == "llama3"
    assert T.call_format("{{'<|im_start|>' + message['role']}}") == "hermes"  # SmolLM2: no syntax of its own
    assert T.call_format(None) == "hermes"


# ------------------------------------------------------------------------------------------------ schemas
def test_schema_from_signature_and_docstring():
    s = T.tool_schema(add)
    assert s["function"]["name"] == "add"
    assert s["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first integer."}
    assert s["function"]["parameters"]["required"] == ["a", "b"]


def test_schema_missing_docstring_is_a_clear_error():
    with pytest.raises(ConfigError, match="no_docs.*docstring"):
        T.tool_schema(no_docs)


# ------------------------------------------------------------------------------------------------ running
def test_runner_answers_every_kind_of_failure_and_keeps_order():
    release = threading.Event()

    def hang(x: int) -> int:
        """Never returns in time.

        Args:
            x: anything
        """
        release.wait(5)
        return x

    def boom(x: int) -> int:
        """Raises.

        Args:
            x: anything
        """
        raise ValueError("Game over.")

    class Garbage:
        def __repr__(self):
            return "<garbage>"

        __str__ = __repr__

    def garbage() -> str:
        """Returns a non-text object."""
        return Garbage()  # type: ignore[return-value]

    tools = {"add": add, "hang": hang, "boom": boom, "garbage": garbage}
    runner = T.ToolRunner(workers=2, timeout=0.3)
    calls = [
        [ToolCall("add", {"a": 2, "b": 3}), ToolCall("hang", {"x": 1})],
        [ToolCall("boom", {"x": 1}), ToolCall("nope", {}), MalformedCall("{", "invalid JSON")],
        [ToolCall("add", {"a": 1}), ToolCall("add", {"a": 1, "b": 2, "c": 3}), ToolCall("garbage", {})],
    ]
    t0 = time.monotonic()
    out = runner.run(calls, [tools] * 3)
    assert time.monotonic() - t0 < 3.0
    release.set()
    assert [[r.content for r in row] for row in out][0][0] == "5"
    assert out[0][1].timed_out and out[0][1].error and "timed out" in out[0][1].content
    assert out[1][0].error and out[1][0].content == "Error: boom raised ValueError: Game over."
    assert out[1][1].error and "unknown tool 'nope'" in out[1][1].content and "add, boom" in out[1][1].content
    assert out[1][2].error and "invalid JSON" in out[1][2].content
    assert out[2][0].error and "bad arguments for add" in out[2][0].content and "'b'" in out[2][0].content
    assert out[2][1].error and "bad arguments" in out[2][1].content
    assert not out[2][2].error and out[2][2].content == '"<garbage>"'
    assert out[0][0].message() == {"role": "tool", "name": "add", "content": "5"}
    # the pool is still usable after a timeout
    assert runner.run([[ToolCall("add", {"a": 1, "b": 1})]], [tools])[0][0].content == "2"
    runner.close()


def test_runner_truncates_long_replies_and_rejects_bad_timeout():
    def big() -> str:
        """A long reply."""
        return "x" * 100

    (r,), = T.ToolRunner(workers=0, timeout=None, max_chars=10).run([[ToolCall("big", {})]], [{"big": big}])
    assert r.content.startswith("x" * 10 + "... [truncated 90")
    with pytest.raises(ConfigError, match="tool_timeout"):
        T.ToolRunner(timeout=0)


def test_one_trajectorys_calls_run_in_order_and_never_side_by_side():
    """A stateful tool (an environment's method): each trajectory's three calls see the state the previous call left,
    with four workers free to run them together."""
    lock, active, log = threading.Lock(), {}, []

    def make_step(env: int):
        def step(n: int) -> str:
            """Appends n to this environment's log.

            Args:
                n: the step number
            """
            with lock:
                active[env] = active.get(env, 0) + 1
                overlap = active[env] > 1
            time.sleep(0.05)
            with lock:
                log.append((env, n, overlap))
                active[env] -= 1
            return str(n)

        return step

    runner = T.ToolRunner(workers=4, timeout=5.0)
    calls = [[ToolCall("step", {"n": k}) for k in range(3)] for _ in range(2)]
    out = runner.run(calls, [{"step": make_step(0)}, {"step": make_step(1)}])
    runner.close()
    assert [[r.content for r in row] for row in out] == [["0", "1", "2"]] * 2
    assert not any(overlap for _, _, overlap in log)
    assert [n for env, n, _ in log if env == 0] == [0, 1, 2] and [n for env, n, _ in log if env == 1] == [0, 1, 2]


def test_a_timed_out_call_stops_the_trajectorys_later_calls_of_the_turn():
    release, ran = threading.Event(), []

    def hang() -> str:
        """Never returns in time."""
        release.wait(5)
        return "late"

    def note(x: int) -> str:
        """Records x.

        Args:
            x: anything
        """
        ran.append(x)
        return str(x)

    runner = T.ToolRunner(workers=2, timeout=0.2)
    tools = {"hang": hang, "note": note}
    out = runner.run([[ToolCall("hang", {}), ToolCall("note", {"x": 1})], [ToolCall("note", {"x": 2})]], [tools] * 2)
    release.set()
    runner.close()
    assert out[0][0].timed_out and out[0][1].error and not out[0][1].timed_out
    assert out[0][1].content == "Error: note was not run: the call of hang before it in this turn timed out."
    assert out[1][0].content == "2" and ran == [2]


def test_tools_that_hang_stop_the_run_with_one_line_once_too_many_are_stuck():
    from jaxgrpo.errors import RewardError

    release = threading.Event()

    def hang() -> str:
        """Never returns in time."""
        release.wait(5)
        return "late"

    runner = T.ToolRunner(workers=1, timeout=0.05)
    runner.pool.stuck_limit = 2
    try:
        runner.run([[ToolCall("hang", {})]], [{"hang": hang}])  # one abandoned call: below the limit
        with pytest.raises(RewardError, match=r"^2 calls of tool 'hang' are still running long past "
                                              r"rollout.tool_timeout=0.05s: the tool hangs: fix it") as e:  # fmt: skip
            runner.run([[ToolCall("hang", {})]], [{"hang": hang}])
        assert "\n" not in str(e.value)
    finally:
        release.set()
        runner.close()


def test_error_replies_are_capped_like_replies():
    def boom() -> str:
        """Raises with a long message."""
        raise ValueError("y" * 500)

    (r,), = T.ToolRunner(workers=0, timeout=None, max_chars=40).run([[ToolCall("boom", {})]], [{"boom": boom}])
    assert r.error and r.content.startswith("Error: boom raised ValueError: yyyyyyyy") and len(r.content) < 80
    assert r.content.endswith(f"... [truncated {len('Error: boom raised ValueError: ') + 500 - 40} characters]")


@pytest.mark.parametrize(
    "expression,value",
    [("12*7", "84"), ("(12 + 7) * 3", "57"), ("7 / 2", "3.5"), ("8 / 2", "4"), ("-3 ** 2", "-9"), ("17 // 5", "3"),
     ("17 % 5", "2"), ("2 ** 10", "1024")],
)
def test_calculator_closed_form(expression, value):
    assert T.calculator(expression) == value


@pytest.mark.parametrize("expression", ["__import__('os')", "x + 1", "2 ** 1000", "1 / 0", "'a' * 3", "1 +"])
def test_calculator_rejects_everything_else_as_a_tool_error(expression):
    (r,), = T.ToolRunner(workers=0, timeout=None).run([[ToolCall("calculator", {"expression": expression})]],
                                                      [{"calculator": T.calculator}])  # fmt: skip
    assert r.error and r.content.startswith("Error: calculator raised")
