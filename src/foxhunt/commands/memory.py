"""``foxhunt memory``: the training memory of the models sharing one card (the card) against a device budget.

``foxhunt memory validate [OVERRIDES...] [--predict] [--models dqn,ppo,mamba2,tft] [--json]``
builds every model as ``foxhunt-train`` would, measures its training footprint with a real
short fit (:mod:`foxhunt.memory.training_run`), judges the card against the budget
(:mod:`foxhunt.memory.card`), prints the report (:mod:`foxhunt.memory.card_report`), logs an MLflow run (experiment ``memory``, run
``memory-validate-{precision}-{budget}``) with the report as artifacts, and exits

- 0 when every model is within its target and the ensemble (all resident at once) leaves the
  budget's required headroom free,
- 1 when not (the last line says why), or when a model could not be measured,
- 2 on a bad override, option or config value (one line naming it).

Overrides are Hydra overrides of ``conf/train.yaml``: a plain one applies to every model
(``precision=bf16``, ``budget=cpu``, ``budget.total_mb=8192``); one prefixed with a model name
and a colon applies to that model only (``tft:model.module.hidden_size=128``). ``model=`` is
not an override here: ``--models`` picks the models. ``logger=none`` skips MLflow.

Its top-level imports are light (typer, OmegaConf, the standard library, the store's location and
tags): torch, Lightning, Hydra and MLflow load inside the command (its ``# Lazy imports:`` line).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import typer
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from foxhunt.config.families import family_names
from foxhunt.errors import EXIT_USER_ERROR, one_line_error
from foxhunt.printable import visible
from foxhunt.runs.environment import root_dir
from foxhunt.runs.tags import Tag

# Lazy imports: (a) Hydra, the schema, the training and memory rooms, once a memory command runs

memory_app = typer.Typer(help="Measured training memory of the models against a device budget.", no_args_is_help=True)

EXPERIMENT = "memory"
SOURCE = "foxhunt memory validate"  # the runs table's Source column
DEFAULT_MODELS = ",".join(family_names())  # every family of conf/model/
EXIT_FAIL = 1


class UsageError(ValueError):
    """A bad option or override (one line)."""


def available_models() -> list[str]:
    """The model families (``conf/model/*.yaml``: :mod:`foxhunt.config.families`)."""
    return list(family_names())


def parse_models(models: str) -> list[str]:
    names = [name.strip() for name in models.split(",") if name.strip()]
    known = available_models()
    if not names:
        raise UsageError(f"--models is empty (available: {', '.join(known)})")
    for name in names:
        if name not in known:
            raise UsageError(f"--models: unknown model {name!r} (available: {', '.join(known)})")
    if len(set(names)) != len(names):
        raise UsageError(f"--models: a model is listed twice in {models!r}")
    return names


def split_overrides(overrides: list[str], models: list[str]) -> tuple[list[str], dict[str, list[str]]]:
    """``(overrides for every model, {model: its own overrides})``; ``<model>:<override>`` is a
    model's own (the prefix is a model name, before any ``=``)."""
    shared: list[str] = []
    own: dict[str, list[str]] = {name: [] for name in models}
    known = set(available_models())
    for item in overrides:
        key = item.split("=", 1)[0]
        prefix, colon, rest = item.partition(":")
        if colon and ":" in key and prefix in known:
            if prefix not in own:
                raise UsageError(f"override {item!r}: model {prefix!r} is not among --models ({', '.join(models)})")
            target, value = own[prefix], rest
        else:
            target, value = shared, item
        if value.split("=", 1)[0].lstrip("+~") == "model":
            raise UsageError(f"override {item!r}: the models are picked with --models, not model=")
        target.append(value)
    return shared, own


def _fail(prefix: str, message: str, code: int) -> typer.Exit:
    typer.echo(f"foxhunt memory validate: {prefix}{message}", err=True)
    return typer.Exit(code)


@memory_app.command()
def validate(
    overrides: list[str] = typer.Argument(
        None,
        help="Hydra overrides for every model (precision=bf16 budget=cpu budget.total_mb=8192) or for one, prefixed 'tft:model.module.hidden_size=128'.",
    ),
    predict: bool = typer.Option(
        False, "--predict", help="Also predict each footprint from the config before measuring it, and show both."
    ),
    models: str = typer.Option(DEFAULT_MODELS, "--models", help="Comma-separated models to build and measure."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON instead of text."),
    root: Path | None = typer.Option(
        None, "--root", help="Folder holding mlruns/ and the feature cache (default $FOXHUNT_ROOT or the current folder)."
    ),
) -> None:
    """Measure every model's training footprint and check the card against the memory budget.

    Exit 0 when every model is within its target and all of them at once leave the budget's
    required headroom; 1 when not; 2 on a bad override or option.
    """
    try:
        names = parse_models(models)
        shared, own = split_overrides(list(overrides or []), names)
    except UsageError as exc:
        raise _fail("", str(exc), EXIT_USER_ERROR) from None

    folder = Path(root).resolve() if root else root_dir()
    if not folder.is_dir():  # it made the folder, where every other command refuses one that is not there
        raise _fail("", f"--root {visible(str(root))}: no such folder (the folder holding mlruns/ and the feature cache)",
                    EXIT_USER_ERROR)  # fmt: skip
    _check_syntax([*shared, *(item for items in own.values() for item in items)])
    out_dir = folder / "outputs" / "memory" / f"validate-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    configs = _compose(names, shared, own, folder, out_dir)
    budget = _budget(configs)
    code = _run(configs, budget, predict, as_json, out_dir, [*(overrides or [])])
    raise typer.Exit(code)


def _check_syntax(overrides: list[str]) -> None:
    """Each override parsed by Hydra's grammar first: a malformed one is no model's error (it was
    reported against the first model composed, \"config error (dlinear)\")."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for item in overrides:
        try:
            parser.parse_overrides([item])
        except (HydraException, OmegaConfBaseException) as exc:
            raise _fail("config error: ", one_line_error(exc, with_type=False), EXIT_USER_ERROR) from None


def _compose(names, shared, own, folder: Path, out_dir: Path) -> dict:
    from hydra.errors import HydraException

    from foxhunt.config.schema import ConfigError
    from foxhunt.training.parts import measuring_config

    configs = {}
    for name in names:
        try:
            configs[name] = measuring_config(name, [*shared, *own[name]], root_dir=folder, output_dir=out_dir)
        except (HydraException, OmegaConfBaseException, ConfigError) as exc:
            raise _fail(f"config error ({name}): ", one_line_error(exc, with_type=False), EXIT_USER_ERROR) from None
    return configs


def _budget(configs: dict):
    from hydra.utils import instantiate

    budgets = {name: OmegaConf.to_container(cfg.budget, resolve=True) for name, cfg in configs.items()}
    first_name, first = next(iter(budgets.items()))
    for name, budget in budgets.items():
        if budget != first:
            raise _fail(
                "",
                f"the budget differs between {first_name} and {name}: budget overrides apply to every model (no 'model:' prefix)",
                EXIT_USER_ERROR,
            )
    try:
        return instantiate(configs[first_name].budget)
    except Exception as exc:
        raise _fail("config error: ", one_line_error(exc, with_type=False), EXIT_USER_ERROR) from None


def _run(configs: dict, budget, predict: bool, as_json: bool, out_dir: Path, overrides: list[str]) -> int:
    from foxhunt.memory import card_report
    from foxhunt.memory.card import judge
    from foxhunt.memory.predict import predict_footprint
    from foxhunt.memory.training_run import (
        MeasurementError,
        data_description,
        measure_run,
    )
    from foxhunt.training.memory_plan import plan_activation_checkpointing
    from foxhunt.training.parts import MEASURING_RUNS

    first = next(iter(configs.values()))
    precision = "+".join(sorted({str(cfg.precision.name) for cfg in configs.values()}))
    run = _tracked_run(first, precision, budget, list(configs), overrides)
    measurements, predictions = [], {}
    with run if run is not None else contextlib.nullcontext():
        for name, cfg in configs.items():
            try:
                cfg, choice = plan_activation_checkpointing(cfg)  # decided as foxhunt-train decides it
                if choice is not None:
                    typer.echo(f"{name}: {choice.line}", err=True)
                if predict:
                    predictions[name] = predict_footprint(cfg, MEASURING_RUNS, workdir=out_dir / name)
                    typer.echo(
                        f"{name}: predicted {predictions[name].total_mb:.2f} MB ({predictions[name].seconds:.1f} s)", err=True
                    )
                measured = measure_run(cfg, MEASURING_RUNS, workdir=out_dir / name)
                measurements.append(measured)
                typer.echo(
                    f"{name}: measured {measured.footprint_mb:.2f} MB ({measured.seconds:.1f} s, {measured.steps} steps on {measured.device})",
                    err=True,
                )
            except MeasurementError as exc:
                typer.echo(f"foxhunt memory validate: FAIL: {exc}", err=True)
                if run is not None:
                    run.set_tags({Tag.VERDICT: "FAIL", Tag.ERROR: str(exc)})
                return EXIT_FAIL
            except ValueError as exc:  # a value only the model or the data source rejects
                typer.echo(f"foxhunt memory validate: config error ({name}): {one_line_error(exc, with_type=False)}", err=True)
                if run is not None:
                    run.set_tags({Tag.VERDICT: "ERROR", Tag.ERROR: one_line_error(exc, with_type=False)})
                return EXIT_USER_ERROR
        verdict = judge(measurements, budget, data=data_description(first), predictions=predictions)
        extra = {"overrides": overrides, "models_measured": list(configs)}
        paths = card_report.write_all(verdict, out_dir, extra)
        if as_json:
            typer.echo(paths[1].read_text(), nl=False)
        else:
            typer.echo(card_report.render_text(verdict), nl=False)
        paths += _write_configs(configs, out_dir / "configs")
        if run is not None:
            _log(run, verdict, paths)
            typer.echo(f"MLflow: run {run.run_name} ({run.run_id}) in experiment {EXPERIMENT!r}, {run.tracking_uri}", err=True)
        typer.echo(f"report: {paths[0]}", err=True)
    return 0 if verdict.passed else EXIT_FAIL


def _tracked_run(cfg, precision: str, budget, names: list[str], overrides: list[str]):
    if not cfg.logger.enabled:
        return None
    from foxhunt.runs.tracked_run import TrackedRun

    return TrackedRun(
        tracking_uri=cfg.logger.tracking_uri,
        experiment=EXPERIMENT,
        artifact_location=cfg.logger.artifact_location,
        run_name=f"memory-validate-{precision}-{budget.name}",
        tags={Tag.COMMAND: "memory validate", Tag.PRECISION: precision, Tag.BUDGET: budget.name,
              Tag.MODELS: ",".join(names), Tag.OVERRIDES: " ".join(overrides)},
        source=SOURCE,
    )  # fmt: skip


def _write_configs(configs: dict, directory: Path) -> list[Path]:
    """Each model's resolved config as measured (``configs/<model>.yaml``)."""
    from foxhunt.config.schema import resolved_config

    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, cfg in configs.items():
        path = directory / f"{name}.yaml"
        path.write_text(OmegaConf.to_yaml(resolved_config(cfg)))
        paths.append(path)
    return paths


def _log(run, verdict, paths: list[Path]) -> None:
    metrics = {f"memory/{m.name}_mb": m.footprint_mb for m in verdict.models}
    metrics.update({f"memory/{m.name}_predicted_mb": m.prediction.total_mb for m in verdict.models if m.prediction is not None})
    metrics["memory/ensemble_mb"] = verdict.total_mb
    metrics["memory/headroom_mb"] = verdict.headroom_left_mb
    run.log_metrics(metrics)

    run.set_tags({Tag.VERDICT: "PASS" if verdict.passed else "FAIL", Tag.DEVICE: verdict.device,
                  Tag.SUMMARY: verdict.summary_line()})  # fmt: skip
    for path in paths:
        run.log_artifact(path, "configs" if path.parent.name == "configs" else None)


@memory_app.command()
def compare(
    overrides: list[str] = typer.Argument(
        None, help="Hydra overrides of conf/train.yaml, e.g. model=tft asset=nq; precision.<key>=... go to the int8 run."
    ),
    steps: int = typer.Option(30, min=1, help="Timed training steps per precision (medians over these)."),
    warmup: int = typer.Option(3, min=1, help="Optimizer steps per precision before timing (compiles, caches)."),
    latency_calls: int = typer.Option(200, min=1, help="Timed batch-1 inference calls per precision."),
    latency_warmup: int = typer.Option(20, min=0, help="Untimed inference calls per precision first."),
    root: Path | None = typer.Option(
        None, help="Project folder: mlruns/, data cache, outputs/ (default: $FOXHUNT_ROOT or the current folder)."
    ),
) -> None:
    """Train the same model in fp32 and int8 side by side; print memory, speed, latency, accuracy."""
    from foxhunt.config.schema import ConfigError
    from foxhunt.training.memory_compare import run_compare

    try:
        report = run_compare(list(overrides or []), steps, warmup, latency_calls, latency_warmup, root or root_dir())
    except ConfigError as exc:
        typer.echo(f"foxhunt memory compare: config error: {exc}", err=True)
        raise typer.Exit(EXIT_USER_ERROR) from None
    typer.echo(report.text())
