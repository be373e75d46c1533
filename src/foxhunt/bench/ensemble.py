"""Section ``ensemble``: the streaming ensemble per bar, each member beside its floor, int8 against
fp32, many symbols at once, and the capacity.

The four default-size models (freshly initialized: latency does not depend on the weights' values)
are wrapped as ensemble members (:mod:`foxhunt.ensemble.members`, runtime chosen by measurement as
``foxhunt ensemble replay`` does) and the bars of the validation split are streamed through one
:class:`~foxhunt.ensemble.engine.StreamingEngine`, bar by bar (:func:`foxhunt.ensemble.replay.replay_bars`,
the bars before the split priming the features). Timed with ``time.perf_counter_ns``: each
member's step on every bar (input normalization included) and the whole bar (features, every
member, the rule). In the same run:

- floors: DQN, PPO: the member's network alone as plain numpy at batch 1 (two matrix products
  per layer on one observation, in a hot loop: no runtime beats it by much); TFT: the full
  50-bar recompute of the same decision (torch ``forward`` on the window at batch 1), against
  which the member's reuse of per-bar encodings is judged; Mamba-2: an absolute goal;
- int8: the same replay with every member's int8 weights (numba rows with scales for the agents
  and Mamba-2, ONNX Runtime's dynamic quantization for the TFT); each member's int8 / fp32 step
  at p50, and the share of bars whose positions agree;
- int8 variants (``ensemble.int8_variants``, 1 thread): the same member step with torch running
  torchao's weight-only int8 copy and PyTorch's dynamic quantization (``quantize_dynamic``:
  int8 GEMMs for ``nn.Linear`` and ``nn.LSTM``), beside foxhunt's own int8 runtime;
- many symbols: ``ensemble.symbols`` streams at once, every one warm, ``ensemble.rounds`` minutes of
  bars each stepped together (:meth:`~foxhunt.ensemble.engine.StreamingEngine.step_many`: one
  batched call per member): the p50 time of a minute and predictions per second (symbols per
  round / round time), the whole ensemble's and the TFT's alone (goal ``goals.ensemble.tft_predictions_per_s``);
- capacity: the members in fp32 and int8, each measured as ``foxhunt ensemble footprint`` does
  (:func:`foxhunt.ensemble.footprint.measure_member`: tensors + runtime weights + one stream's
  state + one step's peak), and how many whole ensembles fit the budget's available memory in each.
"""

from __future__ import annotations

import copy
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate

from foxhunt.bench.context import BenchContext
from foxhunt.bench.measure import torch_threads
from foxhunt.bench.report import Row
from foxhunt.ensemble.engine import MemberInputs, StreamingEngine
from foxhunt.ensemble.footprint import LoadDelta, capacity, measure_member, member_bars
from foxhunt.ensemble.members import make_member
from foxhunt.ensemble.replay import replay_bars
from foxhunt.ensemble.runtimes import NUMPY_ACTIVATIONS, mlp_layers
from foxhunt.errors import one_line_error
from foxhunt.training.parts import build_datamodule, build_model

SECTION = "ensemble"
FAMILIES = ("dqn", "ppo", "mamba2", "tft")
LINEAR_FAMILIES = FAMILIES  # every family has Linear (and the TFT LSTM) layers: int8 must pay for each


def _modules(ctx: BenchContext):
    modules, inputs, cfg, dataset = {}, {}, None, None
    for family in FAMILIES:
        cfg = ctx.compose(family)
        dataset = ctx.dataset(cfg)
        torch.manual_seed(int(cfg.seed))
        modules[family] = build_model(cfg).eval()
        inputs[family] = MemberInputs(dataset.feature_config, dataset.observed_mean, dataset.observed_std, dataset.groups)
    return modules, inputs, cfg, dataset


def _members(modules, inputs, weights: str, settings, workdir: Path, runtime: str = "auto", source=None):
    return [make_member(f, f, (source or modules)[f], weights, None, runtime, int(settings.probe_calls), inputs[f].groups,
                        workdir=workdir / weights, threads=torch.get_num_threads()) for f in FAMILIES]  # fmt: skip


def _loop_us(call, calls: int) -> np.ndarray:
    times = np.empty(calls)
    for i in range(calls):
        started = time.perf_counter_ns()
        call()
        times[i] = (time.perf_counter_ns() - started) / 1e3
    return times


def _numpy_floor(module) -> Callable[[], np.ndarray]:
    layers = mlp_layers(module.acting_network)
    obs = np.zeros(module.obs_dim, np.float32)

    def call():
        x = obs
        for w, b, act in layers:
            x = w @ x + b
            if act:
                x = NUMPY_ACTIVATIONS[act](x)
        return x

    return call


def _step_us(replayed, name: str, skip: int) -> np.ndarray:
    values = replayed.member_ns[name][skip:] / 1e3
    return values[values > 0]


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    settings = ctx.settings.ensemble
    goals = ctx.settings.goals
    modules, inputs, cfg, dataset = _modules(ctx)
    asset = instantiate(cfg.asset)
    bars = instantiate(cfg.data.source).load(asset)
    stamps = dataset.splits["val"].timestamps.astype("datetime64[ns]").astype(np.int64)
    stop = int(stamps[min(len(stamps) - 1, int(settings.bars))]) + 1
    skip = int(settings.skip_bars)
    rows: list[Row] = []
    notes: list[str] = []
    workdir = Path(tempfile.mkdtemp(prefix="foxhunt-bench-ensemble-"))
    for threads in ctx.settings.threads:
        with torch_threads(int(threads)):
            ctx.log(f"ensemble: {settings.bars} bars at {threads} thread(s), fp32 and int8")
            ensembles = {w: _members(modules, inputs, w, settings, workdir / f"t{threads}") for w in ("fp32", "int8")}
            notes += [f"{w} {m.name} ({threads} thr): runtime {m.runtime_note}" for w, ms in ensembles.items() for m in ms]
            replays = {w: replay_bars(StreamingEngine(ms, inputs, asset, rule="majority"), bars, start_ns=int(stamps[0]), stop_ns=stop)
                       for w, ms in ensembles.items()}  # fmt: skip
            window = build_datamodule(cfg, dataset).input_windows("val")
            batch = {k: window[k][-1:].clone() for k in ("static", "known", "observed")}
            with torch.inference_mode():
                tft_full = _loop_us(lambda: modules["tft"](batch), int(settings.floor_calls_tft))
            floors = {f: _loop_us(_numpy_floor(modules[f]), int(settings.floor_calls)) for f in ("dqn", "ppo")}
            rows += _per_bar_rows(replays["fp32"], floors, tft_full, ensembles["fp32"], int(threads), skip, goals)
            rows += _cold_floor_rows(ensembles["fp32"], modules, inputs, asset, bars, stamps, stop, replays["fp32"],
                                     int(threads), skip)  # fmt: skip
            rows += _int8_rows(replays, int(threads), skip)
            rows += _symbols_rows(ctx, ensembles["fp32"], inputs, asset, bars, settings, goals, int(threads))
    with torch_threads(1):
        if settings.int8_variants:
            rows += _variant_rows(ctx, modules, inputs, asset, bars, stamps, stop, settings, workdir, skip)
        rows.append(_capacity_row(ctx, modules, inputs, bars, asset, cfg, settings, workdir))
    return rows, notes


def _per_bar_rows(replayed, floors, tft_full, members, threads, skip, goals) -> list[Row]:
    rows = []
    for name in FAMILIES:
        values = _step_us(replayed, name, skip)
        runtime = next(m.runtime for m in members if m.name == name)
        for pct in (50, 99):
            value = float(np.percentile(values, pct))
            if name in floors:
                floor = float(np.percentile(floors[name], pct))
                rows.append(Row(SECTION, f"{name} member p{pct} / numpy floor", threads, "us", value, floor, value / floor,
                                "ratio", "<=", float(goals.ensemble.agent_vs_floor),
                                note=f"runtime {runtime}; numpy floor = the network alone at batch 1, hot ({floor:.1f} us)"))  # fmt: skip
            elif name == "tft":
                full = float(np.percentile(tft_full, pct))
                rows.append(Row(SECTION, f"tft per new bar p{pct} / full recompute", threads, "us", value, full, value / full,
                                "ratio", "<=", float(goals.ensemble.tft_vs_full),
                                note=f"runtime {runtime}; full recompute = torch forward on the 50-bar window ({full / 1e3:.2f} ms)"))  # fmt: skip
                rows.append(Row(SECTION, f"tft per new bar p{pct}", threads, "us", value, None, value, "value",
                                "<=" if pct == 50 else None, float(goals.ensemble.tft_p50_us) if pct == 50 else None,
                                note=f"runtime {runtime}"))  # fmt: skip
            else:
                rows.append(Row(SECTION, f"{name} step p{pct}", threads, "us", value, None, value, "value",
                                "<=" if pct == 50 else None, float(goals.latency_us.mamba2_step) if pct == 50 else None,
                                note=f"runtime {runtime}"))  # fmt: skip
    whole = replayed.total_ns[skip:] / 1e3
    whole = whole[whole > 0]
    for pct in (50, 99):
        value = float(np.percentile(whole, pct))
        rows.append(Row(SECTION, f"whole ensemble per bar p{pct}", threads, "us", value, None, value, "value",
                        "<=" if pct == 99 else None, float(goals.ensemble.per_bar_p99_us) if pct == 99 else None,
                        note="features + 4 members + rule"))  # fmt: skip
    return rows


def _cold_floor_rows(members, modules, inputs, asset, bars, stamps, stop, replayed, threads: int, skip: int) -> list[Row]:
    """The agents' numpy floor timed where the member runs, once per bar right after the whole
    ensemble's step (the other members' weights, the TFT's megabytes, have just passed through the
    caches): what the network alone costs in the ensemble, against the member's step there."""
    engine = StreamingEngine(members, inputs, asset, rule="majority")
    values = bars[["open", "high", "low", "close", "volume"]].to_numpy(np.float64)
    all_stamps = bars.index.as_unit("ns").asi8
    floors = {f: _numpy_floor(modules[f]) for f in ("dqn", "ppo")}
    cold: dict[str, list[float]] = {f: [] for f in floors}
    start = int(stamps[0])
    for ts, row in zip(all_stamps.tolist(), values.tolist()):
        if ts >= start:
            break
        engine.warm(ts, *row)  # the features only, as replay_bars primes them
    engine.reset_members()
    for ts, row in zip(all_stamps.tolist(), values.tolist()):
        if ts < start:
            continue
        if ts >= stop:
            break
        result = engine.step(ts, *row)
        if not result.warm:
            continue
        for family, call in floors.items():
            started = time.perf_counter_ns()
            call()
            cold[family].append((time.perf_counter_ns() - started) / 1e3)
    rows = []
    for family, times in cold.items():
        floor = float(np.median(times[skip:] or times))
        member = float(np.median(_step_us(replayed, family, skip)))
        rows.append(Row(SECTION, f"{family} member p50 / numpy floor in the ensemble", threads, "us", member, floor, member / floor,
                        "ratio", None, None,
                        note=f"floor timed once per bar right after the ensemble's step ({floor:.1f} us): the caches as the member finds them"))  # fmt: skip
    return rows


def _int8_rows(replays, threads: int, skip: int) -> list[Row]:
    rows = []
    fp32, int8 = replays["fp32"], replays["int8"]
    for name in LINEAR_FAMILIES:
        a, b = float(np.median(_step_us(fp32, name, skip))), float(np.median(_step_us(int8, name, skip)))
        agree = float(np.mean(fp32.positions[name] == int8.positions[name]))
        rows.append(Row(SECTION, f"{name} int8 / fp32 step p50", threads, "us", b, a, b / a, "ratio", "<=", 1.0,
                        note=f"positions agree on {100 * agree:.1f}% of {len(fp32.positions[name])} bars"))  # fmt: skip
    return rows


def _symbols_rows(ctx, members, inputs, asset, bars, settings, goals, threads: int) -> list[Row]:
    """Many symbols at once (module doc): the ensemble's and the TFT's predictions per second."""
    values = bars[["open", "high", "low", "close", "volume"]].to_numpy(np.float64)
    stamps = bars.index.as_unit("ns").asi8
    warm = int(settings.symbols_warm_bars)
    rounds = int(settings.rounds)
    rows = []
    tft = [m for m in members if m.family == "tft"]
    for group, chosen in ((SECTION, members), ("tft", tft)):
        for count in settings.symbols:
            engine = StreamingEngine(chosen, inputs, asset, rule="majority" if group == SECTION else "mean_forecast")
            streams = [engine.open_stream(f"S{k}") for k in range(int(count))]
            for i in range(warm):  # every stream warm: the TFT's window full
                engine.step_many([(s, (int(stamps[i]), *values[i])) for s in streams])
            times = []
            for i in range(warm, warm + rounds):
                started = time.perf_counter_ns()
                engine.step_many([(s, (int(stamps[i]), *values[i])) for s in streams])
                times.append(time.perf_counter_ns() - started)
            for stream in streams:
                engine.close_stream(stream)
            round_us = float(np.median(times)) / 1e3
            rate = int(count) / (round_us / 1e6)
            goal = float(goals.ensemble.tft_predictions_per_s) if group == "tft" else None
            ctx.log(f"ensemble: {group} {count} symbols: {round_us:.0f} us per minute, {rate:,.0f} predictions/s")
            rows.append(Row(SECTION, f"{group} {count} symbols: predictions/s", threads, "1/s", rate, None, rate, "value",
                            ">=" if goal else None, goal, note=f"a minute of {count} symbols stepped together: p50 {round_us:,.0f} us"))  # fmt: skip
    return rows


def _variant_rows(ctx, modules, inputs, asset, bars, stamps, stop, settings, workdir: Path, skip: int) -> list[Row]:
    """Each member's step with torchao's int8 copy and with PyTorch's dynamic quantization,
    beside foxhunt's int8 runtime and fp32 (all at 1 thread, the same bars)."""

    def dynamic(module):
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(module), {torch.nn.Linear, torch.nn.LSTM}, dtype=torch.qint8)

    variants = {
        "fp32 (chosen runtime)": lambda f: make_member(f, f, modules[f], "fp32", None, "auto", int(settings.probe_calls), inputs[f].groups, workdir=workdir / "v32"),
        "int8 foxhunt (numba / ONNX Runtime)": lambda f: make_member(f, f, modules[f], "int8", None, "auto", int(settings.probe_calls), inputs[f].groups, workdir=workdir / "v8"),
        "int8 torchao weight-only (torch)": lambda f: make_member(f, f, modules[f], "int8", None, "torch", 1, inputs[f].groups),
        "int8 torch quantize_dynamic (fbgemm)": lambda f: make_member(f, f, dynamic(modules[f]), "fp32", None, "torch", 1, inputs[f].groups),
    }  # fmt: skip
    rows: list[Row] = []
    base: dict[str, Any] = {}
    for variant, build in variants.items():
        for family in FAMILIES:
            try:
                member = build(family)
                replayed = replay_bars(StreamingEngine([member], inputs, asset, rule="majority"), bars,
                                     start_ns=int(stamps[0]), stop_ns=stop)  # fmt: skip
            except Exception as exc:  # noqa: BLE001 (a quantizer that cannot take this model: said, the others go on)
                rows.append(Row(SECTION, f"{family} step p50: {variant}", 1, "us", float("nan"), None, float("nan"), "value",
                                None, None, note=f"not run: {one_line_error(exc, limit=160)}"))  # fmt: skip
                continue
            value = float(np.median(_step_us(replayed, family, skip)))
            base.setdefault(family, value)
            rows.append(Row(SECTION, f"{family} step p50: {variant}", 1, "us", value, base[family], value / base[family],
                            "ratio", None, None, note=f"runtime {member.runtime}; / the fp32 member's p50"))  # fmt: skip
    return rows


def _capacity_row(ctx: BenchContext, modules, inputs, bars, asset, cfg, settings, workdir: Path) -> Row:
    """Whole ensembles that fit the budget in int8 over fp32 (module doc)."""
    budget = instantiate(cfg.budget)
    available = budget.available_mb * 1024 * 1024
    totals = {}
    for weights in ("fp32", "int8"):
        members = _members(modules, inputs, weights, settings, workdir / "capacity")
        totals[weights] = sum(
            measure_member(m, weights, member_bars(bars, asset, inputs[m.name], int(settings.capacity_warm_bars)),
                           int(settings.probe_calls), LoadDelta(None, None, None)).footprint_bytes
            for m in members
        )  # fmt: skip
    counts = {w: capacity(available, t) for w, t in totals.items()}
    ratio = counts["int8"] / counts["fp32"] if counts["fp32"] else float("nan")
    ctx.log(f"ensemble capacity in {budget.available_mb:.0f} MB: fp32 {counts['fp32']}, int8 {counts['int8']}")
    return Row(SECTION, f"capacity int8 / fp32 (whole ensembles in {budget.name} {budget.available_mb:.0f} MB)", 1, "ensembles",
               float(counts["int8"]), float(counts["fp32"]), ratio, "ratio", ">=", float(ctx.settings.goals.ensemble.capacity_int8_vs_fp32),
               note=f"ensemble footprint fp32 {totals['fp32'] / 2**20:.2f} MB, int8 {totals['int8'] / 2**20:.2f} MB "
                    "(runtime weights + one stream's state + step peak, default-size models; torch modules dropped)")  # fmt: skip
