"""Section ``fleet``: per-bar latency of the streaming fleet, each member beside its floor.

The four seed-size models (freshly initialized: latency does not depend on the weights' values)
are wrapped as fleet members (:mod:`foxhunt.ensemble.members`, runtime chosen by measurement as
``foxhunt ensemble replay`` does) and the bars of the validation split are streamed through one
:class:`~foxhunt.ensemble.engine.StreamingEngine` with every member, bar by bar
(:func:`foxhunt.ensemble.replay.replay_bars`, the bars before the split priming the features).
Timed with ``time.perf_counter_ns``: each member's step on every bar (input normalization
included) and the whole bar (features, every member, the rule). In the same run, the floors:

- DQN, PPO: the member's network alone, as plain numpy at batch 1 (``NumpyMLP`` on one
  observation, timed in a loop): what no runtime can beat by much at batch 1;
- TFT: the full 50-bar recompute of the same decision (``forward`` on the window at batch 1),
  against which the member's reuse of per-bar encodings is judged;
- Mamba-2: the goal is absolute (``goals.latency_us.mamba2_step``).

Capacity: the same four members in fp32 and as int8 inference copies, each measured as
``foxhunt ensemble validate`` measures a registered one (:func:`foxhunt.ensemble.footprint.measure_member`:
tensors + runtime copies + streaming state + one step's peak, after ``fleet.capacity_warm_bars``
bars), and how many whole fleets fit the budget's available memory in each (from the measured
per-fleet footprint: instances share nothing); the row is the int8 / fp32 ratio.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import torch_threads
from foxhunt.bench.report import Row

FAMILIES = ("dqn", "ppo", "mamba2", "tft")


def _members(ctx: BenchContext, settings):
    from foxhunt.build import build_model
    from foxhunt.ensemble.engine import MemberInputs
    from foxhunt.ensemble.members import make_member

    members, inputs, modules, cfg, dataset = [], {}, {}, None, None
    for family in FAMILIES:
        cfg = ctx.compose(family)
        dataset = ctx.dataset(cfg)
        torch.manual_seed(int(cfg.seed))
        module = build_model(cfg).eval()
        modules[family] = module
        members.append(make_member(family, family, module, "fp32", None, "auto", int(settings.probe_calls), dataset.groups))
        inputs[family] = MemberInputs(dataset.feature_config, dataset.observed_mean, dataset.observed_std, dataset.groups)
    return members, inputs, modules, cfg, dataset


def _loop_us(call, calls: int) -> np.ndarray:
    times = np.empty(calls)
    for i in range(calls):
        started = time.perf_counter_ns()
        call()
        times[i] = (time.perf_counter_ns() - started) / 1e3
    return times


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    from hydra.utils import instantiate

    from foxhunt.build import build_datamodule
    from foxhunt.ensemble.engine import StreamingEngine
    from foxhunt.ensemble.replay import replay_bars
    from foxhunt.ensemble.runtimes import NumpyMLP

    settings = ctx.settings.fleet
    goals = ctx.settings.goals
    members, inputs, modules, cfg, dataset = _members(ctx, settings)
    asset = instantiate(cfg.asset)
    bars = instantiate(cfg.data.source).load(asset)
    stamps = dataset.splits["val"].timestamps.astype("datetime64[ns]").astype(np.int64)
    stop = int(stamps[min(len(stamps) - 1, int(settings.bars))]) + 1
    rows: list[Row] = []
    notes = [f"{m.name}: runtime {m.runtime_note}" for m in members]
    for threads in ctx.settings.threads:
        with torch_threads(int(threads)):
            ctx.log(f"fleet: {settings.bars} bars at {threads} thread(s)")
            engine = StreamingEngine(members, inputs, asset, rule="majority")
            record = replay_bars(engine, bars, start_ns=int(stamps[0]), stop_ns=stop)
            window = build_datamodule(cfg, dataset).input_windows("val")
            batch = {k: window[k][-1:].clone() for k in ("static", "known", "observed")}
            with torch.inference_mode():
                tft_full = _loop_us(lambda: modules["tft"](batch), int(settings.floor_calls_tft))
            obs = np.zeros(modules["dqn"].obs_dim, np.float32)
            floors = {f: _loop_us(lambda net=NumpyMLP(modules[f].acting_network): net(obs), int(settings.floor_calls))
                      for f in ("dqn", "ppo")}  # fmt: skip
        skip = int(settings.skip_bars)
        for name in FAMILIES:
            values = record.member_ns[name][skip:] / 1e3
            values = values[values > 0]
            for pct in (50, 99):
                value = float(np.percentile(values, pct))
                if name in floors:
                    floor = float(np.percentile(floors[name], pct))
                    rows.append(Row("fleet", f"{name} member p{pct} / numpy floor", int(threads), "us", value, floor,
                                    value / floor, "ratio", "<=", float(goals.fleet.agent_vs_floor),
                                    note=f"numpy floor = the network alone at batch 1 ({floor:.1f} us)"))  # fmt: skip
                elif name == "tft":
                    full = float(np.percentile(tft_full, pct))
                    rows.append(Row("fleet", f"tft per new bar p{pct} / full recompute", int(threads), "us", value, full,
                                    value / full, "ratio", "<=", float(goals.fleet.tft_vs_full),
                                    note=f"full recompute = forward on the 50-bar window ({full / 1e3:.2f} ms)"))  # fmt: skip
                    rows.append(Row("fleet", f"tft per new bar p{pct}", int(threads), "us", value, None, value, "value",
                                    "<=" if pct == 50 else None, float(goals.fleet.tft_p50_us) if pct == 50 else None))  # fmt: skip
                else:
                    rows.append(Row("fleet", f"{name} step p{pct}", int(threads), "us", value, None, value, "value",
                                    "<=" if pct == 50 else None, float(goals.latency_us.mamba2_step) if pct == 50 else None,
                                    note=f"runtime {next(m.runtime for m in members if m.name == name)}"))  # fmt: skip
        whole = record.total_ns[skip:] / 1e3
        whole = whole[whole > 0]
        for pct in (50, 99):
            rows.append(Row("fleet", f"whole fleet per bar p{pct}", int(threads), "us", float(np.percentile(whole, pct)),
                            None, float(np.percentile(whole, pct)), "value", "<=" if pct == 99 else None,
                            float(goals.fleet.fleet_p99_us) if pct == 99 else None,
                            note="features + 4 members + rule"))  # fmt: skip
    rows.append(_capacity_row(ctx, modules, inputs, bars, asset, cfg, settings))
    return rows, notes


def _capacity_row(ctx: BenchContext, modules, inputs, bars, asset, cfg, settings) -> Row:
    """Whole fleets that fit the budget in int8 over fp32 (module doc)."""
    from hydra.utils import instantiate

    from foxhunt.ensemble.fleet import int8_policy
    from foxhunt.ensemble.footprint import (
        LoadDelta,
        capacity,
        measure_member,
        member_bars,
    )
    from foxhunt.ensemble.members import make_member
    from foxhunt.precision.inference import int8_inference_model

    budget = instantiate(cfg.budget)
    available = budget.available_mb * 1024 * 1024
    totals = {}
    with torch_threads(1):
        for weights in ("fp32", "int8"):
            total = 0
            for family in FAMILIES:
                module = modules[family] if weights == "fp32" else int8_inference_model(modules[family], int8_policy()).eval()
                member = make_member(family, family, module, weights, None, "auto", int(settings.probe_calls), inputs[family].groups)
                warm = member_bars(bars, asset, inputs[family], int(settings.capacity_warm_bars))
                total += measure_member(member, weights, warm, int(settings.probe_calls), LoadDelta(None, None, None)).footprint_bytes
            totals[weights] = total
    counts = {w: capacity(available, t) for w, t in totals.items()}
    ratio = counts["int8"] / counts["fp32"] if counts["fp32"] else float("nan")
    ctx.log(f"fleet capacity in {budget.available_mb:.0f} MB: fp32 {counts['fp32']}, int8 {counts['int8']}")
    return Row("fleet", f"capacity int8 / fp32 (whole fleets in {budget.name} {budget.available_mb:.0f} MB)", 1, "fleets",
               float(counts["int8"]), float(counts["fp32"]), ratio, "ratio", None, None,
               note=f"fleet footprint fp32 {totals['fp32'] / 2**20:.1f} MB, int8 {totals['int8'] / 2**20:.1f} MB "
                    "(tensors + runtime copies + state + step peak, seed-size models)")  # fmt: skip
