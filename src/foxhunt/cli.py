"""``foxhunt``: commands around training runs (the training itself is ``foxhunt-train``).

``foxhunt ui`` opens the MLflow UI on the project's store without the user having to remember
its URI, and prints the URL of the runs table (MLflow 3.17's UI opens in its GenAI view; the
classic runs table needs ``workflowType=machine_learning``). Commands that only read import
neither torch nor lightning.

A usage error of any command (an option out of its range, a value of the wrong type, an unknown
option or command, a missing argument) is one line on stderr, ``foxhunt <command>: usage error:
<what> (see ... --help)``, exit status 2: the root group (:class:`OneLineUsageErrors`) reports it,
instead of typer's usage lines and boxed message.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, TypeGuard

import typer
from typer.core import TyperGroup

from foxhunt.commands.child import run_foreground
from foxhunt.commands.data import data_app
from foxhunt.commands.ensemble import ensemble_app
from foxhunt.commands.memory import memory_app
from foxhunt.commands.runs import runs_app
from foxhunt.commands.train_jobs import train_app
from foxhunt.errors import DEBUG_ENV, debug_requested, one_line, reported, strip_debug_flag
from foxhunt.runs.environment import root_dir, sqlite_path, store_uri

# Lazy imports: (a) runs.store (MLflow) in ui: --help, completion and the other commands start without it

UI_STOP_GRACE_S = 10.0  # foxhunt ui stopped: seconds mlflow ui and its workers get to exit before they are killed

PROG = "foxhunt"
EXIT_USAGE = 2  # click's status for a usage error


class OneLineUsageErrors(TyperGroup):
    """foxhunt's root group: a usage error raised while parsing its own arguments or any
    subcommand's (they are parsed inside :meth:`invoke`) is printed as one line (module doc) and
    the command exits with its status (2) through typer's own exit. Help asked for by giving a
    group no arguments is left to typer (it prints the help)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        with _one_line_usage_errors():
            return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with _one_line_usage_errors():
            return super().invoke(ctx)


class _UsageError(Protocol):
    """What foxhunt reads of click's ``UsageError`` (typer's copy of click, told by class name)."""

    def format_message(self) -> str: ...


def _is_usage_error(exc: BaseException) -> TypeGuard[_UsageError]:
    """Click's ``UsageError`` (``BadParameter``, ``NoSuchOption``, ``MissingParameter``, ...) but
    not ``NoArgsIsHelpError``; by class name, as typer's own handler tells the latter (typer
    carries its own copy of click, whose classes are not ``click``'s)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return "UsageError" in names and "NoArgsIsHelpError" not in names


@contextmanager
def _one_line_usage_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        if not _is_usage_error(exc):
            raise

        path = _command_path(getattr(exc, "ctx", None))
        typer.echo(f"{path}: usage error: {one_line(exc.format_message())} (see {path} --help)", err=True)
        raise typer.Exit(getattr(exc, "exit_code", EXIT_USAGE)) from None


def _command_path(ctx) -> str:
    """``foxhunt train list``: the command's names under the root, whatever the program was
    called (``python -m foxhunt.cli``, a test runner)."""
    names = []
    while ctx is not None and ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join([PROG, *reversed(names)])


app = typer.Typer(
    help="foxhunt: train trading models on CME futures under a memory budget.", no_args_is_help=True,
    cls=OneLineUsageErrors,
)  # fmt: skip
app.add_typer(data_app, name="data")
app.add_typer(ensemble_app, name="ensemble")
app.add_typer(memory_app, name="memory")
app.add_typer(runs_app, name="runs")
app.add_typer(train_app, name="train")


@app.callback()
def _group() -> None:
    """foxhunt: train trading models on CME futures under a measured device-memory budget."""


def runs_table_url(host: str, port: int, experiment_id: str | None) -> str:
    base = f"http://{host}:{port}/"
    if experiment_id is None:
        return base
    return f"{base}#/experiments/{experiment_id}/runs?workflowType=machine_learning"


@app.command()
def ui(
    root: Path | None = typer.Option(None, help="Folder holding mlruns/ (default: $FOXHUNT_ROOT or the current folder)."),
    host: str = typer.Option("127.0.0.1", help="Interface to listen on."),
    port: int = typer.Option(5000, help="Port to listen on."),
    experiment: str = typer.Option("foxhunt", help="Experiment whose runs table URL is printed."),
) -> None:
    """Serve the MLflow UI on the project's store (mlruns/mlflow.db) and print the runs URL."""
    uri = store_uri(Path(root) if root else root_dir())
    database = sqlite_path(uri)
    assert database is not None, uri  # store_uri names a sqlite:/// store
    if not database.is_file():
        typer.echo(f"foxhunt ui: no MLflow store at {database}: run foxhunt-train first (or pass --root)", err=True)
        raise typer.Exit(2)
    from foxhunt.runs.store import RunStore

    experiment_id = RunStore(uri).experiment_id(experiment)
    typer.echo(f"MLflow store: {uri}")
    typer.echo(f"Runs table:   {runs_table_url(host, port, experiment_id)}")
    command = [
        sys.executable, "-m", "mlflow", "ui",
        "--backend-store-uri", uri,
        "--host", host, "--port", str(port),
    ]  # fmt: skip

    raise typer.Exit(run_foreground(command, {**os.environ, "MLFLOW_TRACKING_URI": uri}, UI_STOP_GRACE_S))


def main() -> None:
    """``foxhunt``: an input error that a command does not report itself is one line on stderr
    and exit status 2 (``--debug`` / ``FOXHUNT_DEBUG=1``: its traceback); a bug keeps its traceback."""
    sys.argv, flag = strip_debug_flag(sys.argv)
    if flag:  # the commands' own reporters (and their child processes) read it from here
        os.environ[DEBUG_ENV] = "1"
    with reported("foxhunt", debug=flag or debug_requested()):
        app()


if __name__ == "__main__":
    main()
