# Copyright 2026 The jaxgrpo Authors. Licensed under the Apache License, Version 2.0.
"""No import cycles among the package's modules.

Every module of ``jaxgrpo`` is parsed with `ast` and ALL its imports of package modules are collected: module-level,
inside functions, and under ``if TYPE_CHECKING:`` (a lazy import is how a cycle hides, and a type-only one still ties
the two modules together). ``import jaxgrpo.models`` / ``from jaxgrpo import models`` import the package's
``models/__init__.py``; ``from jaxgrpo import x`` imports ``jaxgrpo.x`` when that is a module, else the package.
The implicit import of a parent package (``jaxgrpo.models.layers`` runs ``jaxgrpo/models/__init__.py`` first) is not
an edge: Python runs the parent before the child, so it cannot deadlock, and counting it would make every package
whose ``__init__`` re-exports its submodules a cycle. Nothing is excluded.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]

Graph = dict[str, dict[str, int]]  # module -> {imported module: line of its first import}


def _module_names(root: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted name -> file of every module of `package` (a directory under `root`); a package is its __init__.py."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def import_graph(root: pathlib.Path, package: str) -> Graph:
    """Every import of a module of `package` by a module of `package` (see the module docstring)."""
    modules = _module_names(root, package)
    graph: Graph = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's own package, up level - 1 more
                    here = name.split(".") if is_package else name.split(".")[:-1]
                    here = here[: len(here) - (node.level - 1)]
                    base = ".".join(here + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules and "." in target:  # `import a.b.func`-like: the module part
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle of the graph as a path ``[a, b, ..., a]``, or None when it is acyclic."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def describe(cycle: list[str], graph: Graph) -> str:
    """``a -> b (line 12) -> a (line 3)``: each step with the line of the importing module that makes it."""
    steps = [cycle[0]] + [f"{b} (line {graph[a][b]} of {a})" for a, b in zip(cycle, cycle[1:])]
    return " -> ".join(steps)


def test_the_package_has_no_import_cycle():
    graph = import_graph(REPO, "jaxgrpo")
    assert len(graph) > 20 and "jaxgrpo.models" in graph and "jaxgrpo.models.layers" in graph
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle: {describe(cycle, graph)}"


def test_the_graph_sees_every_kind_of_import():
    """Edges the package is known to have: lazy (function-level) ones included; and the ones the layering forbids."""
    graph = import_graph(REPO, "jaxgrpo")
    assert "jaxgrpo.eval" in graph["jaxgrpo.in_training"] and "jaxgrpo.build" in graph["jaxgrpo.eval"]
    assert "jaxgrpo.trainer" not in graph["jaxgrpo.eval"]  # eval builds its policy through jaxgrpo.build
    assert "jaxgrpo.models" in graph["jaxgrpo.build"]  # `from jaxgrpo import models`: the package's __init__
    assert "jaxgrpo.models.layers" in graph["jaxgrpo.config_sections"]  # the perf section's Literal types
    assert "jaxgrpo.trainer" in graph["jaxgrpo.train"]  # imported inside main()
    for low in ("jaxgrpo.errors", "jaxgrpo.example"):
        assert not graph[low], f"{low} imports {sorted(graph[low])}; it must import nothing of the package"
    assert "jaxgrpo.data" not in graph["jaxgrpo.config"] and "jaxgrpo.data" not in graph["jaxgrpo.rewards"]


FAKE = {
    "__init__.py": "from fake import a\n",
    "a.py": "def f():\n    from fake import b  # lazy\n    return b\n",
    "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fake.a import f\n",
    "c.py": "import fake.sub\n",
    "sub/__init__.py": "from .. import c\n",
    "ok.py": "import fake.sub.leaf\nfrom fake.sub import leaf\n",
    "sub/leaf.py": "import os\n",
}


@pytest.mark.parametrize(
    "change, expected",
    [
        ({}, ["fake.a", "fake.b", "fake.a"]),  # a function-level import and a TYPE_CHECKING one
        ({"b.py": "import os\n"}, ["fake.c", "fake.sub", "fake.c"]),  # `import fake.sub` is its __init__, and back
        ({"b.py": "import os\n", "sub/__init__.py": "from . import leaf\n"}, None),
    ],
)
def test_the_detector_finds_cycles_in_a_fake_package(tmp_path, change, expected):
    for rel, text in {**FAKE, **change}.items():
        (tmp_path / "fake" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fake" / rel).write_text(text)
    graph = import_graph(tmp_path, "fake")
    assert graph["fake.ok"] == {"fake.sub.leaf": 1}
    assert graph["fake"] == {"fake.a": 1} and graph["fake.a"] == {"fake.b": 2}  # no implicit parent-package edges
    assert find_cycle(graph) == expected
    if expected:
        assert describe(expected, graph).startswith(f"{expected[0]} -> {expected[1]} (line ")


LEARNER = ("jaxgrpo.learner", "jaxgrpo.learner.train_step", "jaxgrpo.learner.minibatch", "jaxgrpo.learner.batch",
           "jaxgrpo.learner.logprobs", "jaxgrpo.learner.fused_head", "jaxgrpo.learner.optim", "jaxgrpo.learner.perf",
           "jaxgrpo.trainer")  # fmt: skip
YAML_LOADER = "jaxgrpo.config"


def _reachable(graph: Graph, start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), {}):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_two_halves_import_only_across_the_record():
    """The rollout half never imports the learner nor the YAML loader; the learner takes config *sections*, never the
    loader (DESIGN.md, Layout). Transitive: an import through a third module counts."""
    graph = import_graph(REPO, "jaxgrpo")
    rollout = [m for m in graph if m == "jaxgrpo.rollout" or m.startswith("jaxgrpo.rollout.")]
    assert len(rollout) >= 5, rollout
    bad = {m: sorted(_reachable(graph, m) & {*LEARNER, YAML_LOADER}) for m in rollout}
    assert not {m: b for m, b in bad.items() if b}, "rollout modules reaching the learner or the YAML loader"
    learner = [m for m in LEARNER if m != "jaxgrpo.trainer"]  # the loop itself may read the YAML config
    assert not [m for m in learner if YAML_LOADER in _reachable(graph, m)], "learner modules reaching jaxgrpo.config"
