"""``foxhunt train start|watch|status|list|stop``: training jobs over the MLflow store.

A job is one ``foxhunt-train -m`` launched in the background (see foxhunt.jobs.launch); its
parent MLflow run and nested cell runs are the only place the job is kept, so what these commands show
is what the MLflow UI shows, plus STALE for runs whose process is gone. ``list``, ``status``
and ``watch`` only read, and import neither torch, lightning nor mlflow (the store is read with
sqlite3: foxhunt.runs.sqlite_reader says why and what it costs); ``start`` composes and validates the
grid first, so it imports what validation needs.

Exit codes: 0 done / FINISHED; 1 FAILED (or a stop that did not finish in time); 2 usage
error, unknown job or bad config; 3 KILLED; 4 STALE; 130 ``watch`` left with Ctrl-C (the job
keeps running).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import typer

from foxhunt import json_output
from foxhunt.errors import EXIT_USER_ERROR, UserError, error_line, one_line_error
from foxhunt.printable import visible
from foxhunt.runs.environment import root_dir, store_uri
from foxhunt.runs.status import JOB_STATES, TERMINAL, Status

# Lazy imports: (a) rich and the jobs room (views, display, launch): --help and completion start without them

train_app = typer.Typer(
    help="Start, watch, list and stop training jobs (grids of foxhunt-train cells run in the background).",
    no_args_is_help=True,
)

EXIT_CODES = {Status.FINISHED: 0, Status.FAILED: 1, Status.KILLED: 3, Status.STALE: 4}
EXIT_INTERRUPTED = 130
PIPE_WIDTH = 180  # columns of tables written to a pipe or file
STOP_POLL_S = 0.5  # how often stop checks whether the job's processes are gone
WATCH_INTERVAL_S = 2.0  # seconds between reads of the store while watching
MAX_WATCH_INTERVAL_S = 3600.0  # --interval's bound: inf or 1e300 overflowed time.sleep (a traceback)
LIST_STATES = tuple(str(state) for state in JOB_STATES)
STORE_ERROR_WIDTH = 300  # characters of a store's error shown

ROOT_HELP = "Folder holding mlruns/ and outputs/ (default: $FOXHUNT_ROOT or the current folder)."
URI_HELP = "MLflow tracking URI (default: sqlite:///<root>/mlruns/mlflow.db, the project's store)."


def _root(root: Path | None, prog: str = "foxhunt train") -> Path:
    """``--root``, or the folder foxhunt runs from; a ``--root`` that is no folder is a usage error
    (a typo listed an empty table, exit 0), said under the command's own name ``prog`` (``runs``
    and ``prune`` said "foxhunt train", and a file was "no such folder": found by a helper)."""
    if root is None:
        return root_dir()
    if not Path(root).is_dir():
        what = "not a folder" if Path(root).exists() else "no such folder"
        raise _fail(
            f"--root {visible(root)}: {what} (the folder foxhunt-train ran from: mlruns/ and outputs/ are in it)", prog=prog
        )
    return Path(root).resolve()


#: A command a user waits on, reading a tracking server: MLflow's HTTP client retries 7 times with
#: a growing backoff (minutes on a server that is down) and waits 120 s per request; these
#: commands try twice and wait 10 s each instead, unless the environment sets its own values.
#: Never in a command that trains (start, reproduce): the environment reaches the runs it starts.
WAITED_ON_HTTP = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def _uri(root: Path, tracking_uri: str | None, waited_on: bool = False) -> str:
    """The store a command reads; ``waited_on``: a command that trains nothing (list, status,
    watch, stop, runs top), whose reads of a tracking server give up after :data:`WAITED_ON_HTTP`."""
    uri = tracking_uri or store_uri(root)
    if waited_on and uri.startswith(("http://", "https://")):
        for name, value in WAITED_ON_HTTP.items():
            os.environ.setdefault(name, value)
    return uri


def _fail(message: str, code: int = EXIT_USER_ERROR, prog: str = "foxhunt train") -> typer.Exit:
    typer.echo(f"{prog}: {message}", err=True)
    return typer.Exit(code)


def _console():
    """Rich's console; piped or captured output gets a wide page instead of rich's 80 columns
    (unless $COLUMNS says otherwise), so that tables stay one line per row in logs and files."""
    from rich.console import Console

    wide = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=PIPE_WIDTH if wide else None)


def _find(key: str, root: Path, uri: str):
    from foxhunt.jobs.views import JobNotFound, find_job

    try:
        return find_job(uri, key, root=root)
    except JobNotFound as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:  # an unreachable server, a corrupt database: one line, not a traceback
        raise _store_error(uri, exc) from None


def _store_error(uri: str, exc: Exception) -> typer.Exit:
    """A store that cannot be read is an input error (exit 2), as everywhere; one whose error
    names the store already (locked by another writer: foxhunt.runs.sqlite_reader) says only that."""
    if isinstance(exc, UserError):
        return _fail(one_line_error(exc, with_type=False, limit=STORE_ERROR_WIDTH))
    return _fail(f"cannot read the MLflow store {uri}: {one_line_error(exc, limit=STORE_ERROR_WIDTH)}")


# --------------------------------------------------------------------------------------------
@train_app.command()
def start(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides; comma lists make the grid: model=dqn,tft asset=es,nq precision=bf16."
    ),
    resume: str | None = typer.Option(None, "--resume", metavar="JOB", help="Continue a stopped, failed or stale job."),
    watch: bool = typer.Option(False, "--watch", help="Watch the job after starting it."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP + " Used to find the job to --resume."),
) -> None:
    """Validate the grid, then train it in the background (it survives the terminal closing)."""
    from foxhunt.jobs import launch

    root_dir = _root(root)
    try:
        if resume:
            if overrides:
                raise _fail("--resume takes the job's stored overrides: give no others")
            uri = _uri(root_dir, tracking_uri)  # not waited_on: the job it launches inherits the environment
            launched = launch.resume(_find(resume, root_dir, uri), root_dir, uri)
        else:
            launched = launch.start(list(overrides or []), root_dir)
    except launch.LaunchError as exc:
        raise _fail(str(exc)) from None
    except UserError as exc:  # a stored override that could name code (foxhunt.config.stored)
        raise _fail(error_line(exc, limit=None)) from None
    verb = "resumed" if resume else "started"
    # a store the config moved (logger.tracking_uri=...) must be named to the other commands
    store = "" if launched.tracking_uri == _uri(root_dir, None) else f" --tracking-uri {launched.tracking_uri}"
    lines = [
        f"job {launched.job_id} {verb}: {launched.cells} cell{'s' if launched.cells != 1 else ''}, pid {launched.pid}",
        *(f"  {verb_}:{' ' * (6 - len(verb_))} foxhunt train {verb_} {launched.job_id}{store}"
          for verb_ in ("watch", "status", "stop")),
        f"  log:    {_relative(launched.log)}",
    ]  # fmt: skip
    typer.echo("\n".join(lines))
    if watch:
        _watch(launched.job_id, root_dir, launched.tracking_uri, interval=WATCH_INTERVAL_S)


def _relative(path: Path) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------------------------
@train_app.command()
def watch(
    job: str = typer.Argument(..., help="Job id (or a unique prefix of it)."),
    interval: float = typer.Option(
        WATCH_INTERVAL_S, min=0.1, max=MAX_WATCH_INTERVAL_S, help="Seconds between reads of the store."
    ),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """Live progress of a job until it ends; exits with its final state (0 FINISHED, 1 FAILED,
    3 KILLED, 4 STALE). Ctrl-C leaves the job running."""
    root_dir = _root(root)
    _watch(job, root_dir, _uri(root_dir, tracking_uri, waited_on=True), interval)


def _watch(key: str, root: Path, uri: str, interval: float) -> None:
    from rich.live import Live

    from foxhunt.jobs.display import watch_view
    from foxhunt.jobs.views import now_ms

    console = _console()
    job = _find(key, root, uri)
    stale_seen = 0
    try:
        with Live(watch_view(job, now_ms()), console=console, auto_refresh=False, transient=False) as live:
            while True:
                live.update(watch_view(job, now_ms()), refresh=True)
                stale_seen = stale_seen + 1 if job.state == Status.STALE else 0
                if job.state in TERMINAL or stale_seen >= 2:  # STALE twice: not a passing moment
                    break
                time.sleep(interval)
                job = _find(job.job_id, root, uri)
    except KeyboardInterrupt:
        console.print(f"left watch; job {job.job_id} keeps running (foxhunt train stop {job.job_id} stops it)")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    raise typer.Exit(EXIT_CODES.get(job.state, 1))


# --------------------------------------------------------------------------------------------
@train_app.command()
def status(
    job: str = typer.Argument(..., help="Job id (or a unique prefix of it)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """A job's state and each cell's step, metrics, peak memory, duration, error or checkpoint."""
    from foxhunt.jobs.display import status_view
    from foxhunt.jobs.launch_file import jobs_dir
    from foxhunt.jobs.listing import job_to_dict
    from foxhunt.jobs.views import log_tail, now_ms

    root_dir = _root(root)
    found = _find(job, root_dir, _uri(root_dir, tracking_uri, waited_on=True))
    now = now_ms()
    if as_json:
        typer.echo(json_output.dumps(job_to_dict(found, now), indent=1))
        return
    excerpt = ""
    # the log a record names is shown only when it is the job's own (a launch file or a tag naming /etc/passwd had its
    # end printed)
    own_log = (jobs_dir(root_dir) / f"{found.job_id}.log").resolve()
    if not found.runs and not found.skipped and found.log and Path(found.log).resolve() == own_log:
        excerpt = log_tail(found.log, 10)
    _console().print(status_view(found, now, excerpt))


# --------------------------------------------------------------------------------------------
@train_app.command("list")
def list_jobs(
    status_: list[str] = typer.Option(
        None, "--status", help="Only jobs in these states (repeatable, commas): " + ", ".join(LIST_STATES) + "."
    ),
    model: list[str] | None = typer.Option(None, "--model", help="Only jobs with a cell of this model (repeatable, commas)."),
    asset: list[str] | None = typer.Option(None, "--asset", help="Only jobs with a cell on this asset (repeatable, commas)."),
    since: str | None = typer.Option(None, help="Only jobs started since: an age (30m, 2h, 7d, 1w) or an ISO date/time."),
    sort: str = typer.Option(
        "started", help="started (newest first), duration (longest first) or sharpe (best val/sharpe first)."
    ),
    reverse: bool = typer.Option(False, "--reverse", help="Reverse the order."),
    limit: int = typer.Option(20, min=1, help="Jobs per page."),
    page: int = typer.Option(1, min=1, help="Page to show, from 1."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (the page, its jobs and their cells), not a table."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """Jobs in the store, newest first, with filters, sorting and pages."""
    from foxhunt.jobs.display import list_table
    from foxhunt.jobs.listing import (
        filter_jobs,
        job_to_dict,
        paginate,
        parse_since,
        sort_jobs,
    )
    from foxhunt.jobs.views import load_jobs, now_ms

    states = _split(status_)
    unknown = [s for s in states if s.upper() not in LIST_STATES]
    if unknown:
        raise _fail(f"--status {','.join(unknown)}: expected one of {', '.join(LIST_STATES)}")
    root_dir = _root(root)
    uri = _uri(root_dir, tracking_uri, waited_on=True)
    try:
        since_ms = parse_since(since) if since else None
        now = now_ms()
        shown = paginate(sort_jobs([], sort, now, reverse), limit, page)  # the options, before the store
    except ValueError as exc:
        raise _fail(str(exc)) from None
    try:
        jobs = load_jobs(uri, root=root_dir)
    except Exception as exc:
        raise _store_error(uri, exc) from None
    jobs = filter_jobs(jobs, states, _split(model), _split(asset), since_ms)
    shown = paginate(sort_jobs(jobs, sort, now, reverse), limit, page)
    if as_json:
        payload = {
            "page": shown.page, "pages": shown.pages, "total": shown.total, "limit": limit,
            "jobs": [job_to_dict(j, now) for j in shown.jobs],
        }  # fmt: skip
        typer.echo(json_output.dumps(payload, indent=1))
        return
    _console().print(list_table(shown, now))


def _split(values: list[str] | None) -> list[str]:
    return [part.strip() for value in values or [] for part in value.split(",") if part.strip()]


# --------------------------------------------------------------------------------------------
@train_app.command()
def stop(
    job: str = typer.Argument(..., help="Job id (or a unique prefix of it)."),
    force: bool = typer.Option(False, "--force", help="SIGKILL the job's processes if still there after --timeout."),
    timeout: float = typer.Option(60.0, min=0.0, help="Seconds to wait for a graceful stop."),
    root: Path | None = typer.Option(None, help=ROOT_HELP),
    tracking_uri: str | None = typer.Option(None, help=URI_HELP),
) -> None:
    """Stop a job gracefully: SIGTERM to its process group; each cell in training saves a
    checkpoint and ends KILLED; resume with foxhunt train start --resume JOB."""
    from foxhunt.jobs import launch
    from foxhunt.jobs.display import status_view
    from foxhunt.jobs.views import now_ms

    root_dir = _root(root)
    uri = _uri(root_dir, tracking_uri, waited_on=True)
    found = _find(job, root_dir, uri)
    try:
        launch.check_stoppable(found)
        typer.echo(f"job {found.job_id}: SIGTERM to process group {found.pid}, waiting up to {timeout:g}s")
        result = launch.stop(found, uri, timeout_s=timeout, force=force, poll_s=STOP_POLL_S)
    except launch.NotTheJobsProcess as exc:  # a hand-edited or stale launch file: an input error
        raise _fail(str(exc)) from None
    except launch.LaunchError as exc:
        raise _fail(str(exc), code=1) from None
    final = _find(found.job_id, root_dir, uri)
    _console().print(status_view(final, now_ms()))
    if not result.exited:
        raise _fail(f"job {found.job_id} still stopping after {timeout:g}s: run again with --force to kill it", code=1)
    how = "killed (SIGKILL)" if result.forced else "stopped"
    typer.echo(f"job {found.job_id} {how} in {result.waited_s:.1f}s; "
               f"resume: foxhunt train start --resume {found.job_id}")  # fmt: skip
