"""One replay of a bar source through the registered ensemble, as ``foxhunt ensemble replay`` runs it.

Load the ensemble, load the bars of the config's ``data`` group, pick the bars scored
(``ensemble.split``: one split of the dataset those bars make, the bars before it priming the
features; ``all``: every bar), stream them bar by bar (:func:`foxhunt.ensemble.replay.replay_bars`),
score every member and the ensemble with the shared backtest, and log an MLflow run (experiment
``ensemble.experiment``): params (members, versions, runs, rule, weights, runtime, data), metrics
``<member>/<metric>`` and ``ensemble/<metric>``, latencies ``latency/<member>_p50_us`` (p99,
and ``latency/ensemble_p50_us``: the whole bar), and the artifacts ``replay.md`` (the table),
``members.json`` (each member's version, run, metric and runtime) and ``equity_replay.png``. Every latency is ``time.perf_counter_ns`` around each member's step on
every bar of the replay (input normalization included), and around the whole bar for the ensemble
(feature update, every member, the rule), the first ``warmup_bars`` bars left out.

Each member's training run's figure of the split is printed beside the replay's only when the
replayed bars are that run's split (:func:`split_digest` equal to the SHA-256 the run recorded on
its dataset input of the split); on another data set the row says :data:`OTHER_BARS`.

With ``interpret`` (``foxhunt ensemble replay --interpret FOLDER``) the TFT member's mean
variable-selection weights and attention over the bars it decided on are written to ``FOLDER``
(:func:`foxhunt.evaluation.interpret.write_interpretation`: table and PNGs) and logged under the
replay run's ``interpretability/`` artifacts. They are computed after the replay, not during it
(the per-bar step and its timings stay as they are): the windows the member read are recomputed
(:func:`foxhunt.ensemble.replay.replayed_windows`), at most ``evaluation.interpret.max_windows``
spread over the replay, and run in batches through the version's own torch module (its
registered weights, fp32: the member's runtime, ONNX Runtime graphs or an int8 copy, exposes no
weights); the member's forecasts on those windows are checked against the replay's own.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from foxhunt.config.families import model_class
from foxhunt.config.schema import ConfigError, resolved_config
from foxhunt.data.features import FEATURE_NAMES
from foxhunt.ensemble.loading import ensemble_engine, load_ensemble
from foxhunt.ensemble.member_files import ARTIFACTS_DIR, MemberFiles
from foxhunt.ensemble.rebuild import rebuild_model
from foxhunt.ensemble.registry import download_version
from foxhunt.ensemble.replay import ENSEMBLE, latency_us, replay_bars, replayed_windows, score_replay
from foxhunt.evaluation.backtest import evaluation_annualization
from foxhunt.evaluation.interpret import INTERPRET_DIR, SelectionNames, write_interpretation
from foxhunt.evaluation.plots import plot_equities
from foxhunt.models.forecaster import forecast_signal
from foxhunt.runs.store import RunStore
from foxhunt.runs.tracked_run import TrackedRun
from foxhunt.training.parts import build_dataset
from foxhunt.training.provenance import data_provenance

SOURCE = "foxhunt ensemble replay"  # the runs table's Source column
REPORT_FILE = "replay.md"
MEMBERS_FILE = "members.json"  # each member's version, run, metric and runtime
OTHER_BARS = "other bars"  # a member's run was tested on another data set: its figure is no comparison
UNKNOWN_BARS = "bars unknown"  # a member's run recorded no digest of the split's bars (an older run)
EQUITY_FILE = "equity_replay.png"


def interprets(family: str) -> bool:
    """Whether family ``family``'s model can say what its inputs weighed on a window
    (``interpret_windows``: the TFT's variable selections and attention)."""
    return hasattr(model_class(family), "interpret_windows")


@dataclass
class ReplayReport:
    text: str
    metrics: dict[str, float]
    run_id: str | None


def scored_window(cfg, asset, bars) -> tuple[int | None, int | None, str]:
    """(start_ns, stop_ns, description) of the bars scored; never the lockbox
    (``evaluation.holdout``: ``all`` stops before it)."""
    return _scored(cfg, asset, bars)[:3]


def _scored(cfg, asset, bars, source=None) -> tuple[int | None, int | None, str, object]:
    """:func:`scored_window` and the dataset the split is of (None: every bar, no dataset built)."""
    split = str(cfg.ensemble.split)
    if split == "all" and not cfg.evaluation.get("holdout"):
        return None, None, f"all {len(bars)} bars", None
    dataset = build_dataset(cfg, asset, source)
    if split == "all":
        last = max(int(arrays.timestamps[-1].astype("datetime64[ns]").astype(np.int64)) for arrays in dataset.splits.values())
        kept = int(np.searchsorted(bars.index.as_unit("ns").asi8, last, side="right"))
        return (None, last + 1, f"the first {kept} of {len(bars)} bars (the lockbox after them stays closed: evaluation.holdout)",
                dataset)  # fmt: skip
    stamps = dataset.splits[split].timestamps.astype("datetime64[ns]").astype(np.int64)
    return (
        int(stamps[0]),
        int(stamps[-1]) + 1,
        f"the {split} split ({len(stamps)} bars; the {int(np.searchsorted(bars.index.as_unit('ns').asi8, stamps[0]))} bars before it prime the features)",
        dataset,
    )


def split_digest(cfg, asset, source, dataset, split: str) -> str | None:
    """The SHA-256 of the replayed split's bars, as a training run records its own splits'
    (:func:`foxhunt.training.provenance.data_provenance`, the one owner of that digest); None for
    ``all`` (no split)."""
    if dataset is None or split not in dataset.splits:
        return None
    return str(data_provenance(cfg, SimpleNamespace(dataset=dataset, source=source, asset=asset))["splits"][split])


def run_replay(cfg, workdir: Path, interpret: Path | None = None) -> ReplayReport:
    if interpret is not None and not any(interprets(str(m)) for m in cfg.ensemble.models):
        raise ConfigError(f"--interpret {interpret}: no member of the ensemble can say what its inputs weighed (ensemble.models="
                          f"[{','.join(str(m) for m in cfg.ensemble.models)}]; the TFT's selection and attention are written)")  # fmt: skip
    asset = instantiate(cfg.asset)
    members = load_ensemble(cfg, workdir)
    for member in members:  # the bars a member's run kept in its lockbox stay closed here too
        if (member.holdout or None) != (cfg.evaluation.get("holdout") or None):
            raise ConfigError(f"evaluation.holdout={cfg.evaluation.get('holdout')}: {member.name} was trained keeping "
                              f"evaluation.holdout={member.holdout}; replay with the same, so its lockbox stays closed")  # fmt: skip
    source = instantiate(cfg.data.source)
    if str(cfg.data.source.get("adjust", "none")) == "ratio":
        raise ConfigError(
            "data.source.adjust=ratio: a replay streams bars as a live feed sends them, on the tick grid; "
            "ratio-adjusted prices are off it (use adjust=difference or none)"
        )
    bars = source.load(asset)
    engine = ensemble_engine(members, asset, cfg, origin=f"{cfg.data.source._target_.rsplit('.', 1)[-1]} bars of {asset.key}")
    start, stop, window, dataset = _scored(cfg, asset, bars, source)
    with _progress(f"replay {asset.key}") as progress:
        replayed = replay_bars(engine, bars, start_ns=start, stop_ns=stop, progress=progress)

    results = score_replay(replayed, asset, float(cfg.execution.commission_usd), float(cfg.execution.slippage_ticks),
                           evaluation_annualization(asset, cfg.evaluation).bars_per_year)  # fmt: skip
    skip = int(cfg.data.features.volume_bars) if start is None else 0
    latency = {f.member.name: latency_us(replayed.member_ns[f.member.name], skip) for f in members}
    latency[ENSEMBLE] = latency_us(replayed.total_ns, replayed.warm_bars)

    lines = [f"replay of {window} through {len(members)} member(s), rule {cfg.ensemble.rule}, weights {cfg.ensemble.weights}, "
             f"costs {cfg.execution.commission_usd} USD + {cfg.execution.slippage_ticks} ticks per contract per side"]  # fmt: skip
    split = str(cfg.ensemble.split)
    # the split's bars hashed only where a training run's figure may be shown beside the replay's
    shown = split in ("val", "test") and cfg.logger.enabled
    trained = _trained_figures(cfg, members, split, split_digest(cfg, asset, source, dataset, split)) if shown else {}
    header = (f"{'member':<22} {'version':>7} {'pnl USD':>11} {'sharpe':>8} {'run ' + split + ' sharpe [steps]':>25} {'max dd USD':>11} "
              f"{'hit rate':>8} {'trades':>7} {'p50 us':>9} {'p99 us':>9}")  # fmt: skip
    lines.append(header)
    metrics: dict[str, float] = {}
    for name in [*(f.member.name for f in members), ENSEMBLE]:
        m = results[name].metrics
        version = next((f.version for f in members if f.member.name == name), "")
        lat = latency[name]
        label = name if name != ENSEMBLE else f"{ENSEMBLE} (whole bar)"
        run = trained.get(name)
        run_text = "-" if run is None else run if isinstance(run, str) else f"{run[0]:.3f} [{run[1]:,.0f}]"
        lines.append(
            f"{label:<22} {version:>7} {m['pnl']:>11,.0f} {m['sharpe']:>8.3f} {run_text:>25} "
            f"{m['max_drawdown']:>11,.0f} {m['hit_rate']:>8.3f} {m['trades']:>7d} {lat['p50']:>9.1f} {lat['p99']:>9.1f}"
        )
        key = ENSEMBLE if name == ENSEMBLE else name
        metrics.update({f"{key}/{k}": float(v) for k, v in m.items()})
    for name, lat in latency.items():
        metrics.update({f"latency/{name}_p50_us": lat["p50"], f"latency/{name}_p99_us": lat["p99"]})
    lines.append("latency: time.perf_counter_ns per bar; a member's step includes its input normalization, the ensemble's "
                 "(whole bar) the feature update, every member and the rule")  # fmt: skip
    lines.append(f"run {split} sharpe [steps]: what the member's training run logged for this split, over that many steps "
                 f"(the replay's: {len(replayed.close) - 1:,}), shown only where the replay's bars are that run's {split} bars "
                 "(the SHA-256 of the split's bars it recorded); on the same bars and costs the replay reproduces it (a run "
                 "scored with evaluation.max_bars saw only the split's first bars; '-': a split its run did not score)")  # fmt: skip
    if OTHER_BARS in trained.values():
        lines.append(f"{OTHER_BARS}: the replay's {split} split is another data set than the one the member's run was scored on "
                     "(other bars: another source, file, seed, span or lockbox); its figure is no comparison and is not shown")  # fmt: skip
    if UNKNOWN_BARS in trained.values():
        lines.append(f"{UNKNOWN_BARS}: the member's run recorded no digest of its {split} bars (an older run); its figure is not "
                     "shown, as the bars cannot be told the same")  # fmt: skip
    for f in members:
        lines.append(
            f"  {f.member.name}: run {f.run_id}, {f.metric}={f.value:.6g}, trained {f.precision}, runtime {f.member.runtime_note}"
        )
    interpreted: list[Path] = []
    if interpret is not None:
        for f in members:
            if interprets(f.member.family):
                line, paths = _interpret_member(cfg, f, asset, bars, start, stop, replayed, window, Path(interpret), workdir)
                lines.append(line)
                interpreted += paths
    text = "\n".join(lines)

    run_id = None
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / REPORT_FILE).write_text(text + "\n")
    png = None
    if cfg.ensemble.plot_equity and len(replayed.close) > 1:
        png = plot_equities(results, replayed.timestamps, out_dir / EQUITY_FILE, title=f"ensemble replay, {asset.key}, {window}",
                            highlight=ENSEMBLE)  # fmt: skip
    if cfg.logger.enabled:
        run_id = _log(cfg, members, metrics, [out_dir / REPORT_FILE, *([png] if png else [])], window, interpreted)
        text += f"\nMLflow run {run_id} in experiment {cfg.ensemble.experiment}"
    return ReplayReport(text=text, metrics=metrics, run_id=run_id)


def _interpret_member(cfg, f, asset, bars, start: int | None, stop: int | None, replayed, window: str, folder: Path,
                      workdir: Path) -> tuple[str, list[Path]]:  # fmt: skip
    """The TFT member's selection weights and attention over the replayed bars, written to
    ``folder`` (module doc): the report's line and the files."""
    started = time.perf_counter()
    local, _ = download_version(str(cfg.logger.tracking_uri), f.name, None, int(f.version), workdir / f"{f.name}-interpret")
    files = MemberFiles.read(local / ARTIFACTS_DIR, f.name)
    model = rebuild_model(files.cfg, files.state, origin=f.name).to(str(cfg.ensemble.device)).eval()
    settings = cfg.evaluation.get("interpret")
    limit = None if settings is None else settings.max_windows
    windows, total = replayed_windows(f.inputs, asset, bars, model.seq_len, model.horizon, start, stop, limit,
                                      origin=f"{f.name} interpretability")  # fmt: skip
    decided = int(np.isfinite(replayed.signals[f.member.name]).sum())
    if decided != total:  # the recomputed windows are not those the member read: a bug, never a result
        raise RuntimeError(f"{f.name}: {total} windows recomputed, the replay decided on {decided} bars")
    names = SelectionNames.of(files.manifest.get("feature_names", FEATURE_NAMES), f.inputs.groups)
    forecasts: list = []  # the same passes' forecasts: the member's signals, to check the windows by
    result = model.interpret_windows(windows, int(files.cfg.model.window.eval_batch_size), names, source=f"replay, {window}",
                                     total_windows=total, forecasts=forecasts)  # fmt: skip
    signals = np.concatenate([forecast_signal(fc, model.median_index).numpy() for fc in forecasts]) if forecasts else np.zeros(0)
    mismatch = float(np.max(np.abs(signals - replayed.signals[f.member.name][windows["bar_index"]]), initial=0.0))
    paths = write_interpretation(result, folder, title=f"{f.name} v{f.version} replay")
    seconds = time.perf_counter() - started
    line = (f"  {f.name}: {result.summary_line()}; written to {folder} (its registered weights in torch, fp32, "
            f"after the replay: {seconds:.1f} s; forecasts on these windows within {mismatch:.1e} of the replay's)")  # fmt: skip
    return line, paths


def _trained_figures(cfg, members, split: str, bars_digest: str | None) -> dict[str, tuple[float, float] | str]:
    """Each member's training run's ``<split>/sharpe`` and ``<split>/steps`` (the run its weights
    are from) where that run's ``split`` bars are the replay's (``bars_digest``: the SHA-256 the run
    recorded on its dataset input of that split, :mod:`foxhunt.training.provenance`); else
    :data:`OTHER_BARS`, or :data:`UNKNOWN_BARS` for a run that recorded none."""
    store = RunStore(str(cfg.logger.tracking_uri))
    found: dict[str, tuple[float, float] | str] = {}
    for f in members:
        try:
            metrics = store.get(f.run_id).metric_values()
            recorded = store.recorded_split_digests(f.run_id).get(split)
        except Exception:  # noqa: BLE001 (a run gone from the store: the column shows '-')
            continue
        if f"{split}/sharpe" not in metrics:
            continue
        if not recorded:
            found[f.member.name] = UNKNOWN_BARS
        elif recorded != bars_digest:
            found[f.member.name] = OTHER_BARS
        else:
            found[f.member.name] = (float(metrics[f"{split}/sharpe"]), float(metrics.get(f"{split}/steps", float("nan"))))
    return found


@contextlib.contextmanager
def _progress(what: str):
    """A rich progress bar with the rate (bars/s) on stderr; a no-op when stderr is no terminal."""
    if not sys.stderr.isatty():
        yield None
        return

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("[progress.data.speed]{task.fields[rate]}"),
                  TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:  # fmt: skip
        task = bar.add_task(what, total=None, rate="")
        started = time.perf_counter()

        def update(done: int, total: int) -> None:
            elapsed = time.perf_counter() - started
            bar.update(task, completed=done, total=total, rate=f"{done / elapsed:,.0f} bars/s" if elapsed > 0 else "")

        yield update


def _log(cfg, members, metrics: dict[str, float], artifacts: list[Path], window: str, interpreted: Sequence[Path] = ()) -> str:
    tags = {"asset": str(cfg.asset.key), "rule": str(cfg.ensemble.rule), "weights": str(cfg.ensemble.weights),
            "members": ",".join(f.member.name for f in members), "bars": window}  # fmt: skip
    described = {
        f.member.family: {"name": f.name, "version": f.version, "run_id": f.run_id, "metric": f.metric, "value": f.value,
                          "trained": f.precision, "runtime": f.member.runtime_note}
        for f in members
    }  # fmt: skip
    members_file = Path(artifacts[0]).parent / MEMBERS_FILE
    members_file.write_text(json.dumps(described, indent=1))
    resolved = resolved_config(cfg)
    with TrackedRun(str(cfg.logger.tracking_uri), str(cfg.ensemble.experiment), cfg.logger.artifact_location,
                    f"replay-{cfg.asset.key}-{cfg.ensemble.rule}", tags, source=SOURCE) as run:  # fmt: skip
        run.log_config(resolved, OmegaConf.to_yaml(resolved))
        run.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)})
        for path in [*artifacts, members_file]:
            run.log_artifact(path)
        if interpreted:
            for path in interpreted:
                run.log_artifact(path, INTERPRET_DIR)
    return run.run_id
