"""Loading the ensemble: its registered members onto one device, ready for the streaming engine.

:func:`load_ensemble` reads each family's version (``models:/<prefix>-<model>-<asset>@<alias>``,
or the version ``ensemble.versions`` names), rebuilds its model from the version's own files
(:func:`foxhunt.ensemble.rebuild.rebuild_model`: the stored config, validated by today's schema; the weights, loaded with
``torch.load(weights_only=True)``; int8-trained weights through their quantized layers, then
back to plain fp32), moves it to ``ensemble.device`` in eval mode and wraps it in a
:class:`~foxhunt.ensemble.members.Member`, whose runtime holds its weights (fp32, or with
``ensemble.weights=int8`` int8: :mod:`foxhunt.ensemble.members` says how per family); with ``auto`` (the
default) each member loads the weights ``foxhunt ensemble footprint`` measured to pay for it
(its version's ``weights_choice`` tag: int8 only when its step is at most
``ensemble.footprint.int8_max_slowdown`` x fp32's and its footprint at least
``int8_min_cut_pct`` % smaller), fp32 when none was measured; the log says which and why, one
line per member. A member trained on
another asset than the one asked for, a missing version and a stored config that no longer
validates are each one line (:class:`~foxhunt.ensemble.member_files.RegistryError`), as is a
missing or damaged file of a version (:mod:`foxhunt.ensemble.member_files`). Each family's
version is the one :func:`foxhunt.ensemble.registry.resolved_version` names: the alias, or the
move of a promotion committed and not yet applied (``roll.experiment``), so an ensemble never loads
half a promotion.

**Hot swap** (``roll.swap``: ``foxhunt ensemble serve`` and ``paper``). :class:`VersionWatcher`
looks at the registry every ``roll.swap.poll_s`` seconds on a thread of its own; a family whose
version moved is loaded there through the same path as at start (:func:`load_member`:
:func:`~foxhunt.ensemble.registry.download_version` checks every file against its recorded
digests, :func:`~foxhunt.ensemble.rebuild.build_member` the stored config before anything in it
is imported) and handed over ready; one that fails is one line (``say``), the version serving
goes on, and it is tried again ``roll.swap.retry_s`` later (said again only when the reason
changes) or when its alias moves; serve's ``/info`` lists it under ``refused``. The holder of the engine swaps
a ready member in between two bars (:meth:`SwappableEngine.swap`): the new version first steps
through each stream's latest bars (at most ``roll.swap.warm_bars`` since the stream's members
started, features primed on the bars before them), so its recurrent state (Mamba-2), window
(the TFT) and held position (DQN, PPO) are those of a member that had decided those bars, then
decides the next bar. The same bars give the same swap: a paper resume replays it exactly.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from foxhunt.config.schema import ConfigError
from foxhunt.data.streaming import StreamingFeatures
from foxhunt.ensemble.engine import Bar, MemberInputs, Stream, StreamingEngine
from foxhunt.ensemble.member_files import RegistryError
from foxhunt.ensemble.members import Member
from foxhunt.ensemble.rebuild import build_member
from foxhunt.ensemble.registry import download_version, metric_direction, registered_name, resolved_version, weights_to_load
from foxhunt.ensemble.rules import check_rule
from foxhunt.errors import UserError, one_line_error
from foxhunt.runs.store import RunStore

log = logging.getLogger(__name__)


@dataclass
class LoadedMember:
    member: Member
    inputs: MemberInputs
    name: str  # registered model name
    version: str
    run_id: str
    metric: str
    value: float | None
    precision: str  # what it was trained in
    holdout: float | None = None  # the lockbox its training run kept (evaluation.holdout)

    @property
    def label(self) -> str:
        """``name:version:weights``: what decided a bar (a paper ledger's ``versions``)."""
        return f"{self.name}:{self.version}:{self.member.weights}"


def journal(cfg) -> str | None:
    """The experiment of the promotion records (``roll.experiment``; None without a roll section)."""
    roll = cfg.get("roll")
    return None if roll is None else str(roll.experiment)


def pinned(cfg, family: str) -> int | None:
    """The version ``ensemble.versions`` pins for ``family`` (None: the alias)."""
    versions = cfg.ensemble.versions
    return versions.get(str(family)) if versions else None


def registered_names(cfg) -> list[str]:
    """The registered names of the ensemble's families, in ``ensemble.models`` order."""
    ens = cfg.ensemble
    return [registered_name(str(ens.registry_prefix), str(family), str(cfg.asset.key)) for family in ens.models]


def load_ensemble(cfg, workdir: Path) -> list[LoadedMember]:
    """Every family of ``cfg.ensemble.models`` for ``cfg.asset``, loaded (see the module doc)."""
    ens = cfg.ensemble
    if ens.torch_threads is not None:
        torch.set_num_threads(int(ens.torch_threads))
    store = RunStore(str(cfg.logger.tracking_uri))
    members = []
    for family, name in zip(ens.models, registered_names(cfg)):
        version, via_alias = pinned(cfg, family), False
        if version is None:
            found = resolved_version(store, name, str(ens.alias), journal(cfg))
            version, via_alias = None if found is None else int(found.version), True
        members.append(load_member(cfg, name, version, None, workdir, via_alias))
    return members


def load_member(cfg, name: str, version: int | None, weights: str | None, workdir: Path, via_alias: bool = False) -> LoadedMember:
    """Version ``version`` of ``name`` (None: ``@ensemble.alias``), verified and built; ``weights``
    fp32 or int8 (None: ``ensemble.weights``, ``auto`` reading the version's verdict); ``via_alias``:
    ``version`` is the alias's, and errors name the alias."""
    ens = cfg.ensemble
    Path(workdir).mkdir(parents=True, exist_ok=True)
    place = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=workdir))  # a folder of its own: a version loaded twice never shares one
    folder, found = download_version(str(cfg.logger.tracking_uri), name, str(ens.alias), version, place / name, via_alias)
    if weights is None:
        weights, why = weights_to_load(str(ens.weights), found)
        log.info("%s v%s: %s weights (%s)", name, found.version, weights, why)
    member, inputs, info = build_member(folder, name, str(cfg.asset.key), weights, str(ens.runtime), str(ens.device),
                                        int(ens.runtime_probe_calls), int(ens.torch_threads or 1))  # fmt: skip
    return LoadedMember(member, inputs, name, str(found.version), info["run_id"], info["metric"], info.get("value"),
                        info["precision"], info["holdout"])  # fmt: skip


def ensemble_engine(members: list[LoadedMember], asset, cfg, origin: str) -> SwappableEngine:
    """The streaming engine of a loaded ensemble's members with the configured rule."""
    ens = cfg.ensemble
    weights = {f.member.name: f.value for f in members}
    metrics = sorted({f.metric for f in members})
    if str(ens.rule) == "weighted" and len(metrics) > 1:
        raise ConfigError(f"ensemble.rule=weighted: the members were registered on different metrics ({', '.join(metrics)})")
    check_rule(str(ens.rule), [f.member.family for f in members], weights, metrics[0], metric_direction(metrics[0]) == "max")
    swap = cfg.roll.swap if cfg.get("roll") is not None else None
    return SwappableEngine(
        [f.member for f in members], {f.member.name: f.inputs for f in members}, asset, rule=str(ens.rule),
        weights={k: (v or 0.0) for k, v in weights.items()}, forecast_threshold=float(ens.forecast_threshold),
        origin=origin, warm_bars=0 if swap is None else int(swap.warm_bars),
    )  # fmt: skip  # warm_bars whatever poll_s: a paper resume replays its ledger's swaps (with poll_s=null they warmed
    # on 0 bars, and the session's own ledger was refused as edited: found by a helper probing the roll)


class SwapError(RegistryError):
    """A loaded version the running streams cannot take (one line); the old one keeps deciding."""


class _Recent:
    """A stream's latest bars (a ring of ``size``) and how many it read since its members started."""

    def __init__(self, size: int) -> None:
        self.ts = np.zeros(size, np.int64)
        self.values = np.zeros((size, 5), np.float64)
        self.count = 0  # bars written in all
        self.since_start = 0  # bars the members decided since they (re)started

    def add(self, bar: Bar, decided: bool) -> None:
        size = len(self.ts)
        if size:
            self.ts[self.count % size] = bar[0]
            self.values[self.count % size] = bar[1:]
        self.count += 1
        self.since_start += int(decided)

    def bars(self) -> list[Bar]:
        """The bars kept, oldest first."""
        size = len(self.ts)
        kept = min(self.count, size)
        order = [(self.count - kept + i) % size for i in range(kept)]
        bars: list[Bar] = []
        for i in order:
            open_, high, low, close, volume = map(float, self.values[i])
            bars.append((int(self.ts[i]), open_, high, low, close, volume))
        return bars

    def nbytes(self) -> int:
        return int(self.ts.nbytes + self.values.nbytes)


class SwappableEngine(StreamingEngine):
    """The streaming engine whose members can be replaced between two bars (module doc, "Hot
    swap"); each stream keeps its latest ``warm_bars`` bars (and the features' warm-up before
    them) for the new member to step through first. ``warm_bars=0``: nothing kept, a swapped-in
    member starts fresh."""

    def __init__(self, *args, warm_bars: int = 0, **kwargs) -> None:
        self.warm_bars = int(warm_bars)
        self.keep = 0
        super().__init__(*args, **kwargs)
        if self.warm_bars:
            self.keep = self.warm_bars + max(c.warmup_bars for c in self._configs)
            self.default.recent = _Recent(self.keep)

    def open_stream(self, symbol: str) -> Stream:
        stream = super().open_stream(symbol)
        stream.recent = _Recent(self.keep)
        return stream

    def reset_members(self, stream: Stream | None = None) -> None:
        super().reset_members(stream)
        (stream or self.default).recent.since_start = 0

    def warm(self, ts_ns: int, open_: float, high: float, low: float, close: float, volume: float,
             stream: Stream | None = None) -> None:  # fmt: skip
        super().warm(ts_ns, open_, high, low, close, volume, stream=stream)
        (stream or self.default).recent.add((ts_ns, open_, high, low, close, volume), decided=False)

    def step_many(self, items):
        results = super().step_many(items)
        for (stream, bar), result in zip(items, results):
            if not isinstance(result, Exception):
                stream.recent.add(bar, decided=True)
        return results

    def stream_bytes(self) -> int:
        return super().stream_bytes() + self.default.recent.nbytes()

    def versions(self) -> list[str]:
        return [m.name for m in self.members]

    def swap(self, member: Member, inputs: MemberInputs, weight: float | None, streams: list[Stream]) -> int:
        """Put ``member`` in place of the member of its name for ``streams`` (every stream open
        on this engine) after it stepped through each stream's latest bars; the most bars it
        stepped through on one stream."""
        names = [m.name for m in self.members]
        if member.name not in names:
            raise SwapError(f"{member.name}: not a member of this ensemble ({', '.join(names)})")
        config = inputs.feature_config
        if config not in self._configs:
            raise SwapError(
                f"{member.name}: its features ({config}) are not those the running streams compute; restart to load it"
            )
        streams = [self.default, *(s for s in streams if s is not self.default)]
        offset, scale = inputs.normalizer()
        histories = []  # per stream: (rows (n, F) float32, ts (n,), calendar)
        for stream in streams:
            bars: list[Bar] = stream.recent.bars()
            stepped = min(stream.recent.since_start, self.warm_bars, len(bars))
            pipeline = StreamingFeatures(self.asset, config, f"{self.origin} {stream.symbol} (swap)", self._calendars[config])
            rows, stamps = [], []
            for i, bar in enumerate(bars):
                row = pipeline.update(*bar, checked=True)
                if i >= len(bars) - stepped and row is not None:
                    rows.append(row)
                    stamps.append(bar[0])
            normalized = (
                ((np.stack(rows) - offset) / scale).astype(np.float32) if rows else np.zeros((0, len(offset)), np.float32)
            )
            histories.append((normalized, np.asarray(stamps, np.int64), stream.pipelines[config].calendar))
        slots = [member.new_slot() for _ in streams]
        longest = max((len(h[0]) for h in histories), default=0)
        for round_ in range(longest):  # the streams' bars aligned at their last: one batched call per round
            index = [j for j, h in enumerate(histories) if len(h[0]) >= longest - round_]
            at = [len(histories[j][0]) - (longest - round_) for j in index]
            batch = np.stack([histories[j][0][k] for j, k in zip(index, at)])
            ts = np.asarray([histories[j][1][k] for j, k in zip(index, at)], np.int64)
            calendars = [histories[j][2] for j in index]
            member.step(batch, np.asarray([slots[j] for j in index], np.int64), ts,
                        lambda b, horizon: calendars[b].future(int(ts[b]), horizon))  # fmt: skip
        position = names.index(member.name)
        old = self.members[position]
        for stream, slot in zip(streams, slots):
            old.free_slot(stream.slots[member.name])
            stream.slots[member.name] = slot
        self.members[position] = member
        self.inputs[member.name] = inputs
        self._member_config[member.name] = config
        self._normalizers[member.name] = (offset, scale)
        if self.weights is not None:
            self.weights[member.name] = weight or 0.0
        return longest


class VersionWatcher:
    """Looks for moved aliases and loads their versions on a thread (module doc, "Hot swap").

    ``current``: name -> the version deciding now. :meth:`take` hands over the members loaded and
    checked since; the holder swaps each in and reports :meth:`swapped` or :meth:`refused`.
    ``say``: where the one-line refusals go."""

    def __init__(self, cfg, workdir: Path, current: dict[str, str], say: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.workdir = Path(workdir)
        self.poll_s = float(cfg.roll.swap.poll_s)
        self.current = dict(current)
        self.say = say
        retry = cfg.roll.swap.get("retry_s")
        self.retry_s = None if retry is None else float(retry)
        self.failed: dict[str, str] = {}  # name -> the version refused (tried again after retry_s, or when the alias moves)
        self.refusals: dict[str, dict[str, str]] = {}  # name -> the version refused and why (serve's /info shows them)
        self._failed_at: dict[str, float] = {}  # name -> when (time.monotonic) its version was refused
        self.clock = time.monotonic
        self._ready: dict[str, LoadedMember] = {}  # loaded, not yet handed over
        self._held: dict[str, LoadedMember] = {}  # loaded, held back while a version of the set is refused (poll)
        self._handed: dict[str, str] = {}  # handed over, not yet reported
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.polls = 0

    def start(self) -> VersionWatcher:
        self._thread = threading.Thread(target=self._run, name="foxhunt-version-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)

    def has_ready(self) -> bool:
        """Members are loaded and waiting to be taken (serve holds new requests back for them)."""
        with self._lock:
            return bool(self._ready)

    def take(self) -> list[LoadedMember]:
        """The members loaded and checked since the last call, to swap in now."""
        with self._lock:
            ready, self._ready = list(self._ready.values()), {}
            self._handed.update({found.name: found.version for found in ready})
        return ready

    def swapped(self, found: LoadedMember) -> None:
        with self._lock:
            self.current[found.name] = found.version
            self._handed.pop(found.name, None)

    def refused(self, found: LoadedMember, why: str) -> None:
        """The holder could not swap ``found`` in: said, and tried again as a refused load is (:meth:`poll`)."""
        with self._lock:
            self._handed.pop(found.name, None)
        self._refuse(found.name, found.version, f"not swapped in: {why}")

    def _refuse(self, name: str, version: str, why: str) -> None:
        """``version`` of ``name`` refused for ``why``: remembered (and shown by serve's /info), said
        unless it is what was said last time (a retry failing for the same reason says nothing)."""
        with self._lock:
            same = self.refusals.get(name) == {"version": version, "reason": why}
            self.failed[name], self._failed_at[name] = version, self.clock()
            self.refusals[name] = {"version": version, "reason": why}
        if not same:
            self.say(f"{name} v{version}: {why}; v{self.current.get(name)} keeps deciding")

    def _retry_due(self, name: str) -> bool:
        """A refused version is looked at again ``roll.swap.retry_s`` after its refusal (null: only
        when the alias moves): one refused for a read of the store that failed once was never tried
        again, and the old version served on while the registry named the new one (found by a
        helper probing the roll)."""
        return self.retry_s is not None and self.clock() - self._failed_at.get(name, 0.0) >= self.retry_s

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 (a store that cannot be read now: said, looked at again next time)
                self.say(f"the registry could not be read ({one_line_error(exc, first_line=True, limit=200)}); "
                         "the ensemble goes on as it is")  # fmt: skip

    def poll(self) -> list[LoadedMember]:
        """One look at the registry: each family whose version moved is loaded, and the members
        loaded are handed over together (module doc). The versions are read twice and used only
        when both reads agree: a promotion committed between two families' reads is looked at again
        at the next poll, so the versions handed over are ones the registry held together (a
        two-family promotion was swapped in one family at a time: bars were decided by the new
        DQN beside the old PPO, found by a helper probing the roll). While one family's version is
        refused, the others that moved are held back, loaded, until it loads or its alias moves
        (the old set decides on, whole: the new PPO was swapped in beside the old DQN, and a
        family held back once was then left out when the refused one was fixed). A family whose
        alias is back on the version deciding (a rollback) drops the load waiting for it."""
        self.polls += 1
        store = RunStore(str(self.cfg.logger.tracking_uri))
        wanted = self._resolve(store)
        if wanted != self._resolve(store):
            return []
        loaded, refused = [], []
        for name, version in wanted.items():
            with self._lock:
                if version is None or version == self.current.get(name):
                    self._ready.pop(name, None)
                    self._held.pop(name, None)
                    self.refusals.pop(name, None)  # the alias is back on the version deciding: nothing refused
                    continue
                if self.failed.get(name) == version and not self._retry_due(name):
                    refused.append(f"{name} v{version}")  # still refused: what moved with it waits on
                    continue
                held = self._held.get(name)
                waiting = {self._handed.get(name), getattr(self._ready.get(name), "version", None)}
            if held is not None and held.version == version:  # loaded already, held back with a refused one
                loaded.append(held)
                continue
            if version in waiting:
                continue
            try:
                member = load_member(self.cfg, name, int(version), None, self.workdir / "swaps")
            except UserError as exc:  # a version whose files or config are refused: the old one keeps deciding
                self._refuse(name, version, f"refused, not swapped in ({one_line_error(exc, with_type=False)})")
                refused.append(f"{name} v{version}")
                continue
            loaded.append(member)
        if refused and loaded:  # never a set the registry did not hold: the rest of what moved waits with it
            for member in loaded:
                with self._lock:
                    newly = self._held.get(member.name) is not member
                    self._held[member.name] = member
                    why = f"held back, not swapped in alone ({', '.join(refused)} of the registry's set is refused)"
                    self.refusals[member.name] = {"version": member.version, "reason": why}
                if newly:
                    self.say(f"{member.name} v{member.version}: {why}; v{self.current.get(member.name)} keeps deciding")
            return []
        with self._lock:  # together: take() never hands over part of what moved at once
            for member in loaded:
                self.failed.pop(member.name, None)
                self._held.pop(member.name, None)
                self.refusals.pop(member.name, None)
                self._ready[member.name] = member
        return loaded

    def _resolve(self, store) -> dict[str, str | None]:
        """name -> the version its alias resolves to now (None: none), for every family not pinned."""
        return {name: getattr(resolved_version(store, name, str(self.cfg.ensemble.alias), journal(self.cfg)), "version", None)
                for family, name in zip(self.cfg.ensemble.models, registered_names(self.cfg))
                if pinned(self.cfg, family) is None}  # fmt: skip
