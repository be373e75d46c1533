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
"""

from __future__ import annotations

import ast
import functools
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
