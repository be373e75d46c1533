"""Section 3: batch-1 CPU inference latency of the four models, fp32 and int8, p50 and p99.

What is timed, per call, under ``torch.inference_mode`` on a module in eval mode built from its
default config (``conf/model/<name>.yaml``; latency does not depend on the weights' values, so the
modules are freshly initialized rather than trained):

- ``dqn``, ``ppo``: ``greedy_action(obs)`` for one observation (16 features + position): the
  network and the argmax, the decision an agent takes per bar;
- ``mamba2``: ``forward`` on one window (seq_len bars), and ``mamba2_step``: ``step`` on one
  new bar with the streaming state (the O(1) per-bar path of live trading);
- ``tft``: ``forward`` on one window (seq_len past bars, horizon future calendar bars).

Each call is timed twice: wall clock (the figure judged) and the process's CPU time (the
``cpu`` column: what the call costs when no other process takes the core; at 1 thread the two
differ only by the time the process waited). Targets listed in ``latency.compiled`` are also
timed through ``torch.compile``.

int8: a deep copy of the module quantized with torchao's ``quantize_`` (int8 weights, one scale
per row, fp32 activations: ``Int8WeightOnlyConfig``; ``--set latency.int8=dynamic`` picks
``Int8DynamicActivationInt8WeightConfig``), which converts the ``nn.Linear`` layers; LSTM and
convolution weights stay fp32. The fp32 and int8 modules are timed in alternating blocks so a
slow spell of the machine hits both. Each call is timed with ``time.perf_counter_ns``; p50 and
p99 are over all timed calls.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torchao.quantization as quantization

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import torch_threads
from foxhunt.bench.report import Row
from foxhunt.errors import one_line_error
from foxhunt.training.parts import build_datamodule, build_model
from foxhunt.training.side_by_side import measure

TARGETS = ("dqn", "ppo", "mamba2_step", "mamba2", "tft")
GOAL_KEYS = {"dqn": "dqn", "ppo": "ppo", "mamba2_step": "mamba2_step", "tft": "tft"}
COMPILE_ERROR_WIDTH = 240  # characters of a torch.compile failure kept in the report's notes
INT8_CONFIGS = {"weight_only": "Int8WeightOnlyConfig", "dynamic": "Int8DynamicActivationInt8WeightConfig"}


def int8_copy(module: torch.nn.Module, kind: str) -> torch.nn.Module:
    """A deep copy of ``module`` whose ``nn.Linear`` weights are int8 (torchao ``quantize_``)."""
    if kind not in INT8_CONFIGS:
        raise ValueError(f"latency.int8={kind!r}: use one of {sorted(INT8_CONFIGS)}")
    quantized = copy.deepcopy(module).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantization.quantize_(quantized, getattr(quantization, INT8_CONFIGS[kind])())
    return quantized


def window_batch(cfg, dataset) -> dict[str, torch.Tensor]:
    """The first validation window as a batch of one (static, known, observed)."""
    windows = build_datamodule(cfg, dataset).windows("val")
    return {key: windows[key][:1].clone() for key in ("static", "known", "observed")}


def call_for(target: str, module: Any, cfg, dataset) -> Callable[[], object]:
    """The batch-1 inference call of ``target`` on ``module`` (the family's model: its methods by ``target``)."""
    if target in ("dqn", "ppo"):
        features = torch.from_numpy(dataset.splits["val"].features[:1]).float()
        obs = torch.cat([features, torch.zeros(1, 1)], dim=1)  # flat position
        return lambda: module.greedy_action(obs)
    batch = window_batch(cfg, dataset)
    if target == "mamba2_step":
        features = module.bar_features(batch)  # (1, seq_len, input_dim)
        state = module.allocate_inference_state(1)
        for t in range(features.shape[1] - 1):  # the stream up to the last bar
            _, state = module.step(features[:, t], state)
        last = features[:, -1]
        return lambda: module.step(last, state)
    return lambda: module(batch)


def compiled(call: Callable[[], object]) -> Callable[[], object]:
    """``call`` through ``torch.compile`` (inductor: fused C++ kernels on CPU, with its C++
    wrapper, which calls them without a Python frame per kernel: about a third less latency for
    the Mamba-2 step here); the compilation happens on the first call, in the warm-up."""
    return torch.compile(call, dynamic=False, options={"cpp_wrapper": True})


def build_target(ctx: BenchContext, target: str):
    name = "mamba2" if target == "mamba2_step" else target
    cfg = ctx.compose(name)
    dataset = ctx.dataset(cfg)
    torch.manual_seed(int(cfg.seed))
    module = build_model(cfg).eval()
    return cfg, dataset, module


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    settings = ctx.settings.latency
    goals = ctx.settings.goals.latency_us
    kind = str(settings.int8)
    rows: list[Row] = []
    notes = [
        f"int8 = torchao quantize_ with {INT8_CONFIGS[kind]} on a copy of the module (nn.Linear weights; "
        "LSTM and conv weights stay fp32)",
    ]
    compile_targets = set(settings.compiled)
    if compile_targets:
        notes.append(
            "compiled = the same call through torch.compile(dynamic=False, options={'cpp_wrapper': True}) "
            "(inductor: fused C++ kernels), compiled in the warm-up: the deployment path for the per-bar step"
        )
    for target in TARGETS:
        cfg, dataset, module = build_target(ctx, target)
        quantized = int8_copy(module, kind)
        calls = {
            "fp32": call_for(target, module, cfg, dataset),
            "int8": call_for(target, quantized, cfg, dataset),
        }
        if target in compile_targets:
            calls["fp32 compiled"] = compiled(call_for(target, module, cfg, dataset))
        goal = goals.get(GOAL_KEYS.get(target, ""), None)
        for threads in ctx.settings.threads:
            ctx.log(f"latency: {target} at {threads} thread(s)")
            with torch_threads(int(threads)):
                try:
                    lat = measure(
                        calls, int(settings.warmup), int(settings.iterations), int(settings.blocks), float(settings.max_seconds)
                    )
                except Exception as exc:  # a compiler failure must not lose the eager figures
                    if "fp32 compiled" not in calls:
                        raise
                    notes.append(f"{target}: torch.compile failed ({one_line_error(exc, limit=COMPILE_ERROR_WIDTH)})")
                    calls.pop("fp32 compiled")
                    lat = measure(
                        calls, int(settings.warmup), int(settings.iterations), int(settings.blocks), float(settings.max_seconds)
                    )
            for variant, (wall, cpu) in lat.items():
                for pct in (50, 99):
                    value = float(np.percentile(wall, pct))
                    note = ""
                    if variant != "fp32":
                        note = f"{variant} / fp32 p{pct}: {value / float(np.percentile(lat['fp32'][0], pct)):.2f}x"
                    rows.append(
                        Row(
                            section="latency",
                            name=f"{target} {variant} p{pct}",
                            threads=int(threads),
                            unit="us",
                            foxhunt=value,
                            reference=None,
                            figure=value,
                            figure_kind="value",
                            goal_op="<=" if goal is not None else None,
                            goal=float(goal) if goal is not None else None,
                            cpu_figure=float(np.percentile(cpu, pct)),
                            note=note,
                            samples={"calls": len(wall)},
                        )
                    )
    return rows, notes
