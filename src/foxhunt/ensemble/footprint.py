"""What the trained ensemble costs to hold and run, member by member, in fp32 and int8, and how many
instances fit a budget (``foxhunt ensemble footprint``).

The method: take a baseline, load the registered members one by one, and measure
what each adds. Per member, after it has streamed ``ensemble.footprint.warm_bars`` bars (so its
streaming state is full: the TFT's 50 encodings, Mamba-2's state):

- ``tensors``: bytes of the torch module's parameters and buffers when its runtime is torch
  (unique storages; an int8 copy's quantized weights through their inner tensors:
  :mod:`foxhunt.memory.accounting`); a member whose runtime holds the weights drops its module;
- ``runtime``: bytes of the weights its numba / numpy runtime holds (numpy ``nbytes``: int8
  codes and their scales for int8) or its ONNX Runtime graphs hold (their initializers' bytes);
- ``state``: bytes of what it keeps between bars;
- ``step peak``: the most memory one more step holds at once beyond that, temporaries included:
  :class:`foxhunt.memory.allocations.AllocationPeak` (a dispatch mode that sees every allocation
  of the step; it agrees with torch's MemTracker to the byte) for a torch member, ``tracemalloc``'s peak for a numpy one (numba's own allocations are not traced: its
  step allocates a few KB of work arrays, so that figure is a floor);
- on CUDA the allocator delta (``torch.cuda.memory_allocated``) and NVML's used-memory delta of
  loading it; the CUDA context (NVML before and after the first CUDA call) on its own line;
- the process RSS delta of loading it (psutil): context, Python objects and allocator slack
  included, so an upper bound on CPU.

A member's **footprint** is tensors + runtime + state + step peak: what an instance needs on the
device. **Capacity** is found from measured per-instance increments: each instance shares
nothing with the next, so one more costs one footprint, and ``floor(available / footprint)``
instances fit in ``budget.total_mb - budget.headroom_mb`` (less the CUDA context on a GPU);
the whole ensemble, ``floor(available / sum of footprints)``. The report says so beside the figures.
"""

from __future__ import annotations

import math
import time
import tracemalloc
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np
import psutil
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from foxhunt.data.streaming import KnownCalendar, StreamingFeatures, normalize
from foxhunt.ensemble.rebuild import build_member
from foxhunt.ensemble.registry import download_version, record_weights_choice, registered_name
from foxhunt.memory.accounting import ByteCounter, to_mb
from foxhunt.memory.allocations import AllocationPeak
from foxhunt.memory.probes import DeviceProbes

MB = 1024 * 1024


@dataclass
class MemberFootprint:
    name: str
    family: str
    weights: str  # fp32 | int8
    tensor_bytes: int
    runtime_bytes: int
    state_bytes: int
    step_peak_bytes: int
    step_peak_method: str
    rss_delta_bytes: int | None
    step_p50_us: float
    runtime: str
    cuda_allocated_delta: int | None = None
    nvml_delta: int | None = None
    positions: np.ndarray | None = None  # its positions on the warm bars (int8 is compared with fp32 on them)

    @property
    def footprint_bytes(self) -> int:
        return self.tensor_bytes + self.runtime_bytes + self.state_bytes + self.step_peak_bytes

    @property
    def footprint_mb(self) -> float:
        return to_mb(self.footprint_bytes)


@dataclass
class EnsembleFootprint:
    members: dict[str, list[MemberFootprint]] = field(default_factory=dict)  # weights -> members
    cuda_context_bytes: int | None = None
    baseline_rss_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def total_bytes(self, weights: str) -> int:
        return sum(m.footprint_bytes for m in self.members[weights])


def module_bytes(module: torch.nn.Module) -> int:
    counter = ByteCounter()
    return counter.add_all(module.parameters()) + counter.add_all(module.buffers())


def _rss() -> int | None:
    try:
        return int(psutil.Process().memory_info().rss)
    except Exception:
        return None


def _step_peak(member, step) -> tuple[int, str]:
    """Bytes one more ``step()`` holds at its peak beyond what was live before it, and how measured."""
    if member.runtime == "torch":
        with AllocationPeak() as meter:
            step()
        return (
            meter.peak_bytes,
            "AllocationPeak (a TorchDispatchMode): peak of the tensors the step allocated, equal to torch's MemTracker",
        )
    tracemalloc.start()
    try:
        step()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    how = "tracemalloc peak of the step's numpy arrays"
    if member.runtime in ("numba", "onnx"):
        how += f" ({member.runtime}'s own work buffers untraced: a floor)"
    return int(peak), how


@dataclass(frozen=True)
class LoadDelta:
    """What loading something added: process RSS, and on CUDA the allocator and NVML."""

    rss: int | None
    cuda_allocated: int | None
    nvml: int | None


class LoadProbe:
    """Readings before loading; :meth:`delta` after it."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.cuda = device.startswith("cuda") and torch.cuda.is_available()
        self.rss = _rss()
        self.allocated = torch.cuda.memory_allocated() if self.cuda else None
        self.nvml = _nvml_used(device) if self.cuda else None

    def delta(self) -> LoadDelta:
        rss = _rss()
        nvml = _nvml_used(self.device) if self.cuda else None
        return LoadDelta(
            rss=None if rss is None or self.rss is None else rss - self.rss,
            cuda_allocated=None if self.allocated is None else torch.cuda.memory_allocated() - self.allocated,
            nvml=None if nvml is None or self.nvml is None else nvml - self.nvml,
        )


@dataclass
class MemberBars:
    """A member's inputs for some bars: normalized rows (N, F) float32, their starts (N,) and
    the calendar their future minutes are read from."""

    rows: np.ndarray
    ts: np.ndarray
    calendar: KnownCalendar

    def step(self, member, slot: int, i: int):
        """Bar ``i`` into ``member``'s stream in ``slot``."""
        ts = self.ts[i : i + 1]
        return member.step(self.rows[i : i + 1], np.array([slot]), ts, lambda k, h: self.calendar.future(int(ts[k]), h))


def member_bars(raw_bars, asset, inputs, count: int) -> MemberBars:
    """The member's inputs for the first ``count`` bars of ``raw_bars`` that have features
    (after the warm-up), normalized with its statistics."""
    stream = StreamingFeatures(asset, inputs.feature_config, origin="validate bars")
    offset, scale = inputs.normalizer()
    rows, stamps = [], []
    for ts, row in zip(
        raw_bars.index.as_unit("ns").asi8.tolist(), raw_bars[["open", "high", "low", "close", "volume"]].to_numpy().tolist()
    ):
        raw = stream.update(ts, *row)
        if raw is not None:
            rows.append(normalize(raw, offset, scale))
            stamps.append(ts)
        if len(rows) >= count:
            break
    return MemberBars(np.stack(rows), np.asarray(stamps, np.int64), stream.calendar)


def measure_member(member, weights: str, bars: MemberBars, probe_calls: int, loaded: LoadDelta) -> MemberFootprint:
    """Stream ``bars`` through a stream of ``member`` (its state fills), then measure it (the module doc)."""
    slot = member.new_slot()
    positions = np.array([bars.step(member, slot, i)[0].position for i in range(len(bars.ts))], np.int8)
    last = len(bars.ts) - 1
    peak, how = _step_peak(member, lambda: bars.step(member, slot, last))
    times = []
    for _ in range(probe_calls):
        started = time.perf_counter_ns()
        bars.step(member, slot, last)
        times.append(time.perf_counter_ns() - started)
    member.free_slot(slot)
    tensors = module_bytes(member.module) if member.module is not None else 0
    return MemberFootprint(
        name=member.name, family=member.family, weights=weights, tensor_bytes=tensors,
        runtime_bytes=member.runtime_bytes(), state_bytes=member.state_bytes(), step_peak_bytes=peak,
        step_peak_method=how, rss_delta_bytes=loaded.rss, step_p50_us=float(np.median(times)) / 1e3,
        runtime=member.runtime, cuda_allocated_delta=loaded.cuda_allocated, nvml_delta=loaded.nvml, positions=positions,
    )  # fmt: skip


def _nvml_used(device: str) -> int | None:
    probes = DeviceProbes(device)
    try:
        return probes.sample().nvml_used_bytes
    finally:
        probes.close()


def capacity(available_bytes: float, footprint_bytes: int) -> int:
    """Instances of ``footprint_bytes`` each that fit in ``available_bytes``."""
    return max(0, math.floor(available_bytes / footprint_bytes)) if footprint_bytes > 0 else 0


def bar(mb: float, total_mb: float, width: int = 40) -> str:
    filled = min(width, round(width * mb / total_mb)) if total_mb > 0 else 0
    return "#" * filled + "." * (width - filled)


def report_text(footprint: EnsembleFootprint, budget, targets: dict[str, float | None]) -> tuple[str, dict[str, float], bool]:
    """The table, the headroom and the capacity; the metrics to log; whether the ensemble fits
    (the weights the ensemble loads by default: fp32 unless only int8 fits)."""
    available = budget.available_mb * MB - (footprint.cuda_context_bytes or 0)
    lines = [f"budget {budget.name}: {budget.total_mb:.0f} MB, {budget.headroom_mb:.0f} MB headroom required"]
    if footprint.cuda_context_bytes is not None:
        lines.append(
            f"CUDA context: {to_mb(footprint.cuda_context_bytes):.1f} MB (NVML used before and after the first CUDA call)"
        )
    header = f"{'member':<20} {'weights':<7} {'MB':>9} {'cut %':>6} {'train target':>7} {'% budget':>8}  {'tensors':>8} {'runtime':>8} {'state':>7} {'peak':>7} {'RSS +MB':>8} {'p50 us':>9}"
    lines.append(header)
    metrics: dict[str, float] = {}
    for weights in footprint.members:
        for m in footprint.members[weights]:
            fp32 = next(x for x in footprint.members["fp32"] if x.name == m.name)
            cut = 100 * (1 - m.footprint_bytes / fp32.footprint_bytes) if weights != "fp32" else 0.0
            target = targets.get(m.family)
            rss = "-" if m.rss_delta_bytes is None else f"{to_mb(m.rss_delta_bytes):.1f}"
            lines.append(
                f"{m.name:<20} {weights:<7} {m.footprint_mb:>9.3f} {cut:>6.1f} {('-' if target is None else f'{target:.0f}'):>7} "
                f"{100 * m.footprint_mb / budget.total_mb:>8.2f}  {to_mb(m.tensor_bytes):>8.3f} {to_mb(m.runtime_bytes):>8.3f} "
                f"{to_mb(m.state_bytes):>7.3f} {to_mb(m.step_peak_bytes):>7.3f} {rss:>8} {m.step_p50_us:>9.1f}"
            )  # fmt: skip
            metrics[f"{m.family}/{weights}_mb"] = m.footprint_mb
            metrics[f"{m.family}/{weights}_p50_us"] = m.step_p50_us
    fits = {}
    for weights in footprint.members:
        total = footprint.total_bytes(weights)
        left = budget.total_mb - to_mb(total + (footprint.cuda_context_bytes or 0))
        fits[weights] = left >= budget.headroom_mb
        lines.append(
            f"ensemble {weights}: {to_mb(total):.2f} MB, {left:.2f} MB left of {budget.total_mb:.0f} "
            f"({'PASS' if fits[weights] else 'FAIL'}: {budget.headroom_mb:.0f} MB headroom required)  |{bar(to_mb(total), budget.total_mb)}|"
        )  # fmt: skip
        metrics[f"ensemble/{weights}_mb"] = to_mb(total)
        metrics[f"ensemble/{weights}_headroom_mb"] = left
    lines.append(f"capacity in {budget.available_mb:.0f} MB available (from measured per-instance increments: instances share nothing, "
                 "so each one more costs one footprint)")  # fmt: skip
    lines.append(f"{'member':<20} " + " ".join(f"{w:>8}" for w in footprint.members))
    names = [m.name for m in footprint.members["fp32"]]
    for name in names:
        counts = {
            w: capacity(available, next(m for m in footprint.members[w] if m.name == name).footprint_bytes)
            for w in footprint.members
        }
        lines.append(f"{name:<20} " + " ".join(f"{counts[w]:>8d}" for w in footprint.members))
        for w, n in counts.items():
            metrics[f"capacity/{name}_{w}"] = float(n)
    whole = {w: capacity(available, footprint.total_bytes(w)) for w in footprint.members}
    lines.append(f"{'whole ensemble':<20} " + " ".join(f"{whole[w]:>8d}" for w in footprint.members))
    for w, n in whole.items():
        metrics[f"capacity/ensemble_{w}"] = float(n)
    if "int8" in whole and whole["fp32"]:
        ratio = whole["int8"] / whole["fp32"]
        lines.append(f"capacity int8 / fp32 (whole ensemble): {ratio:.2f}x")
        metrics["capacity/ensemble_int8_over_fp32"] = ratio
    methods = sorted({m.step_peak_method for ms in footprint.members.values() for m in ms})
    lines.append("how: MB = tensors (torch parameter and buffer bytes, a torch runtime's) + runtime (numba/numpy weight "
                 "arrays, ONNX Runtime graph initializers) + state (one stream's, kept between bars) + peak (one step's "
                 "temporaries: " + "; ".join(methods) + "); RSS +MB = psutil RSS delta of loading it")  # fmt: skip
    lines += footprint.notes
    return "\n".join(lines), metrics, fits["fp32"] or fits.get("int8", False)


def measure_footprint(cfg, workdir) -> tuple[str, dict[str, float], bool]:
    """Measure the registered ensemble of ``cfg`` in fp32 and int8 against ``cfg.budget`` (see the
    module doc): (report text, metrics, whether the ensemble as configured fits)."""
    ens = cfg.ensemble
    settings = ens.footprint
    budget = instantiate(cfg.budget)
    asset = instantiate(cfg.asset)
    device = str(ens.device)
    if ens.torch_threads is not None:
        torch.set_num_threads(int(ens.torch_threads))
    raw_bars = (
        instantiate(cfg.data.source).load(asset).iloc[: int(cfg.data.features.volume_bars) + int(settings.warm_bars) + 200]
    )  # the warm-up and the warm bars
    result = EnsembleFootprint(baseline_rss_bytes=_rss())
    if device.startswith("cuda") and torch.cuda.is_available():
        before = _nvml_used(device)
        torch.zeros(1, device=device)  # the first CUDA call creates the context
        after = _nvml_used(device)
        result.cuda_context_bytes = None if before is None or after is None else after - before
    folders, versions = {}, {}
    for family in ens.models:
        name = registered_name(str(ens.registry_prefix), str(family), str(asset.key))
        folders[name], versions[name] = download_version(str(cfg.logger.tracking_uri), name, str(ens.alias),
                                            ens.versions.get(str(family)), Path(workdir) / name)  # fmt: skip
    for weights in ("fp32", "int8"):
        loaded_members = []  # kept loaded: each RSS delta is on top of the members before it
        result.members[weights] = []
        for name, folder in folders.items():
            probe = LoadProbe(device)
            member, inputs, _ = build_member(folder, name, str(asset.key), weights, str(ens.runtime), device,
                                             int(ens.runtime_probe_calls), int(ens.torch_threads or 1))  # fmt: skip
            loaded = probe.delta()
            bars = member_bars(raw_bars, asset, inputs, int(settings.warm_bars))
            result.members[weights].append(measure_member(member, weights, bars, int(settings.probe_calls), loaded))
            loaded_members.append(member)
        del loaded_members
    targets = {str(f): model_memory_target(str(f)) for f in ens.models}
    text, metrics, _ = report_text(result, budget, targets)
    limits = float(settings.int8_max_slowdown), float(settings.int8_min_cut_pct), float(settings.int8_min_agreement)
    choices = int8_choices(result, *limits)
    text += "\n" + "\n".join(int8_verdicts(choices, *limits))
    if str(ens.weights) == "auto":  # the ensemble as it will load: each member's choice
        chosen = sum(next(m for m in result.members[w] if m.name == name).footprint_bytes for name, (w, _) in choices.items())
        metrics["ensemble/auto_total_mb"] = chosen / MB
        metrics["ensemble/auto_headroom_mb"] = budget.available_mb - chosen / MB
        text += f"\nensemble auto (each member's choice): {chosen / MB:.2f} MB, headroom {metrics['ensemble/auto_headroom_mb']:.2f} MB"
    if settings.record_choice and cfg.logger.enabled:  # logger.enabled=false writes nothing to the store
        record_weights_choice(str(cfg.logger.tracking_uri), versions, choices)
        text += "\nrecorded on each version (tags weights_choice, weights_reason): ensemble.weights=auto loads them"
    fits = metrics[f"ensemble/{ens.weights}_headroom_mb"] >= budget.headroom_mb
    return text, metrics, fits


def int8_choices(footprint: EnsembleFootprint, max_slowdown: float, min_cut_pct: float,
                 min_agreement: float = 0.0) -> dict[str, tuple[str, str]]:  # fmt: skip
    """Per member, the weights that pay (``int8`` when its measured step p50 is at most
    ``max_slowdown`` x fp32's, its footprint at least ``min_cut_pct`` % smaller and its positions
    equal fp32's on at least ``min_agreement`` of the warm bars, else ``fp32``) and the measured
    reason, in one line."""
    choices = {}
    for fp32 in footprint.members["fp32"]:
        int8 = next(m for m in footprint.members["int8"] if m.name == fp32.name)
        slowdown = int8.step_p50_us / fp32.step_p50_us
        cut = 100 * (1 - int8.footprint_bytes / fp32.footprint_bytes)
        agree = (
            float(np.mean(int8.positions == fp32.positions)) if fp32.positions is not None and int8.positions is not None else 1.0
        )
        # in bytes, not the rounded percentage: a footprint exactly min_cut_pct % smaller pays
        cut_enough = 100 * int8.footprint_bytes <= (100 - min_cut_pct) * fp32.footprint_bytes
        pays = slowdown <= max_slowdown and cut_enough and agree >= min_agreement
        bars = 0 if fp32.positions is None else len(fp32.positions)
        choices[fp32.name] = ("int8" if pays else "fp32", (
            f"int8 step {int8.step_p50_us:.1f} us vs {fp32.step_p50_us:.1f} us = {slowdown:.2f}x (at most {max_slowdown:.2f}x), "
            f"footprint {int8.footprint_mb:.2f} vs {fp32.footprint_mb:.2f} MB = {cut:.1f}% less (at least {min_cut_pct:.0f}%), "
            f"positions equal on {100 * agree:.1f}% of {bars} bars (at least {100 * min_agreement:.0f}%); "
            f"runtimes {int8.runtime} / {fp32.runtime}"
        ))  # fmt: skip
    return choices


def int8_verdicts(choices: dict[str, tuple[str, str]], max_slowdown: float, min_cut_pct: float,
                  min_agreement: float = 0.0) -> list[str]:  # fmt: skip
    """The choices as report lines."""
    lines = [f"int8 where it pays (step p50 at most {max_slowdown:.2f}x fp32's, footprint at least {min_cut_pct:.0f}% smaller, "
             f"positions equal on at least {100 * min_agreement:.0f}% of the bars):"]  # fmt: skip
    lines += [f"  {name}: {choice} ({reason})" for name, (choice, reason) in choices.items()]
    return lines


def model_memory_target(family: str) -> float | None:
    """The model's own memory target (``conf/model/<family>.yaml``: ``memory_target_mb``)."""
    text = resources.files("foxhunt.conf").joinpath("model", f"{family}.yaml").read_text()
    config = OmegaConf.create(text)
    assert isinstance(config, DictConfig)  # a model config is a mapping
    value = config.get("memory_target_mb")
    return None if value is None else float(value)
