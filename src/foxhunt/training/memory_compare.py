"""The harness of ``foxhunt memory compare``: one model in fp32 and in int8, side by side, in one process.

Both runs are built from the same composed config as ``foxhunt-train`` would build them
(``conf/train.yaml`` + the overrides + ``precision=fp32`` / ``precision=int8``), with the same
initial weights (the config's seed before each model is built), and trained by two real
Lightning Trainers that carry the run's precision plugin, its precision callback and the memory-budget callback.
What is printed, and how each figure is measured:

- **memory per component** (parameters, gradients, optimizer state, activations, other =
  buffers + model-owned state, temporaries, total): the memory-budget callback's breakdown of
  each run (:mod:`foxhunt.memory.accounting`: live tensor storages; activations = peak bytes
  saved for backward during the first training step that updates the weights; temporaries =
  what the allocator held beyond those at its peak, the backward pass's scratch); fp32 MB,
  int8 MB, reduction MB and %;
- **training step time**: wall time from ``on_train_batch_start`` to ``on_train_batch_end`` of
  every step that ran an optimizer step (forward, backward, optimizer), median over
  ``--steps`` steps after ``--warmup`` such steps (the first compiles the 8-bit optimizer update);
  the two Trainers run in two threads that take turns step by step, so the precisions
  alternate and share the machine's state (a busy neighbour slows both alike); throughput =
  samples per step / median step time (the harness: :mod:`foxhunt.training.side_by_side`);
- **inference latency**: batch 1 (one window or one observation), eval mode, no gradients;
  fp32 = the fp32-trained model, int8 = an int8 inference copy of the int8-trained model
  (:func:`foxhunt.precision.inference.int8_inference_model`, the policy's
  ``inference_weights``); p50 and p99 over ``--latency-calls`` calls after
  ``--latency-warmup``, alternating the two models call by call;
- **accuracy**: the model's own validation metric (``model.monitor.metric``) of each run after
  the same training steps (the global RNG is reseeded identically before every step, so both
  runs see the same batches, dropout masks and samples).

With ``logger.enabled`` (the default config), the figures go to an MLflow run
``<model>-<asset>-compare`` of the project's store, with the report (text and JSON), each
run's memory report and ``quantized_layers.txt`` as artifacts. Written by hand because no
library compares two Lightning runs step by step; the measuring itself is foxhunt.memory's and
:mod:`foxhunt.training.side_by_side`'s. A product command's harness that fits two runs: it lives
in the training room (memory and precision know no model; training never imports the benchmark).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hydra.utils import instantiate

from foxhunt.config.compose import compose_config
from foxhunt.config.schema import ConfigError, validate
from foxhunt.memory.accounting import to_mb
from foxhunt.memory.callback import MemoryBudgetCallback
from foxhunt.models.forecaster import INPUT_KEYS
from foxhunt.precision.callback import PrecisionCallback
from foxhunt.precision.inference import int8_inference_model
from foxhunt.precision.plugin import precision_plugin
from foxhunt.precision.quantize import QUANTIZED_LAYERS_FILE, int8_share
from foxhunt.runs.tags import Tag
from foxhunt.runs.tracked_run import TrackedRun
from foxhunt.training.parts import build_datamodule, build_dataset, build_model
from foxhunt.training.side_by_side import StepTimer, Turns, alternating_latency, fit_side_by_side, percentile

PRECISIONS = ("fp32", "int8")
COMPONENTS = (
    ("parameters", "params"),
    ("gradients", "grads"),
    ("optimizer state", "optimizer"),
    ("activations", "activations"),
    ("other", None),
    ("temporaries", "temporaries"),
    ("total", None),
)
BAR_WIDTH = 40
REPORT_TEXT = "compare_report.txt"
REPORT_JSON = "compare_report.json"
P90 = 90  # the step-time percentile reported beside the median
SOURCE = "foxhunt memory compare"  # the runs table's Source column


@dataclass
class ComponentRow:
    name: str
    fp32_mb: float
    int8_mb: float

    @property
    def reduction_mb(self) -> float:
        return self.fp32_mb - self.int8_mb

    @property
    def reduction_pct(self) -> float:
        return 100.0 * self.reduction_mb / self.fp32_mb if self.fp32_mb else 0.0


@dataclass
class CompareReport:
    """Everything ``foxhunt memory compare`` prints (fields per precision: ``{"fp32": .., "int8": ..}``)."""

    model: str
    asset: str
    device: str
    steps: int
    warmup: int
    components: list[ComponentRow]
    params_optimizer_pct: float  # int8 (parameters + optimizer state) as % of fp32
    step_ms: dict[str, float]  # median training step time
    step_ms_p90: dict[str, float]
    throughput: dict[str, float]  # samples per second
    sample_unit: str
    step_time_ratio: float  # int8 / fp32 median step time
    latency_p50_ms: dict[str, float]
    latency_p99_ms: dict[str, float]
    inference_config: str
    accuracy_metric: str
    accuracy: dict[str, float]
    int8_tensors: int
    int8_elements_pct: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["components"] = [
            {**asdict(row), "reduction_mb": row.reduction_mb, "reduction_pct": row.reduction_pct} for row in self.components
        ]
        return data

    def metrics(self) -> dict[str, float]:
        """Flat MLflow metrics: ``compare/<what>/<precision>`` and the ratios."""
        out: dict[str, float] = {
            "compare/params_optimizer_pct": self.params_optimizer_pct,
            "compare/step_time_ratio": self.step_time_ratio,
        }
        for row in self.components:
            key = row.name.replace(" ", "_")
            out[f"compare/{key}_mb/fp32"] = row.fp32_mb
            out[f"compare/{key}_mb/int8"] = row.int8_mb
            out[f"compare/{key}_reduction_pct"] = row.reduction_pct
        for name, values in (
            ("step_ms", self.step_ms), ("throughput", self.throughput), ("latency_p50_ms", self.latency_p50_ms),
            ("latency_p99_ms", self.latency_p99_ms), ("accuracy", self.accuracy),
        ):  # fmt: skip
            for precision, value in values.items():
                if value is not None and math.isfinite(value):
                    out[f"compare/{name}/{precision}"] = value
        return out

    def text(self) -> str:
        return format_report(self)


def run_compare(
    overrides: list[str],
    steps: int,
    warmup: int,
    latency_calls: int,
    latency_warmup: int,
    root: Path,
    output_dir: Path | None = None,
) -> CompareReport:
    """Measure and return the comparison (see the module doc); logs it to MLflow when enabled."""
    for item in overrides:
        if item.split("=", 1)[0].lstrip("+~") == "precision":
            raise ConfigError(f"{item}: the compare command sets precision itself (fp32 and int8)")
    root = Path(root).resolve()
    out = Path(output_dir) if output_dir is not None else root / "outputs" / "compare"
    shared = [item for item in overrides if not item.lstrip("+~").startswith("precision.")]
    int8_only = [item for item in overrides if item not in shared]  # precision.<key>: the int8 policy's
    configs = {}
    for precision in PRECISIONS:
        own = [f"precision={precision}", *(int8_only if precision == "int8" else [])]
        cfg = compose_config([*shared, *own], root_dir=root, output_dir=str(out / precision))
        validate(cfg)
        configs[precision] = cfg
    measured = _measure(configs, steps, warmup, latency_calls, latency_warmup, out)
    report = measured.report
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_TEXT).write_text(report.text())
    (out / REPORT_JSON).write_text(json.dumps(report.to_json(), indent=2))
    cfg = configs["int8"]
    if cfg.logger.enabled:
        _log_mlflow(cfg, report, out, measured.artifacts)
    return report


# -- measuring ------------------------------------------------------------------------------------
@dataclass
class _Measured:
    report: CompareReport
    artifacts: list[Path]


def _measure(configs, steps: int, warmup: int, latency_calls: int, latency_warmup: int, out: Path) -> _Measured:
    cfg = configs["fp32"]
    asset = instantiate(cfg.asset)
    dataset = build_dataset(cfg, asset)
    turns = Turns(PRECISIONS)
    runs: dict[str, dict[str, Any]] = {}
    for precision, run_cfg in configs.items():
        policy = instantiate(run_cfg.precision)
        plugin = precision_plugin(policy, run_cfg.trainer.get("accelerator", "auto"))
        pl.seed_everything(run_cfg.seed, verbose=False)
        model = build_model(run_cfg)
        run_dir = out / precision
        run_dir.mkdir(parents=True, exist_ok=True)
        callbacks = {
            "precision": PrecisionCallback(report_dir=run_dir),
            "memory": MemoryBudgetCallback(budget=None, target_mb=None, sample_every_n_steps=_NEVER, report_dir=run_dir),
            "timer": StepTimer(precision, turns, int(run_cfg.seed), warmup, steps),
        }
        trainer = instantiate(
            run_cfg.trainer,
            callbacks=list(callbacks.values()),
            logger=False,
            plugins=[plugin],
            default_root_dir=str(run_dir),
            max_epochs=-1,
            max_steps=_NEVER,
            limit_val_batches=0,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        runs[precision] = {
            "cfg": run_cfg, "policy": policy, "plugin": plugin, "model": model, "callbacks": callbacks, "trainer": trainer,
            "datamodule": build_datamodule(run_cfg, dataset),
        }  # fmt: skip

    def fit(run: dict[str, Any]):
        return lambda: run["trainer"].fit(run["model"], datamodule=run["datamodule"])

    errors = fit_side_by_side({p: fit(runs[p]) for p in PRECISIONS})
    for precision, run in runs.items():
        if precision in errors:
            raise RuntimeError(f"memory compare: the {precision} run failed: {errors[precision]}") from errors[precision]
        timer = run["callbacks"]["timer"]
        if len(timer.durations) < steps:
            raise RuntimeError(
                f"memory compare: the {precision} run timed {len(timer.durations)} of {steps} steps "
                f"({timer.updates} optimizer steps in {timer.batches} batches): raise trainer.limit_train_batches "
                "or lower --steps"
            )

    accuracy = {p: _validate(run, configs[p]) for p, run in runs.items()}
    latency = _latency(runs, latency_calls, latency_warmup)
    breakdowns = {p: run["callbacks"]["memory"].breakdown for p, run in runs.items()}
    rows = [ComponentRow(label, *(_component_mb(breakdowns[p], key, label) for p in PRECISIONS)) for label, key in COMPONENTS]
    fp32, int8 = breakdowns["fp32"], breakdowns["int8"]
    params_opt_pct = 100.0 * (int8.params_bytes + int8.optimizer_bytes) / max(fp32.params_bytes + fp32.optimizer_bytes, 1)
    step_ms = {p: 1e3 * statistics.median(runs[p]["callbacks"]["timer"].durations) for p in PRECISIONS}
    step_p90 = {p: 1e3 * percentile(runs[p]["callbacks"]["timer"].durations, P90) for p in PRECISIONS}
    samples, unit = _samples_per_step(cfg)
    count, share = int8_share(runs["int8"]["plugin"].plan)
    policy8 = runs["int8"]["policy"]
    device = str(runs["fp32"]["model"].device)
    report = CompareReport(
        model=str(cfg.model.name),
        asset=str(cfg.asset.key),
        device=device,
        steps=steps,
        warmup=warmup,
        components=rows,
        params_optimizer_pct=params_opt_pct,
        step_ms=step_ms,
        step_ms_p90=step_p90,
        throughput={p: samples / (step_ms[p] / 1e3) for p in PRECISIONS},
        sample_unit=unit,
        step_time_ratio=step_ms["int8"] / step_ms["fp32"],
        latency_p50_ms={p: latency[p][0] for p in PRECISIONS},
        latency_p99_ms={p: latency[p][1] for p in PRECISIONS},
        inference_config=str(policy8.inference_weights),
        accuracy_metric=str(cfg.model.monitor.metric),
        accuracy=accuracy,
        int8_tensors=count,
        int8_elements_pct=share,
        notes=[
            f"int8 = {policy8.weights} weights ({count} tensors, {share:.1f}% of parameter elements) + "
            f"{policy8.optimizer_states} optimizer states (block {policy8.optimizer_block_size}); "
            f"optimizer step {'compiled' if policy8.compile_optimizer else 'eager'}",
        ],
    )
    artifacts = [
        path
        for p in PRECISIONS
        for path in (
            out / p / QUANTIZED_LAYERS_FILE,
            *(runs[p]["callbacks"]["memory"].report_paths or ()),
        )
        if path.is_file()
    ]
    return _Measured(report=report, artifacts=artifacts)


_NEVER = 10**9  # "no limit" for step counts the timer ends itself


def _component_mb(breakdown, key: str | None, label: str) -> float:
    if label == "total":
        return breakdown.total_training_mb
    if key is None:  # other
        return to_mb(breakdown.buffers_bytes + breakdown.model_state_bytes)
    return to_mb(getattr(breakdown, f"{key}_bytes"))


def _validate(run: dict[str, Any], cfg) -> float:
    """The run's validation metric after its training steps (a fresh Trainer, the config's
    ``limit_val_batches``, the same precision plugin and callback)."""
    trainer = instantiate(
        cfg.trainer,
        callbacks=[run["callbacks"]["precision"]],
        logger=False,
        plugins=[run["plugin"]],
        default_root_dir=str(run["trainer"].default_root_dir),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    results = trainer.validate(run["model"], datamodule=run["datamodule"], verbose=False)
    metric = str(cfg.model.monitor.metric)
    return float(results[0][metric]) if results and metric in results[0] else float("nan")


def _example_input(run: dict[str, Any]):
    """Batch 1 as the model's forward takes it: one validation window, or one observation."""
    model, datamodule = run["model"], run["datamodule"]
    if hasattr(datamodule, "windows"):
        windows = datamodule.windows("val")
        return {key: torch.as_tensor(windows[key][:1]).to(model.device) for key in INPUT_KEYS}
    features = torch.as_tensor(datamodule.dataset.splits["val"].features[:1], dtype=torch.float32)
    flat = torch.zeros(1, 1)  # holding no position
    return torch.cat([features, flat], dim=1).to(model.device)


def _latency(runs: dict[str, dict[str, Any]], calls: int, warmup: int) -> dict[str, tuple[float, float]]:
    """(p50, p99) ms of batch-1 eval forwards: the fp32-trained model, and an int8 inference
    copy of the int8-trained one, alternating call by call."""
    models = {
        "fp32": runs["fp32"]["model"].eval(),
        "int8": int8_inference_model(runs["int8"]["model"], runs["int8"]["policy"]),
    }
    inputs = {p: _example_input(runs[p]) for p in PRECISIONS}
    return alternating_latency({p: _call(models[p], inputs[p]) for p in PRECISIONS}, calls, warmup)


def _call(model, batch):
    return lambda: model(batch)


def _samples_per_step(cfg) -> tuple[int, str]:
    """Samples one training step learns from: windows (forecasters), env steps (agents)."""
    if cfg.model.kind == "forecaster":
        return int(cfg.model.window.batch_size), "windows"
    module = cfg.model.module
    rollout = int(module.get("rollout_steps", 1))
    return int(cfg.model.env.num_envs) * rollout, "env steps"


# -- the report ------------------------------------------------------------------------------------
def _bar(value: float, scale: float) -> str:
    filled = 0 if scale <= 0 else round(BAR_WIDTH * value / scale)
    return "#" * filled + "." * (BAR_WIDTH - filled)


def format_report(report: CompareReport) -> str:
    lines = [
        f"foxhunt memory compare: {report.model} on {report.asset}, fp32 vs int8, device {report.device}",
        "",
        f"{'component':<16}{'fp32 MB':>11}{'int8 MB':>11}{'reduction MB':>14}{'reduction %':>13}",
    ]
    for row in report.components:
        lines.append(
            f"{row.name:<16}{row.fp32_mb:>11.2f}{row.int8_mb:>11.2f}{row.reduction_mb:>14.2f}{row.reduction_pct:>12.1f}%"
        )
    lines += [
        f"parameters + optimizer state: int8 = {report.params_optimizer_pct:.1f}% of fp32",
        "",
        f"{'':<28}{'fp32':>12}{'int8':>12}{'int8/fp32':>11}",
        _pair("training step, median ms", report.step_ms, ".1f"),
        _pair("training step, p90 ms", report.step_ms_p90, ".1f"),
        _pair(f"throughput, {report.sample_unit}/s", report.throughput, ".1f"),
        _pair("inference b=1, p50 ms", report.latency_p50_ms, ".3f"),
        _pair("inference b=1, p99 ms", report.latency_p99_ms, ".3f"),
        _pair(f"{report.accuracy_metric} (val)", report.accuracy, ".5f", ratio=False),
        "",
        f"step times: {report.steps} steps per precision after {report.warmup} warm-up optimizer steps, "
        "the two runs alternating step by step; inference: int8 = "
        f"{report.inference_config} copy of the int8-trained model; accuracy after the same steps "
        "on the same batches.",
        *report.notes,
        "",
        "memory, side by side (MB):",
    ]
    scale = max((max(r.fp32_mb, r.int8_mb) for r in report.components), default=0.0)
    for row in report.components:
        lines.append(f"  {row.name:<16} fp32 |{_bar(row.fp32_mb, scale)}| {row.fp32_mb:.2f}")
        lines.append(f"  {'':<16} int8 |{_bar(row.int8_mb, scale)}| {row.int8_mb:.2f}")
    return "\n".join(lines) + "\n"


def _pair(label: str, values: dict[str, float], fmt: str, ratio: bool = True) -> str:
    fp32, int8 = values["fp32"], values["int8"]
    rel = f"{int8 / fp32:>10.3f}x" if ratio and fp32 else f"{int8 - fp32:>+11.5f}"
    return f"{label:<28}{fp32:>12{fmt}}{int8:>12{fmt}}{rel}"


def _log_mlflow(cfg, report: CompareReport, out: Path, artifacts: list[Path]) -> None:
    run = TrackedRun(
        tracking_uri=cfg.logger.tracking_uri,
        experiment=cfg.logger.experiment,
        artifact_location=cfg.logger.artifact_location,
        run_name=f"{report.model}-{report.asset}-compare",
        tags={Tag.COMMAND: "memory compare", Tag.MODEL: report.model, Tag.ASSET: report.asset,
              Tag.PRECISION: "fp32-vs-int8"},
        source=SOURCE,
    )  # fmt: skip
    with run:
        run.log_metrics(report.metrics())
        run.log_artifact(out / REPORT_TEXT)
        run.log_artifact(out / REPORT_JSON)
        for path in artifacts:
            run.log_artifact(path, path.parent.name)
