"""``foxhunt ensemble``: register each family's best run, replay bars through the ensemble.

``foxhunt ensemble register [OVERRIDES...] [--dry-run]`` picks, for ``asset``, the best FINISHED
run of each family in ``ensemble.models`` by ``ensemble.metric`` and registers it in the MLflow
Model Registry (:mod:`foxhunt.ensemble.registry`); ``--dry-run`` prints the choice only.

``foxhunt ensemble replay [OVERRIDES...]`` loads the registered ensemble (:mod:`foxhunt.ensemble.loading`),
streams the bars of the ``data`` group bar by bar through it (``ensemble.split``: a split of the
dataset, the bars before it priming the features; ``all``: every bar), scores each member and
the ensemble with the shared backtest, prints the table and the measured per-bar latencies, and
logs an MLflow run (experiment ``ensemble.experiment``) with the table, the latencies and an
equity PNG of the ensemble beside its members.

``--interpret FOLDER`` also writes the TFT member's mean variable-selection weights and attention
over the replayed bars there (:mod:`foxhunt.evaluation.interpret`), computed after the replay.

``foxhunt ensemble serve [OVERRIDES...] [--host 127.0.0.1] [--port 8080]`` answers bars over
HTTP with the same ensemble (:mod:`foxhunt.ensemble.serve`, uvicorn): ``POST /predict`` a bar or a
batch of bars for a symbol, ``GET /health``; SIGTERM or Ctrl-C stops it.

``foxhunt ensemble footprint [OVERRIDES...]`` measures what the registered ensemble costs to hold and run,
member by member, in fp32 and int8, against ``budget`` (:mod:`foxhunt.ensemble.footprint`), records on each
version whether int8 pays (what ``ensemble.weights=auto`` loads) and exits 1 when the ensemble as configured
does not fit.

``foxhunt ensemble roll [OVERRIDES...] [--force] [--every SECONDS]`` is one step of the rolling
loop (:mod:`foxhunt.roll.step`): the bars no champion has seen, a challenger per family on the
window before the newest of them, champion against challenger on those newest bars, the winners
promoted (``champion`` moved, the old version kept as ``previous``); ``--every`` repeats it
until SIGTERM or Ctrl-C. ``foxhunt ensemble rollback [OVERRIDES...] [--dry-run]`` moves each
``champion`` back to ``previous`` (:mod:`foxhunt.roll.rollback`).

Overrides are Hydra overrides of ``conf/ensemble.yaml`` (the training config plus the groups ``conf/ensemble``,
``conf/paper`` and ``conf/roll``):
``asset=nq``, ``data=databento data.source.path=...``, ``ensemble.metric=val/loss``,
``ensemble.models=[dqn,tft]``, ``ensemble.rule=weighted``, ``ensemble.weights=int8``.
Exit 0 on success, 2 with one line on a bad override, a missing store, run or version.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import typer
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from foxhunt.errors import EXIT_USER_ERROR, debug_requested, reported
from foxhunt.printable import visible

# Lazy imports: (a) Hydra, the schema, the ensemble, paper and roll rooms, each once its command runs

# MLflow draws a progress bar per artifact download; an ensemble downloads a few small files
os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

ensemble_app = typer.Typer(
    help="The ensemble: register the best run of each family, replay bars through it.", no_args_is_help=True
)

MAX_PORT = 65535  # --port: 0 (any free port) .. 65535
OVERRIDES = typer.Argument(
    None, help="Hydra overrides of conf/ensemble.yaml: asset=es ensemble.metric=val/sharpe ensemble.models=[dqn,tft] ..."
)


def _fail(command: str, message: str) -> typer.Exit:
    typer.echo(f"foxhunt ensemble {command}: {message}", err=True)
    return typer.Exit(EXIT_USER_ERROR)


@contextlib.contextmanager
def _reported(command: str):
    """An input error inside a command (config, data, registry, store): one line naming the
    command and the input, exit 2 (:func:`foxhunt.errors.reported`; FOXHUNT_DEBUG=1 or
    ``--debug``: the traceback)."""
    with reported(f"foxhunt ensemble {command}", debug=debug_requested(), exit_code=EXIT_USER_ERROR):
        yield


def _compose(command: str, overrides: list[str] | None):
    from hydra.errors import HydraException

    from foxhunt.config.compose import compose_config
    from foxhunt.config.schema import ConfigError, validate

    try:
        cfg = compose_config(list(overrides or []), config_name="ensemble")
        validate(cfg)
    except (HydraException, OmegaConfBaseException, ConfigError) as exc:
        raise _fail(command, f"config error: {str(exc).strip().splitlines()[0]}") from None
    device = str(cfg.ensemble.device)
    if device.startswith("cuda"):  # a device this machine lacks was a traceback from the first member's .to()
        import torch

        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise _fail(command, f"config error: ensemble.device={device}: this machine has no such CUDA device that torch "
                                 f"{torch.__version__} can use ({torch.cuda.device_count()} found); use ensemble.device=cpu")  # fmt: skip
    return cfg


def _check_store(command: str, cfg) -> str:
    if cfg.logger.tracking_uri is None:
        raise _fail(command, "logger.tracking_uri is null (logger=none): the ensemble lives in the MLflow store; "
                             "keep logger=mlflow and set logger.enabled=false to log nothing")  # fmt: skip
    uri = str(cfg.logger.tracking_uri)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        raise _fail(
            command,
            f"no MLflow store at {uri[len('sqlite:///') :]}: train first (foxhunt-train), or set paths.root_dir / logger.tracking_uri",
        )
    return uri


@ensemble_app.command()
def register(
    overrides: list[str] | None = OVERRIDES,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the choice table; register nothing."),
    force: bool = typer.Option(False, "--force", help="Register champions the gate refuses (tagged gate=forced)."),
    holdout: bool = typer.Option(
        False, "--holdout", help="Score the champions on the lockbox (evaluation.holdout), once; recorded on their runs."
    ),
) -> None:
    """Register the best run of each family (by a validation metric) as <prefix>-<model>-<asset>@champion,
    if it beats its baseline on the validation bars (ensemble.gate)."""
    from foxhunt.ensemble.registry import register_champions, registered_name

    cfg = _compose("register", overrides)
    uri = _check_store("register", cfg)
    ens = cfg.ensemble
    asset = str(cfg.asset.key)
    with _reported("register"):
        outcome = register_champions(
            uri, str(cfg.task), asset, [str(m) for m in ens.models], str(ens.metric), str(ens.registry_prefix),
            str(ens.alias), dry_run, gate=str(ens.gate), force=force, example_decided=int(ens.input_example_decided),
            journal=str(cfg.roll.experiment) if cfg.get("roll") is not None else None,
            previous=str(cfg.roll.previous_alias) if cfg.get("roll") is not None else None,
            artifact_location=cfg.logger.get("artifact_location"),
        )  # fmt: skip
    for line in outcome.completed:
        typer.echo(f"foxhunt ensemble register: {line}")
    typer.echo(f"experiment {cfg.task}, asset {asset}, best by {ens.metric} (FINISHED runs; ties: the champion, then the newest)")
    typer.echo(f"{'family':<8} {'run':<34} {'name':<22} {ens.metric:>12} {'considered':>10} {'no metric':>9}")
    for c in outcome.choices:
        value = "-" if c.value is None else f"{c.value:.6g}"
        typer.echo(
            f"{c.family:<8} {visible(c.run_id or '-'):<34} {visible(c.run_name or '-'):<22} {value:>12} {c.considered:>10} "
            f"{c.without_metric:>9}"  # names from the store, shown escaped (foxhunt.printable)
        )
    if dry_run:
        typer.echo("dry run: nothing registered")
        return
    if outcome.refused and not force:
        for family, why in outcome.refused:
            typer.echo(
                f"foxhunt ensemble register: {family}: not registered: {why} (--force registers it, tagged gate=forced)", err=True
            )
        typer.echo("foxhunt ensemble register: nothing registered", err=True)
        raise typer.Exit(EXIT_USER_ERROR)
    for family, why in outcome.refused:
        typer.echo(f"{family}: registered although {why} (--force: tagged gate=forced)")
    for r in outcome.registered:
        what = "unchanged (its best run is already the alias)" if r.unchanged else f"registered (gate={r.gate})"
        typer.echo(f"{r.name} version {r.version} @{ens.alias}: {what}, run {r.run_id}")
    if holdout:
        from foxhunt.ensemble.holdout import open_lockbox

        with _reported("register"), tempfile.TemporaryDirectory(prefix="foxhunt-holdout-") as workdir:
            for report in open_lockbox(uri, outcome.registered, Path(workdir)):
                typer.echo(report.line())
    names = ", ".join(registered_name(str(ens.registry_prefix), str(m), asset) for m in ens.models)
    typer.echo(f"MLflow UI, Models page: {names} (foxhunt ui)")


@ensemble_app.command()
def replay(
    overrides: list[str] | None = OVERRIDES,
    interpret: Path | None = typer.Option(
        None,
        "--interpret",
        help="Write the TFT member's mean variable-selection weights and attention over the replayed "
        "bars to this folder (table + PNGs; computed after the replay, at most evaluation.interpret.max_windows windows).",
    ),  # fmt: skip
) -> None:
    """Stream bars through the registered ensemble; a table of each member and of the whole, latencies, an MLflow run."""
    from foxhunt.ensemble.replay_run import run_replay

    cfg = _compose("replay", overrides)
    _check_store("replay", cfg)
    if interpret is not None:
        try:
            interpret.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _fail("replay", f"--interpret {interpret}: cannot make the folder ({exc.strerror})") from None
    with _reported("replay"), tempfile.TemporaryDirectory(prefix="foxhunt-replay-") as workdir:
        report = run_replay(cfg, Path(workdir), interpret=interpret)
    typer.echo(report.text)


@ensemble_app.command()
def serve(
    overrides: list[str] | None = OVERRIDES,
    host: str = typer.Option("127.0.0.1", help="Interface to listen on (127.0.0.1: this machine only)."),
    port: int = typer.Option(8080, help="Port to listen on."),
    timeout: float = typer.Option(
        None,
        help="Seconds from a request's arrival to its answer (queue and ensemble), else a 504 (default ensemble.serve.timeout_s).",
    ),
) -> None:
    """Serve the registered ensemble over HTTP: POST /predict bars for a symbol, GET /health, GET /info."""
    from foxhunt.ensemble.serve import EnsembleService, Limits, check_address, run

    if not 0 <= port <= MAX_PORT:
        raise _fail("serve", f"--port {port}: must be 0..{MAX_PORT}")
    # --timeout is ensemble.serve.timeout_s, checked by the config's schema (nan and -1 passed before: nan answered
    # 200 with no bar applied, -1 a 408 for every request)
    cfg = _compose("serve", [*(overrides or []), *([f"ensemble.serve.timeout_s={timeout!r}"] if timeout is not None else [])])
    _check_store("serve", cfg)
    ens = cfg.ensemble
    with tempfile.TemporaryDirectory(prefix="foxhunt-serve-") as workdir:  # removed on exit, whatever ends the server
        with _reported("serve"):  # the ensemble loads before the URL is printed: a bad version is one line here
            check_address(host, port)
            service = EnsembleService(cfg, Path(workdir), Limits.from_config(ens.serve))
        typer.echo(f"foxhunt ensemble serve: {', '.join(map(str, ens.models))} for {cfg.asset.key} on http://{host}:{port} "
                   f"(POST /predict, GET /health, GET /info); one symbol's stream holds {service.stream_bytes:,} bytes")  # fmt: skip
        run(service, host, port)


@ensemble_app.command()
def footprint(overrides: list[str] | None = OVERRIDES) -> None:
    """Footprint of the registered ensemble in fp32 and int8, headroom against the budget, capacity; exit 0 when it fits."""
    from foxhunt.ensemble.footprint import measure_footprint

    cfg = _compose("footprint", overrides)
    _check_store("footprint", cfg)
    with _reported("footprint"), tempfile.TemporaryDirectory(prefix="foxhunt-footprint-") as workdir:
        text, metrics, fits = measure_footprint(cfg, Path(workdir))
    typer.echo(text)
    if cfg.logger.enabled:
        typer.echo(f"MLflow run {_log_footprint(cfg, text, metrics, fits)} in experiment {cfg.ensemble.experiment}")
    if not fits:
        typer.echo(
            f"foxhunt ensemble footprint: the {cfg.ensemble.weights} ensemble leaves less than {cfg.budget.headroom_mb} MB of {cfg.budget.name} free",
            err=True,
        )
        raise typer.Exit(1)


def _log_footprint(cfg, text: str, metrics: dict, fits: bool) -> str:
    from foxhunt.config.schema import resolved_config
    from foxhunt.runs.tracked_run import TrackedRun

    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = out / "footprint.md"
    report.write_text(text + "\n")
    tags = {"asset": str(cfg.asset.key), "budget": str(cfg.budget.name), "fits": str(fits)}
    resolved = resolved_config(cfg)
    with TrackedRun(str(cfg.logger.tracking_uri), str(cfg.ensemble.experiment), cfg.logger.artifact_location,
                    f"footprint-{cfg.asset.key}-{cfg.budget.name}", tags, source="foxhunt ensemble footprint") as run:  # fmt: skip
        run.log_config(resolved, OmegaConf.to_yaml(resolved))
        run.log_metrics({k: v for k, v in metrics.items() if math.isfinite(v)})
        run.log_artifact(report)
    return run.run_id


@ensemble_app.command()
def export(
    overrides: list[str] | None = OVERRIDES,
    fmt: str = typer.Option("onnx", "--format", help="onnx (ONNX Runtime: C++, Rust, Java, C#, JS) or torchscript (libtorch)."),
    out: str = typer.Option("exports", "--out", help="Folder the members' folders are written under (only inside it)."),
) -> None:
    """Write each registered member's batch-1 streaming step as ONNX or TorchScript, with member.json
    (features, normalization, asset, inputs, outputs, decision rule) beside it."""
    from foxhunt.ensemble.export import EXPORTED_WEIGHTS, FORMATS, export_ensemble

    if fmt not in FORMATS:
        raise _fail("export", f"--format {fmt}: must be one of {', '.join(FORMATS)}")
    if not out.strip():
        raise _fail("export", "--out is empty: name the folder to write the members' folders under")
    cfg = _compose("export", overrides)
    _check_store("export", cfg)
    folder = Path(out)
    try:  # before the members are built: a folder that cannot be written is known at once
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail("export", f"--out {out}: cannot make the folder ({exc.strerror})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise _fail("export", f"--out {out}: the folder is not writable")
    with _reported("export"), tempfile.TemporaryDirectory(prefix="foxhunt-export-") as workdir:
        done = export_ensemble(cfg, folder, fmt, Path(workdir))
    for item in done:
        typer.echo(f"{item.name} v{item.version}: {item.folder} ({item.fmt}); checked against the model on random "
                   f"inputs by {'ONNX Runtime' if item.fmt == 'onnx' else 'torch.jit.load'}: max |diff| {item.max_diff:.2e}")  # fmt: skip
        if item.ensemble_weights != EXPORTED_WEIGHTS:
            typer.echo(f"{item.name} v{item.version}: exported with its {EXPORTED_WEIGHTS} weights; foxhunt's ensemble decides "
                       f"with {item.ensemble_weights} ({item.why}): their decisions can differ", err=True)  # fmt: skip


@ensemble_app.command()
def paper(overrides: list[str] | None = OVERRIDES) -> None:
    """Paper-trade the registered ensemble on a bar feed (paper.feed: file at paper.speed, or Databento live):
    orders, fills, a SQLite ledger that resumes after a crash, risk limits; an MLflow run in experiment paper."""
    from foxhunt.paper.run import run_paper

    cfg = _compose("paper", overrides)
    _check_store("paper", cfg)
    with _reported("paper"), tempfile.TemporaryDirectory(prefix="foxhunt-paper-") as workdir:
        report = run_paper(cfg, Path(workdir))
    typer.echo(report.text)


@ensemble_app.command()
def roll(
    overrides: list[str] | None = OVERRIDES,
    force: bool = typer.Option(False, "--force", help="Promote each challenger whatever the gate says (tagged gate=forced)."),
    every: float = typer.Option(
        None,
        "--every",
        min=1.0,
        help="Repeat the step every this many seconds until SIGTERM or Ctrl-C "
        "(each step idempotent: without new bars it does nothing and says so).",
    ),
) -> None:
    """One step of the rolling loop: new bars found, a challenger per family trained on the moved window, champion
    against challenger on the newest bars neither has seen, the winners promoted (@champion moved, the old one @previous)."""
    from foxhunt.roll.step import roll_step

    cfg = _compose("roll", overrides)
    _check_store("roll", cfg)
    stop = threading.Event()
    handlers = {}
    if every is not None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            handlers[sig] = signal.signal(sig, lambda *_: stop.set())
    try:
        while True:
            started = time.monotonic()
            with _reported("roll"), tempfile.TemporaryDirectory(prefix="foxhunt-roll-") as workdir:
                report = roll_step(cfg, Path(workdir), force=force)
            typer.echo(report.text)
            if every is None or stop.wait(max(every - (time.monotonic() - started), 0.0)):
                return
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@ensemble_app.command()
def rollback(
    overrides: list[str] | None = OVERRIDES,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the moves; move nothing."),
) -> None:
    """Move each family's @champion back to its @previous version (and @previous to the one it left)."""
    from foxhunt.roll.rollback import rollback_ensemble

    cfg = _compose("rollback", overrides)
    _check_store("rollback", cfg)
    with _reported("rollback"):
        done = rollback_ensemble(cfg, dry_run=dry_run)
    for line in done.lines:
        typer.echo(line)
    if done.run_id:
        typer.echo(f"MLflow run {done.run_id} in experiment {cfg.roll.experiment}")
