"""``foxhunt runs prune``: remove the stored checkpoints of runs that are neither registered nor
among the best ``--keep`` of their cell (:mod:`foxhunt.runs.prune`: what goes, what never goes,
and how a run registered or reopened meanwhile keeps its files).

A dry run unless ``--yes``: it prints each run it would prune with the bytes of its stored
checkpoints (measured from the files), and the total. ``--keep`` defaults to ``keep_top`` of
``conf/prune.yaml``; ``--metric`` ranks as ``foxhunt runs top`` does; ``task=NAME`` picks the experiment
as there (tag filters are refused: a cell is ranked whole).

Exit codes: 0 (also when nothing is to prune); 2 for a usage error (a bad option or override, an
unknown experiment, a server store, a store that is missing or cannot be read), in one line.
"""

from __future__ import annotations

from pathlib import Path

import typer

from foxhunt.commands.train_jobs import ROOT_HELP, URI_HELP, _root, _uri
from foxhunt.errors import EXIT_USER_ERROR, UserError, one_line_error
from foxhunt.runs import leaderboard as lb

# Lazy imports: (a) runs.prune and the store (MLflow, the ensemble's registry), once runs prune runs

PROG = "foxhunt runs prune"
STORE_ERROR_WIDTH = 300  # characters of a store's error shown
MB = 1024 * 1024


def _fail(message: str) -> typer.Exit:
    typer.echo(f"{PROG}: {message}", err=True)
    return typer.Exit(EXIT_USER_ERROR)


def _size(count: int) -> str:
    return f"{count:,} bytes ({count / MB:.1f} MB)"


def prune(
    overrides: list[str] = typer.Argument(
        None, help="task=NAME picks the experiment (default: conf/train.yaml's task, as runs top)."
    ),
    keep: int | None = typer.Option(
        None, help="The best N FINISHED runs of each cell keep their checkpoints (default: keep_top of conf/prune.yaml)."
    ),  # fmt: skip
    metric: str = typer.Option(lb.DEFAULT_METRIC, help="What ranks the runs of a cell: <split>/<name>, as runs top."),
    yes: bool = typer.Option(False, "--yes", help="Remove them (without it: a dry run that removes nothing)."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """Remove the stored checkpoints of runs neither registered nor among the best of their cell (dry run unless --yes)."""
    from foxhunt.runs import prune as pr

    try:
        task, filters = lb.parse_overrides(overrides or [])
        if filters:
            raise pr.PruneError(f"override {next(iter(filters))}=...: prune takes task= only (it ranks whole cells)")
        keep = pr.default_keep() if keep is None else keep
        pr.check_keep(keep)  # before the store is opened: --keep 0 was refused after 8 s (found by a helper)
        experiment = task or lb.default_experiment()
        uri = _uri(_root(root, PROG), tracking_uri)
        pr.store_folder(uri)  # a server store, or none: one line before mlflow is imported
        from foxhunt.runs.store import RunStore

        store = RunStore(uri)
        plan = pr.plan_prune(store, experiment, metric, keep)
    except UserError as exc:
        raise _fail(one_line_error(exc, with_type=False, limit=STORE_ERROR_WIDTH * 2)) from None
    for run, problem in plan.refused:
        typer.echo(f"{PROG}: left {run.name} {run.run_id}: {problem}", err=True)
    verb = "remove" if yes else "would remove"
    for removal in plan.removals:
        files = f"{removal.files} file{'s' if removal.files != 1 else ''}"
        typer.echo(f"{verb} the checkpoints of {removal.run.name} {removal.run.run_id}: {files}, {_size(removal.bytes)}; "
                   f"{removal.why}")  # fmt: skip
    kept = ", ".join(f"{count} {why}" for why, count in sorted(plan.kept.items()))
    summary = (f"experiment {experiment}: {len(plan.removals)} runs' checkpoints, {_size(plan.bytes)}; FINISHED runs kept: "
               f"{kept or 'none'} (best {keep} of each cell by {metric}); {plan.unfinished} runs not FINISHED, untouched; "
               f"{plan.bare} that lost store no checkpoints")  # fmt: skip
    if not yes:
        typer.echo(f"would remove {summary}" + ("; pass --yes to remove them" if plan.removals else ""))
        return
    try:
        outcome = pr.apply_prune(store, plan)
    except UserError as exc:
        raise _fail(one_line_error(exc, with_type=False, limit=STORE_ERROR_WIDTH * 2)) from None
    for removal, why in outcome.left:
        typer.echo(f"{PROG}: left {removal.run.name} {removal.run.run_id}: {why}", err=True)
    typer.echo(f"removed {len(outcome.removed)} runs' checkpoints, {_size(outcome.bytes)}"
               + (f"; {len(outcome.left)} left (checked again before removing)" if outcome.left else ""))  # fmt: skip
