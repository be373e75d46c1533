"""The house rules of src/foxhunt, read from its imports (every ``import`` statement, those inside
functions included): no import loop anywhere, and dependencies point down (README, Architecture).

- entry points (``foxhunt.train``, ``foxhunt.cli``, ``foxhunt.commands``) build everything;
- ``foxhunt.training`` (one cell's run) never imports the entry points, jobs, sweeps, the
  ensemble or the benchmark;
- ``foxhunt.models`` knows no job, command line, training room, sweep or ensemble;
- ``foxhunt.data``, ``foxhunt.memory`` and ``foxhunt.precision`` know no model either;
- ``foxhunt.trading`` (the cost and PnL formula, the env) knows none of these, and neither the data
  room nor the evaluation room, which build on it (the datamodules make envs, the backtest calls
  the formula).

And the top of a module says what it needs (docs/concepts/architecture.md, Imports): a module that
imports inside a function says why in one ``# Lazy imports:`` line, and the entry points start
without the heavy packages they defer.
"""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ENTRY_POINTS = ("foxhunt.train", "foxhunt.cli", "foxhunt.commands")
ABOVE_TRAINING = (*ENTRY_POINTS, "foxhunt.jobs", "foxhunt.sweeps", "foxhunt.ensemble", "foxhunt.bench", "foxhunt.paper")
ABOVE_MODELS = (*ABOVE_TRAINING, "foxhunt.training")
RULES = {
    "foxhunt.ensemble": (*ENTRY_POINTS, "foxhunt.paper"),
    "foxhunt.evaluation": ("foxhunt.paper",),
    "foxhunt.runs": ("foxhunt.paper",),
    "foxhunt.training": ABOVE_TRAINING,
    "foxhunt.models": ABOVE_MODELS,
    "foxhunt.data": (*ABOVE_MODELS, "foxhunt.models"),
    "foxhunt.memory": (*ABOVE_MODELS, "foxhunt.models"),
    "foxhunt.precision": (*ABOVE_MODELS, "foxhunt.models"),
    "foxhunt.trading": (*ABOVE_MODELS, "foxhunt.models", "foxhunt.data", "foxhunt.evaluation"),
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in (SRC / "foxhunt").rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@functools.cache  # read once: every rule below reads the same imports
def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                # a package's own __init__ and the bare package are not edges of their modules
                if target and target not in ("foxhunt", name) and not name.startswith(f"{target}."):
                    graph[name].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_loop_anywhere_in_src():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_loop():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("room", sorted(RULES))
def test_dependencies_point_down(room):
    graph = _graph()
    upward = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        if module == room or module.startswith(f"{room}.")
        for target in targets
        if any(target == banned or target.startswith(f"{banned}.") for banned in RULES[room])
    )
    assert upward == []


#: MlflowClient's writing methods: called only inside foxhunt.runs, the store's one owner.
MLFLOW_WRITES = frozenset({"log_batch", "log_metric", "log_param", "set_tag", "set_terminated", "log_artifact", "log_artifacts",
                           "log_inputs", "delete_tag", "create_run"})  # fmt: skip


def test_only_the_runs_room_writes_to_mlflow():
    """A callback writes metrics, tags and artifacts through ``runs.tracked_run.trainer_runs``
    (a RunStore sharing the logger's client), never through ``logger.experiment`` or an
    ``MlflowClient`` of its own. Seen failing before: memory/callback.py called
    ``logger.experiment.log_batch / set_tag / log_artifact``, precision/callback.py
    ``client.set_tag / log_artifact`` on the logger's client."""
    found = []
    for name, path in _modules().items():
        if name == "foxhunt.runs" or name.startswith("foxhunt.runs."):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MLFLOW_WRITES:
                owner = node.func.value
                held = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
                if held in ("experiment", "client", "_client"):
                    found.append(f"{name}:{node.lineno} {ast.unparse(node.func)}")
    assert found == []


#: The one line a module that imports inside a function carries (docs/concepts/architecture.md, Imports).
LAZY_REASON = "# Lazy imports: ("


def _inner_imports(tree: ast.AST) -> list[ast.stmt]:
    """The import statements inside functions (``if TYPE_CHECKING:`` blocks left out)."""
    found: list[ast.stmt] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                if in_function:
                    found.append(child)
                continue
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found


def _sources() -> dict[str, Path]:
    plugin = SRC / "hydra_plugins"
    return {**_modules(), **{".".join(p.relative_to(SRC).with_suffix("").parts): p for p in plugin.rglob("*.py")}}


def test_a_module_that_imports_inside_a_function_says_why():
    """Everything a module needs is imported at its top, but where one of the reasons of
    docs/concepts/architecture.md (Imports) holds; such a module names it in one line, and a
    module whose imports all sit at the top carries no such line."""
    unexplained, stale = [], []
    for name, path in sorted(_sources().items()):
        text = path.read_text()
        explained = any(line.startswith(LAZY_REASON) for line in text.splitlines())
        inner = _inner_imports(ast.parse(text))
        if inner and not explained:
            unexplained.append(f"{name}:{inner[0].lineno} {ast.unparse(inner[0])}")
        elif explained and not inner:
            stale.append(name)
    assert unexplained == [] and stale == []


def test_the_lazy_import_finder_finds_them():
    tree = ast.parse(
        "import os\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import json\n"
        "def f():\n    import torch\n    if True:\n        from x import y\n"
        "class C:\n    import re\n    def m(self):\n        import zlib\n"
    )
    assert [ast.unparse(node) for node in _inner_imports(tree)] == ["import torch", "from x import y", "import zlib"]


#: What an entry point's start must not import: each is a tenth of a second to seconds.
HEAVY = ("torch", "lightning", "mlflow", "pandas", "numpy", "scipy", "matplotlib", "sqlalchemy", "numba", "onnxruntime",
         "optuna", "torchao", "pydantic", "hydra")  # fmt: skip
STARTS = {
    "foxhunt.cli": HEAVY,  # foxhunt --help, tab completion, the read-only commands
    "foxhunt.train": tuple(m for m in HEAVY if m != "hydra"),  # foxhunt-train --help, a bad override
    "foxhunt.jobs.supervisor": ("torch", "lightning", "mlflow", "pandas", "numpy"),  # a job's leader, until training starts
    "hydra_plugins.foxhunt_optuna_sweeper.sweeper": (
        "optuna",
        "torch",
        "lightning",
        "mlflow",
        "pandas",
    ),  # every foxhunt-train start
}


@pytest.mark.parametrize("module", sorted(STARTS))
def test_an_entry_point_starts_without_the_heavy_packages(module):
    code = f"import sys, {module}; print(sorted({{m.partition('.')[0] for m in sys.modules}} & set({STARTS[module]!r})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"import {module} loads {out.stdout.strip()}"
