"""Section 4: framework overhead, an epoch through ``foxhunt-train`` against a plain PyTorch loop.

foxhunt side: :func:`foxhunt.training.cell.train` on the composed config of ``overhead.model`` with
everything ``foxhunt-train`` runs (Lightning, the default callbacks, the MLflow logger into
the benchmark's own store), one epoch of ``overhead.train_batches`` training and
``overhead.val_batches`` validation batches. An extra callback, :class:`EpochTimer` (added to
the config as ``callbacks.bench_timer``; it only reads two clocks per hook), times the epoch from
``on_train_epoch_start`` to ``on_train_epoch_end``: the training batches, the validation, the
checkpoints written on validation end and the metrics logged to MLflow.

Plain side: the same model (built from the same config and seed), the same datamodule and
batches, the same optimizer (``configure_optimizers``): a loop of forward, quantile loss,
backward and step over the same training batches, the same validation batches without
gradients, and one ``torch.save`` of the weights.

The figure is the median over interleaved repeats of foxhunt's epoch time / the plain loop's.
Each callback's share is measured by running ``train`` without it (``~callbacks.<name>``, and
``logger=none`` for MLflow) and dividing the epoch time it saves by the plain epoch's.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from pathlib import Path
from typing import ClassVar

import lightning.pytorch as pl
import torch

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import Clock, Timing, interleaved, median, paired_ratio, paired_ratios, torch_threads
from foxhunt.bench.report import Row
from foxhunt.models.forecaster import quantile_loss
from foxhunt.training.cell import train
from foxhunt.training.parts import build_datamodule, build_model

TIMER_KEY = "bench_timer"
_run_ids = itertools.count()


class EpochTimer(pl.Callback):
    """Wall and CPU time of each training epoch (validation included) and of its training
    batches alone; the latest instance is ``EpochTimer.latest``."""

    latest: ClassVar[EpochTimer | None] = None

    def __init__(self) -> None:
        self.epoch = Clock()
        self.batches = Clock()
        self.train_batches = 0
        EpochTimer.latest = self

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.epoch.start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == 0:
            self.batches.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.train_batches += 1
        if batch_idx + 1 == trainer.num_training_batches:
            self.batches.stop()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.epoch.stop()


def overhead_config(ctx: BenchContext, drop: str | None = None):
    """The config of one foxhunt epoch (``drop``: a callback name removed, or ``logger``)."""
    s = ctx.settings.overhead
    overrides = [
        *s.train_overrides,
        "trainer.max_epochs=1",
        f"trainer.limit_train_batches={int(s.train_batches)}",
        f"trainer.limit_val_batches={int(s.val_batches)}",
        f"+callbacks.{TIMER_KEY}._target_={EpochTimer.__module__}.{EpochTimer.__qualname__}",
    ]
    if drop and drop != "logger":
        overrides.append(f"~callbacks.{drop}")
    run_dir = ctx.work_dir / "outputs" / "overhead" / f"run{next(_run_ids)}"
    return ctx.compose(str(s.model), overrides, logger="none" if drop == "logger" else "mlflow", output_dir=run_dir)


def foxhunt_epoch(ctx: BenchContext, drop: str | None = None) -> Timing:
    """One ``train(cfg)`` run; the timing of its epoch (``extra``: batches only, whole run)."""
    cfg = overhead_config(ctx, drop)
    log_path = Path(cfg.paths.output_dir) / "train.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    run = Clock()
    run.start()
    # the run's console output (model summary, progress bar, test summary) goes to a file
    with warnings.catch_warnings(), open(log_path, "w") as log_file:
        warnings.simplefilter("ignore")
        with contextlib.redirect_stdout(log_file), contextlib.redirect_stderr(log_file):
            train(cfg)
    run.stop()
    timer = EpochTimer.latest
    if timer is None or timer.train_batches != int(ctx.settings.overhead.train_batches):
        raise RuntimeError("bench overhead: the epoch timer did not see the expected training batches")
    return Timing(
        work=1.0,
        wall_s=timer.epoch.wall_s,
        cpu_s=timer.epoch.cpu_s,
        extra={"batches_wall_s": timer.batches.wall_s, "batches_cpu_s": timer.batches.cpu_s, "run_wall_s": run.wall_s},
    )


def plain_epoch(ctx: BenchContext) -> Timing:
    """The same epoch as a plain PyTorch loop (see the module docstring)."""
    s = ctx.settings.overhead
    cfg = ctx.compose(str(s.model), [*s.train_overrides, "trainer.max_epochs=1"])
    pl.seed_everything(cfg.seed, verbose=False)
    dataset = ctx.dataset(cfg)
    datamodule = build_datamodule(cfg, dataset)
    model = build_model(cfg)
    optimizer = model.configure_optimizers()
    levels = model.quantile_levels
    out = ctx.work_dir / "outputs" / "overhead" / "plain.pt"
    out.parent.mkdir(parents=True, exist_ok=True)
    epoch, batches = Clock(), Clock()
    epoch.start()
    model.train()
    batches.start()
    for batch in itertools.islice(datamodule.train_dataloader(), int(s.train_batches)):
        loss = quantile_loss(model(batch), batch["target"], levels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    batches.stop()
    model.eval()
    with torch.no_grad():
        for batch in itertools.islice(datamodule.val_dataloader(), int(s.val_batches)):
            quantile_loss(model(batch), batch["target"], levels)
    torch.save(model.state_dict(), out)
    epoch.stop()
    return Timing(
        work=1.0, wall_s=epoch.wall_s, cpu_s=epoch.cpu_s, extra={"batches_wall_s": batches.wall_s, "batches_cpu_s": batches.cpu_s}
    )


def projected_ratio(
    fox_epoch: float, plain_epoch: float, fox_batches: float, plain_batches: float, measured: int, target: int
) -> tuple[float, float]:
    """(foxhunt, plain) epoch seconds at ``target`` training batches from an epoch of
    ``measured``: the per-batch time of each side times ``target``, plus what the epoch spent
    outside its training batches (per-epoch costs do not grow with the batches)."""
    fox = fox_batches / measured * target + (fox_epoch - fox_batches)
    plain = plain_batches / measured * target + (plain_epoch - plain_batches)
    return fox, plain


def callback_names(ctx: BenchContext) -> list[str]:
    cfg = ctx.compose(str(ctx.settings.overhead.model))
    return [name for name in cfg.callbacks if name != TIMER_KEY]


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    settings = ctx.settings
    s = settings.overhead
    goal = float(settings.goals.overhead)
    rows: list[Row] = []
    notes = [
        f"model {s.model}: {int(s.train_batches)} training + {int(s.val_batches)} validation batches per epoch; "
        "foxhunt = foxhunt.training.cell.train(cfg) with the default callbacks and the MLflow logger; the run's "
        "setup, test and backtest are outside the epoch (their total is in benchmark.json, run_wall_s)",
        "share rows: foxhunt = the epoch with everything, reference = the epoch without that callback (or "
        "logger), one run each against the median of the full runs: indicative only",
    ]
    runners = {"foxhunt": lambda: foxhunt_epoch(ctx), "plain": lambda: plain_epoch(ctx)}
    for threads in settings.threads:
        with torch_threads(int(threads)):
            if int(s.warmup_runs) > 0:
                ctx.log(f"overhead: warm-up runs at {threads} thread(s)")
                interleaved(runners, int(s.warmup_runs))  # first MLflow store, caches, lazy imports
            ctx.log(f"overhead: {s.model} epoch at {threads} thread(s), {s.repeats} interleaved repeats")
            results = interleaved(runners, int(s.repeats))
            fox = [t.wall_s for t in results["foxhunt"]]
            plain = [t.wall_s for t in results["plain"]]
            samples = {side: [t.to_dict() for t in timings] for side, timings in results.items()}
            rows.append(
                Row.paired(
                    paired_ratios(fox, plain, float(ctx.settings.confidence)),
                    section="overhead",
                    name=f"{s.model} epoch: foxhunt-train / plain loop",
                    threads=int(threads),
                    unit="s",
                    foxhunt=median(fox),
                    reference=median(plain),
                    goal_op="<=",
                    goal=goal,
                    cpu_figure=paired_ratio([t.cpu_s for t in results["foxhunt"]], [t.cpu_s for t in results["plain"]]),
                    samples=samples,
                )
            )
            fox_b = [t.extra["batches_wall_s"] for t in results["foxhunt"]]
            plain_b = [t.extra["batches_wall_s"] for t in results["plain"]]
            rows.append(
                Row.paired(
                    paired_ratios(fox_b, plain_b, float(ctx.settings.confidence)),
                    section="overhead",
                    name=f"{s.model} training batches only: foxhunt-train / plain loop",
                    threads=int(threads),
                    unit="s",
                    foxhunt=median(fox_b),
                    reference=median(plain_b),
                    goal_op=None,
                    goal=None,
                    cpu_figure=paired_ratio(
                        [t.extra["batches_cpu_s"] for t in results["foxhunt"]],
                        [t.extra["batches_cpu_s"] for t in results["plain"]],
                    ),
                )
            )
            projected = projected_ratio(
                median(fox), median(plain), median(fox_b), median(plain_b), int(s.train_batches), int(s.projected_batches)
            )
            rows.append(
                Row(
                    section="overhead",
                    name=f"{s.model} epoch of {int(s.projected_batches)} batches (projected): foxhunt-train / plain loop",
                    threads=int(threads),
                    unit="s",
                    foxhunt=projected[0],
                    reference=projected[1],
                    figure=projected[0] / projected[1],
                    figure_kind="ratio",
                    goal_op="<=",
                    goal=goal,
                    note=(
                        f"not measured: the measured per-batch times and the per-epoch rest (validation, "
                        f"checkpoints, MLflow writes, first-step memory meters) scaled to "
                        f"{int(s.projected_batches)} training batches"
                    ),
                )
            )
            if int(threads) not in [int(t) for t in s.callback_threads] or int(s.callback_repeats) < 1:
                continue
            ctx.log(f"overhead: each callback's share at {threads} thread(s)")
            for drop in [*callback_names(ctx), "logger"]:
                without = interleaved({"without": lambda: foxhunt_epoch(ctx, drop)}, int(s.callback_repeats))["without"]
                # against the interleaved full runs above: (with - without) / plain, medians
                added = median(fox) - median([t.wall_s for t in without])
                label = "the MLflow logger" if drop == "logger" else f"callback {drop}"
                rows.append(
                    Row(
                        section="overhead",
                        name=f"share of {label}: epoch time it adds / plain epoch",
                        threads=int(threads),
                        unit="s",
                        foxhunt=median(fox),
                        reference=median([t.wall_s for t in without]),
                        figure=added / median(plain) if median(plain) else float("nan"),
                        figure_kind="ratio",
                        goal_op=None,
                        goal=None,
                        samples={"without": [t.to_dict() for t in without]},
                    )
                )
    return rows, notes
