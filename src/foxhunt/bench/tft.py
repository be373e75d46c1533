"""Section 2: TFT training throughput and peak memory against pytorch-forecasting's.

Both models train on the same windows: the training split of the composed market dataset,
``seq_len`` past bars, ``horizon`` future bars, batch ``model.window.batch_size``, with the same
sizes (``conf/model/tft.yaml``: hidden 256, 4 heads, 3 LSTM layers, dropout, 9 quantiles) and
the same 16 inputs: 4 static reals, 8 known reals (past and future), 4 observed reals (past
only); pytorch-forecasting's ``TimeSeriesDataSet`` is built from the same arrays with no extra
inputs (no relative time index, target scales or encoder length) and no rescaling (identity
normalizer, no scalers: the features are already normalized), and its model is trained with
its ``QuantileLoss`` on the same quantiles and AdamW with the same learning rate and weight
decay. Its per-variable width ``hidden_continuous_size`` is set per row: ``hidden_size`` is the
TFT paper's architecture and foxhunt's (every variable embedded at the model width), smaller
values are pytorch-forecasting's lighter default.

Each side runs in a fresh Python process (``python -m foxhunt.bench.tft``), so its peak
resident set (``ru_maxrss``) is its own: a Lightning ``Trainer`` fits ``warmup_steps +
steps`` batches without logger, checkpoints or validation; samples/s is over the timed batches.
The processes of the two sides alternate, ``tft.repeats`` times. foxhunt runs once per entry
of ``tft.foxhunt_variants`` (name -> conf/train.yaml overrides): ``default`` is the TFT as
configured (activation checkpointing off: the default size meets its 500 MB target without it);
others show what a setting costs or saves, each against the same peer processes. Each row's note
says whether foxhunt's side recomputed activations (``model.module.activation_checkpointing``).
Both sides train on the settings' ``device`` (``cuda``: the GPU, the clock read after a
synchronize; the peak RSS rows are then the host process's memory, not the device's).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import warnings
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import current_rss_mb, median, paired_ratio, paired_ratios, peak_rss_mb, train_batch_timer
from foxhunt.bench.report import Row
from foxhunt.bench.settings import load_settings
from foxhunt.training.parts import build_datamodule, build_model

# Lazy imports: (b) pytorch_forecasting, the peer: the optional bench extra (foxhunt[bench]); without it its rows are skipped

FOXHUNT = "foxhunt"
PEER = "pytorch_forecasting"
TARGET_COLUMN = "target"
TIME_COLUMN = "time_idx"
GROUP_COLUMN = "series"
DEFAULT_VARIANT = "default"  # tft.foxhunt_variants entry of the TFT as configured


def peer_available() -> bool:
    try:
        import pytorch_forecasting  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------------- the two sides
def foxhunt_parts(cfg, dataset):
    datamodule = build_datamodule(cfg, dataset)
    return build_model(cfg), datamodule.train_dataloader()


def peer_frame(dataset, split: str = "train"):
    """The split as a long pandas frame: the 16 features, the target (the 1-bar log return
    scaled by ``target_scale``, as ForecastDataModule's), a time index and a series id."""
    arrays = dataset.splits[split]
    frame = pd.DataFrame(arrays.features, columns=list(dataset.feature_names))
    returns = np.zeros(len(arrays.close))
    returns[1:] = np.log(arrays.close[1:] / arrays.close[:-1]) / dataset.target_scale
    frame[TARGET_COLUMN] = returns.astype(np.float32)
    frame[TIME_COLUMN] = np.arange(len(frame))
    frame[GROUP_COLUMN] = dataset.asset.key
    return frame


def peer_parts(cfg, dataset, hidden_continuous_size: int):
    """pytorch-forecasting's TFT and its training loader at ``cfg``'s sizes (module docstring)."""
    from pytorch_forecasting import TemporalFusionTransformer, TimeSeriesDataSet
    from pytorch_forecasting.data.encoders import TorchNormalizer
    from pytorch_forecasting.metrics import QuantileLoss

    names = list(dataset.feature_names)
    groups = {key: [names[i] for i in idx] for key, idx in dataset.groups.items()}
    window, module = cfg.model.window, cfg.model.module
    reals = groups["static"] + groups["known"] + groups["observed"]
    series = TimeSeriesDataSet(
        peer_frame(dataset),
        time_idx=TIME_COLUMN,
        target=TARGET_COLUMN,
        group_ids=[GROUP_COLUMN],
        max_encoder_length=int(window.seq_len),
        min_encoder_length=int(window.seq_len),
        max_prediction_length=int(window.horizon),
        min_prediction_length=int(window.horizon),
        static_reals=groups["static"],
        time_varying_known_reals=groups["known"],
        time_varying_unknown_reals=groups["observed"],
        add_relative_time_idx=False,
        add_target_scales=False,
        add_encoder_length=False,
        target_normalizer=TorchNormalizer(method="identity", center=False),
        scalers={name: None for name in reals},
    )
    model = TemporalFusionTransformer.from_dataset(
        series,
        hidden_size=int(module.hidden_size),
        attention_head_size=int(module.num_heads),
        lstm_layers=int(module.lstm_layers),
        dropout=float(module.dropout),
        hidden_continuous_size=int(hidden_continuous_size),
        output_size=len(module.quantiles),
        loss=QuantileLoss(quantiles=list(module.quantiles)),
        learning_rate=float(module.learning_rate),
        optimizer="adamw",
        weight_decay=float(module.weight_decay),
        log_interval=-1,
    )
    loader = series.to_dataloader(train=True, batch_size=int(window.batch_size), num_workers=0)
    return model, loader


def worker(ctx: BenchContext, side: str, threads: int, hidden_continuous_size: int, overrides: list[str] | None = None) -> dict:
    """Fit one side in this process; its throughput and memory (run by the subprocess)."""
    torch.set_num_threads(int(threads))
    settings = ctx.settings.tft
    cfg = ctx.compose("tft", list(overrides or []))
    pl.seed_everything(cfg.seed, verbose=False)
    dataset = ctx.dataset(cfg)
    if side == FOXHUNT:
        model, loader = foxhunt_parts(cfg, dataset)
    else:
        model, loader = peer_parts(cfg, dataset, hidden_continuous_size)
    warmup, steps = int(settings.warmup_steps), int(settings.steps)
    device = str(ctx.settings.device)
    timer = train_batch_timer(warmup, device)
    rss_before = current_rss_mb()
    trainer = pl.Trainer(
        accelerator=device,
        devices=1,
        max_epochs=1,
        limit_train_batches=warmup + steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        callbacks=[timer],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        # Lightning's own plugin for both sides: the same autocast for foxhunt's TFT and the peer's
        precision=cfg.precision.trainer_precision,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train_dataloaders=loader)
    samples = steps * int(cfg.model.window.batch_size)
    timing = timer.clock.timing(work=samples)
    return {
        "side": side,
        "threads": int(threads),
        "hidden_continuous_size": int(hidden_continuous_size),
        "parameters": sum(p.numel() for p in model.parameters()),
        # as the model runs it (a config's auto is decided by a training run, not here: left undecided, it is off)
        "activation_checkpointing": any(getattr(m, "activation_checkpointing", False) is True for m in model.modules())
        if side == FOXHUNT
        else None,
        "samples_per_s": timing.rate,
        "samples_per_cpu_s": timing.cpu_rate,
        "rss_before_fit_mb": rss_before,
        "peak_rss_mb": peak_rss_mb(),
        "timed_steps": timer.timed,
    }


def run_worker(
    ctx: BenchContext, settings_file: Path, side: str, threads: int, hcs: int, overrides: list[str] | None = None
) -> dict:
    """One worker process; returns its JSON line."""
    command = [
        sys.executable,
        "-m",
        "foxhunt.bench.tft",
        "--settings",
        str(settings_file),
        "--root",
        str(ctx.root),
        "--side",
        side,
        "--threads",
        str(threads),
        "--hidden-continuous-size",
        str(hcs),
        *(f"--override={override}" for override in overrides or []),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"bench tft worker ({side}, {threads} threads) failed: {tail[0]}")
    return json.loads(lines[-1])


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    settings = ctx.settings
    goals = settings.goals
    if not peer_available():
        return [], ["pytorch-forecasting is not installed (pip install '.[bench]'): section skipped"]
    settings_file = ctx.work_dir / "bench_settings.yaml"
    settings_file.parent.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(OmegaConf.to_yaml(settings))
    hidden = int(ctx.compose("tft").model.module.hidden_size)
    rows: list[Row] = []
    sizes = [int(h) for h in settings.tft.peer_hidden_continuous_sizes]
    variants = {str(k): [str(o) for o in v] for k, v in settings.tft.foxhunt_variants.items()}
    if DEFAULT_VARIANT not in variants:
        raise ValueError(f"bench tft.foxhunt_variants must hold {DEFAULT_VARIANT!r} (the TFT as configured)")
    for threads in settings.threads:
        ctx.log(
            f"tft: foxhunt {sorted(variants)} vs pytorch-forecasting (hidden_continuous_size {sizes}) at "
            f"{threads} thread(s), {settings.tft.repeats} interleaved repeats"
        )
        fox: dict[str, list[dict]] = {name: [] for name in variants}
        peers: dict[int, list[dict]] = {hcs: [] for hcs in sizes}
        for _ in range(int(settings.tft.repeats)):
            for name, overrides in variants.items():
                fox[name].append(run_worker(ctx, settings_file, FOXHUNT, int(threads), sizes[0], overrides))
            for hcs in sizes:
                peers[hcs].append(run_worker(ctx, settings_file, PEER, int(threads), hcs))
        for name, overrides in variants.items():
            prefix = "" if name == DEFAULT_VARIANT else f"[foxhunt {' '.join(overrides) or name}] "
            for hcs, peer in peers.items():
                same = hcs == hidden
                label = "same architecture" if same else "its lighter per-variable width"
                variant = f"pytorch-forecasting, hidden_continuous_size {hcs} ({label})"
                speed_goal = goals.tft_speed_vs_peer if same else goals.tft_speed_vs_peer_own_width
                rows += _rows(int(threads), variant, fox[name], peer, float(speed_goal), float(goals.tft_memory_vs_peer),
                              float(settings.confidence), prefix)  # fmt: skip
    return rows, []


def _rows(threads: int, variant: str, fox: list[dict], peer: list[dict], speed_goal: float, memory_goal: float,
          confidence: float, prefix: str = "") -> list[Row]:  # fmt: skip
    def values(runs: list[dict], key: str) -> list[float]:
        return [r[key] for r in runs]

    def grown(runs: list[dict]) -> list[float]:
        return [r["peak_rss_mb"] - r["rss_before_fit_mb"] for r in runs]

    return [
        Row.paired(
            paired_ratios(values(fox, "samples_per_s"), values(peer, "samples_per_s"), confidence),
            section="tft",
            name=f"{prefix}samples/s vs {variant}",
            threads=threads,
            unit="samples/s",
            foxhunt=median(values(fox, "samples_per_s")),
            reference=median(values(peer, "samples_per_s")),
            goal_op=">=",
            goal=speed_goal,
            cpu_figure=paired_ratio(values(fox, "samples_per_cpu_s"), values(peer, "samples_per_cpu_s")),
            note=(
                f"parameters: foxhunt {fox[0]['parameters']:,}, pytorch-forecasting {peer[0]['parameters']:,}; "
                f"foxhunt activation checkpointing {_switch(fox)}"
            ),
            samples={"foxhunt": fox, "peer": peer},
        ),
        Row.paired(
            paired_ratios(values(fox, "peak_rss_mb"), values(peer, "peak_rss_mb"), confidence),
            section="tft",
            name=f"{prefix}peak RSS vs {variant}",
            threads=threads,
            unit="MB",
            foxhunt=median(values(fox, "peak_rss_mb")),
            reference=median(values(peer, "peak_rss_mb")),
            goal_op="<=",
            goal=memory_goal,
            note=(
                f"foxhunt activation checkpointing {_switch(fox)}; "
                f"growth during training (peak - RSS before fit): foxhunt {median(grown(fox)):.0f} MB, "
                f"pytorch-forecasting {median(grown(peer)):.0f} MB, ratio {paired_ratio(grown(fox), grown(peer)):.2f}"
            ),
        ),
    ]


def _switch(fox: list[dict]) -> str:
    """on or off, as foxhunt's workers ran (``unknown`` for results written before they said)."""
    states = {run.get("activation_checkpointing") for run in fox}
    if states == {True}:
        return "on"
    return "off" if states == {False} else "unknown"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="one side of the TFT benchmark (run by foxhunt.bench.tft)")
    parser.add_argument("--settings", required=True)
    parser.add_argument("--root", required=True)
    parser.add_argument("--side", choices=(FOXHUNT, PEER), required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--hidden-continuous-size", type=int, required=True)
    parser.add_argument("--override", action="append", default=[], help="conf/train.yaml override (foxhunt side)")
    args = parser.parse_args(argv)
    ctx = BenchContext(settings=load_settings(args.settings), root=Path(args.root), log=lambda *_: None)
    result = worker(ctx, args.side, args.threads, args.hidden_continuous_size, args.override)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
