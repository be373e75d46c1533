"""``foxhunt runs top``: the best FINISHED cell per group of runs (model x asset by default).

A leaderboard over one experiment (``task=``, default conf/train.yaml's ``task``, as
``foxhunt ensemble register``; ``foxhunt train list`` shows jobs of every experiment): per group
of the ``--by`` tags and data set (the runs' ``data.digest``: runs on other bars are never ranked
or counted as trials together; the ``data`` column shows its first digits, runs that did not
record it are a group of their own, "no digest (old run)"), the best FINISHED run by ``--metric`` in the metric's direction
(:data:`foxhunt.runs.leaderboard.METRIC_DIRECTIONS`), with its interval, best baseline,
deflated Sharpe ratio against the group's trials (``trials``: its N, where a search's
trials count every trial of their study in the cell, pruned and failed ones too), how many
runs the group had, and the run.
Fold and seed children are part of their cell (the cell competes with its aggregate metrics);
what wins, ties and the columns mean: :mod:`foxhunt.runs.leaderboard`. Overrides filter on tags
(``asset=es model=dqn,ppo precision=int8``) and pick the experiment (``task=system``).

A ``test/`` or ``holdout/`` metric may rank the rows (a report of that split); a note on stderr
says that selection (sweeps, searches, ``foxhunt ensemble register``) uses ``val/`` metrics.

Fast on a large store: the SQLite store is read with sqlite3 (one query, one row per run, only
the tags and metrics the leaderboard needs, by key), and nothing here imports torch, lightning
or mlflow (a server store, or a schema the reader does not know, goes through the client): on a
store of 10,000 runs the whole command answers in under a second, interpreter start included,
where the same leaderboard through ``MlflowClient.search_runs`` takes tens of seconds
(``scripts/bench_runs_top.py`` measures it; the figures: docs/benchmarks.md).

Exit codes: 0 (also for an empty leaderboard); 2 for a usage error (bad metric, override or
``--by``, unknown experiment) or a store that is missing or cannot be read, in one line (a store
another writer holds locked is waited for as ``foxhunt train list`` waits, then said locked).

``foxhunt runs reproduce RUN_ID | models:/NAME@ALIAS``: retrain a run from its stored config in
a new folder and MLflow run (experiment ``reproductions``, tag ``reproduction_of``) and say
whether it came out identical, or which input differs (:mod:`foxhunt.runs.reproduce`: the
verdict, what is compared; :mod:`foxhunt.training.reproduce`: what the retraining changes). The
training's own output goes to stderr, the verdict to stdout. Exit codes: 0 identical, 1
differs, 2 when it cannot start (an unknown run, no config artifact, a config refused, no
checkpoint to compare, a store that cannot be read; one line).

``foxhunt runs prune``: remove the stored checkpoints of runs neither registered nor among the
best ``--keep`` of their cell, a dry run unless ``--yes`` (:mod:`foxhunt.commands.prune`).
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from pathlib import Path

import typer

from foxhunt.commands.prune import prune
from foxhunt.commands.train_jobs import ROOT_HELP, URI_HELP, _console, _root, _uri
from foxhunt.errors import EXIT_USER_ERROR, UserError, one_line_error, reported
from foxhunt.printable import shown
from foxhunt.runs import leaderboard as lb
from foxhunt.runs.environment import sqlite_path
from foxhunt.runs.sqlite_reader import INCOMPLETE, KNOWN, SqliteReader, not_a_store
from foxhunt.runs.tags import Tag

# Lazy imports: (a) the store and MLflow, reproduce and training, rich's table, each once its command runs

runs_app = typer.Typer(help="Read the runs in the MLflow store: leaderboards, reproductions, pruning.", no_args_is_help=True)
runs_app.command("prune")(prune)

PROG = "foxhunt runs"
STORE_ERROR_WIDTH = 300  # characters of a store's error shown
DIGITS = 4  # significant digits of the metric, its interval and the baseline in the table
DSR_DIGITS = 3  # decimals of the deflated Sharpe ratio (as the sweep summary)
MISSING = "-"


def _fail(message: str, code: int = EXIT_USER_ERROR) -> typer.Exit:
    typer.echo(f"{PROG}: {message}", err=True)
    return typer.Exit(code)


@runs_app.callback()
def _group() -> None:
    """Read the runs in the MLflow store: leaderboards, reproductions, pruning."""


@runs_app.command()
def top(
    overrides: list[str] = typer.Argument(
        None, help="Filters as Hydra overrides: asset=es model=dqn,ppo precision=int8; task=NAME picks the experiment."
    ),
    metric: str = typer.Option(lb.DEFAULT_METRIC, help="What ranks the runs: <split>/<name>, e.g. val/sharpe, val/loss."),
    by: str = typer.Option(",".join(lb.DEFAULT_BY), help="Group by these tags (commas): " + ", ".join(lb.GROUP_TAGS) + "."),
    limit: int | None = typer.Option(None, min=1, help="Show the best N groups only."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list of the rows (null for a missing number)."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """The best FINISHED cell per group (default: per model and asset) by a metric, in its direction."""
    try:
        split, _ = lb.metric_parts(metric)
        group_by = lb.parse_by(by)
        task, filters = lb.parse_overrides(overrides or [])
    except lb.LeaderboardError as exc:
        raise _fail(str(exc)) from None
    root_dir = _root(root, PROG)
    uri = _uri(root_dir, tracking_uri, waited_on=True)
    query = lb.Query(experiment=task or lb.default_experiment(), metric=metric, by=group_by, filters=filters, limit=limit)
    try:
        source = _source(uri)
        board = lb.top(source, query)
    except typer.Exit:  # _source's one line (no store, no MLflow tables)
        raise
    except lb.LeaderboardError as exc:
        raise _fail(str(exc)) from None
    except UserError as exc:  # a store locked by another writer (waited for): it says so, naming the file
        raise _fail(one_line_error(exc, with_type=False, limit=STORE_ERROR_WIDTH)) from None
    except Exception as exc:  # a corrupt database, an unreachable server: one line, not a traceback
        raise _fail(f"cannot read the MLflow store {uri}: {one_line_error(exc, limit=STORE_ERROR_WIDTH)}") from None
    if split != lb.SELECTION_SPLIT:
        typer.echo(f"{PROG}: note: ranked by {metric}, a report of the {split} split; selection (sweeps, searches, "
                   f"foxhunt ensemble register) uses {lb.SELECTION_SPLIT}/ metrics only", err=True)  # fmt: skip
    if as_json:
        typer.echo(json.dumps([row.to_dict() for row in board.rows], indent=1, allow_nan=False))
        return
    console = _console()
    if board.rows:
        console.print(_table(board))
    console.print(_footer(board))


@runs_app.command()
def reproduce(
    target: str = typer.Argument(..., help="A run id, or a registered version: models:/NAME@ALIAS or models:/NAME/VERSION."),
    as_json: bool = typer.Option(False, "--json", help="Print the verdict as one JSON object."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """Retrain a run from its stored config; say identical (exit 0) or the first input that differs (exit 1)."""
    from foxhunt.runs import reproduce as rp
    from foxhunt.training.reproduce import check_stored_hash, reproduction_config, reproduction_folder, retrain

    root_dir = _root(root, PROG)
    uri = _uri(root_dir, tracking_uri)
    store = _store(uri)
    with tempfile.TemporaryDirectory(prefix="foxhunt-reproduce-") as scratch:
        workdir = Path(scratch)
        with _read_failures(uri):
            original = rp.open_original(store, rp.resolve_target(store, target), workdir)
        origin = f"run {original.run.run_id} ({original.run.name})"
        with reported(PROG):  # a config.yaml changed after its run: one line, nothing trained
            check_stored_hash(original.config, original.run.tags, origin, original.config_path)
        out_dir = reproduction_folder(root_dir, original.run.name)
        cfg = reproduction_config(original.config, out_dir, uri, _artifact_location(uri))
        with reported(PROG), contextlib.redirect_stdout(sys.stderr):  # the verdict alone on stdout
            reproduction = retrain(cfg, original.run.run_id, f"{original.run.name}-reproduction", original.threads)
        with _read_failures(uri):
            verdict = rp.compare(store, original, reproduction, workdir)
        store.tag(reproduction, {Tag.REPRODUCTION_VERDICT: verdict.headline()})
        store.log_text(reproduction, "\n".join(verdict.lines()) + "\n", rp.VERDICT_ARTIFACT)
    typer.echo(json.dumps(verdict.to_dict(), indent=1) if as_json else "\n".join(verdict.lines()))
    raise typer.Exit(verdict.exit_code)


def _store(uri: str):
    """The store at ``uri``; a SQLite file that does not exist is one line (never created)."""
    from foxhunt.runs.store import RunStore

    path = sqlite_path(uri)
    if path is not None and not path.is_file():
        raise _fail(f"no MLflow store at {path}: run foxhunt-train first (or pass --root)")
    problem = not_a_store(path) if path is not None else None
    if problem:
        raise _fail(f"cannot read the MLflow store {path}: {problem}")
    return RunStore(uri)


@contextlib.contextmanager
def _read_failures(uri: str):
    """An input error (an unknown run, a refused config, ...) or a store that cannot be read: one
    line, exit 2."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except UserError as exc:
        raise _fail(one_line_error(exc, with_type=False, limit=STORE_ERROR_WIDTH * 2)) from None
    except MlflowException as exc:
        raise _fail(f"cannot read the MLflow store {uri}: {one_line_error(exc, limit=STORE_ERROR_WIDTH)}") from None


def _artifact_location(uri: str) -> str | None:
    """Where a new experiment of a SQLite store keeps its artifacts (conf/logger/mlflow.yaml:
    ``<mlruns>/artifacts`` beside ``<mlruns>/mlflow.db``); a server's own default otherwise."""
    path = sqlite_path(uri)
    return None if path is None else str(path.parent / "artifacts")


def _source(uri: str):
    """The SQLite reader on the project's store (the client for a server or a schema it does
    not know); a missing store, or a file without MLflow's tables, is one line, exit 2; a store
    locked by another writer is waited for, then :class:`~foxhunt.runs.sqlite_reader.StoreLocked`."""
    path = sqlite_path(uri)
    if path is not None:
        if not path.is_file():
            raise _fail(f"no MLflow store at {path}: run foxhunt-train first (or pass --root)")
        reader = SqliteReader(path)
        schema = reader.schema()
        if schema == KNOWN:
            return lb.SqliteSource(reader)
        if schema == INCOMPLETE:
            raise _fail(f"cannot read the MLflow store {path}: not an SQLite store with MLflow's tables")
    from foxhunt.runs.store import RunStore

    return lb.ClientSource(RunStore(uri))


def _number(value: float | None, digits: int = DIGITS) -> str:
    return MISSING if value is None else f"{value:.{digits}g}"


def _table(board):
    from rich.table import Table

    query = board.query
    table = Table(expand=False, title_justify="left",
                  title=f"best FINISHED run per {','.join(query.by)} and data set by {query.metric} ({board.direction})")  # fmt: skip
    # on a narrow terminal the cells wrap (nothing is cut off); in a pipe each row is one line
    for name in query.by:
        table.add_column(name, overflow="fold")
    table.add_column("data", overflow="fold")
    for name in (query.metric, "interval", "best baseline", "DSR", "trials", "runs"):
        table.add_column(name, justify="right", overflow="fold")
    for name in ("run name", "run id"):
        table.add_column(name, overflow="fold")
    quantity = query.metric.rsplit("/", 1)[-1]
    for row in board.rows:
        interval = MISSING
        if row.ci_low is not None or row.ci_high is not None:
            interval = f"[{_number(row.ci_low)}, {_number(row.ci_high)}]"
        baseline = MISSING
        if row.baseline is not None:
            by_other = row.baseline.metric.rsplit("/", 1)[-1]
            baseline = f"{row.baseline.name} {_number(row.baseline.value)}" + (
                f" ({by_other})" if by_other != quantity else "")  # fmt: skip
        runs = str(row.runs) if row.scored == row.runs else f"{row.runs} ({row.runs - row.scored} without)"
        dsr = MISSING if row.dsr is None else f"{row.dsr:.{DSR_DIGITS}f}"
        data = lb.data_label(row.data)
        table.add_row(*(shown(row.group[name]) for name in query.by), shown(data), _number(row.value), interval, shown(baseline), dsr,
                      str(row.dsr_trials), runs, shown(row.run_name), shown(row.run_id))  # fmt: skip
    return table


def _footer(board) -> str:
    query = board.query
    filters = " ".join(f"{key}={','.join(values)}" for key, values in query.filters.items())
    where = f"experiment {query.experiment}" + (f" ({filters})" if filters else "")
    if not board.rows:
        return f"{where}: no FINISHED run with {query.metric} among {board.considered} FINISHED cell runs"
    shown = f"{len(board.rows)} of {board.groups - board.unscored_groups}" if query.limit else str(len(board.rows))
    text = f"{where}: {shown} groups, {board.considered} FINISHED cell runs (folds and seeds count as their cell)"
    if board.unscored_groups:
        text += f"; {board.unscored_groups} group{'s' if board.unscored_groups != 1 else ''} without {query.metric}"
    return text + ("; a group is one data set (data: the runs' data.digest); DSR against the group's trials (a search's: "
                   "every trial of its study, pruned and failed too)")  # fmt: skip
