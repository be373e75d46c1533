"""One paper session as ``foxhunt ensemble paper`` runs it: everything built from the config,
checked before the ledger is touched, run until the feed ends, a signal or a stopping limit,
then reported and logged.

Order of work: the symbol (:func:`foxhunt.paper.feeds.check_symbol`), the feed (a file feed
loads and checks every bar here: a missing, truncated or out-of-order file, a bar off the tick
grid is one line and nothing is written), the costs and the capital (a money figure a float
cannot keep is one line), the ensemble (as ``replay`` loads it), the session's identity
(:func:`session_identity`), and only then the ledger is opened (locked; another session's is
refused) and resumed (replayed and checked: :meth:`foxhunt.paper.session.PaperSession.resume`).
SIGINT and SIGTERM end the loop between bars, and a paced or quiet feed's wait within
:data:`foxhunt.paper.feeds.WAIT_SLICE_S` (the ledger is consistent after every bar anyway).
With ``roll.swap.poll_s`` set, a :class:`~foxhunt.ensemble.loading.VersionWatcher` watches the
registry once the ledger has resumed: a promoted version is swapped in at the next bar
(:mod:`foxhunt.paper.session`, "Versions"), a refused one said in one line on stderr.

The MLflow run (experiment ``paper.experiment``): params (the resolved config), tags (asset,
members, feed, ledger, why it ended), metrics (``paper/pnl``, ``paper/max_drawdown``,
``paper/sharpe`` of the per-bar equity steps, ``paper/fills``, ``paper/bars``,
``paper/bars_per_s`` of this process, ``latency/ensemble_p50_us`` / p99, ``latency/loop_added_p50_us``
/ p99 / mean) and the artifacts ``fills.csv``, ``equity_paper.png`` and ``paper.md``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from foxhunt.config.schema import resolved_config
from foxhunt.ensemble.loading import VersionWatcher, ensemble_engine, load_ensemble, load_member
from foxhunt.ensemble.replay_run import scored_window
from foxhunt.errors import ConfigError
from foxhunt.evaluation.backtest import evaluation_annualization, from_steps
from foxhunt.evaluation.plots import plot_equity
from foxhunt.paper.feeds import DatabentoLiveFeed, FileFeed, check_symbol
from foxhunt.paper.fills import FillModel
from foxhunt.paper.ledger import SWAP_WARM_KEY, Ledger
from foxhunt.paper.risk import RiskLimits
from foxhunt.paper.session import PaperSession
from foxhunt.paper.view import PaperView
from foxhunt.runs.tracked_run import TrackedRun

SOURCE = "foxhunt ensemble paper"
FILLS_FILE = "fills.csv"
EQUITY_FILE = "equity_paper.png"
REPORT_FILE = "paper.md"


@dataclass
class PaperReport:
    text: str
    metrics: dict[str, float]
    run_id: str | None
    ledger: Path


def build_feed(cfg, asset, symbol: str):
    """The configured feed (module doc of :mod:`foxhunt.paper.feeds`)."""
    paper = cfg.paper
    if str(paper.feed) == "live":  # no key or no client package: one line here, before the ledger is opened
        live = paper.live
        return DatabentoLiveFeed(asset, symbol, str(live.dataset), str(live.schema), str(live.key_env), float(live.poll_s))
    if str(cfg.data.source.get("adjust", "none")) == "ratio":
        raise ConfigError("data.source.adjust=ratio: paper orders fill at raw prices on the tick grid; "
                          "use adjust=difference or none")  # fmt: skip
    bars = instantiate(cfg.data.source).load(asset)

    scoped = OmegaConf.merge(cfg, {"ensemble": {"split": str(paper.split)}})
    start_ns, stop_ns, window = scored_window(scoped, asset, bars)
    stamps = bars.index.as_unit("ns").asi8
    start = 0 if start_ns is None else int(np.searchsorted(stamps, start_ns, side="left"))
    stop = len(stamps) if stop_ns is None else int(np.searchsorted(stamps, stop_ns, side="left"))
    name = cfg.data.source._target_.rsplit(".", 1)[-1]
    feed = FileFeed(bars, symbol, start, stop, float(paper.speed), f"{name} {window} at speed {float(paper.speed):g}")
    feed.tick = float(asset.tick_size)
    feed.identity = f"{name}:{paper.split}"
    return feed


def session_identity(cfg, asset, members, feed, symbol: str) -> dict[str, str]:
    """Everything that decides or prices a fill, as the ledger keeps it (``meta``): the asset's
    contract, the members' registered names (each bar keeps the versions and weights that
    decided it, and the rule's weights are theirs), the rule and its threshold, the feed and its
    data (a file feed: the digest of its bars and window; live: dataset, schema, symbol), the
    symbol, the fill price, the costs, the capital and the risk limits, and the bars a swapped-in
    member warms on (``roll.swap.warm_bars``: a resume replays the ledger's swaps, and a ledger made
    with another count was refused as edited; found by a helper probing the roll)."""
    ens = cfg.ensemble
    live = str(cfg.paper.feed) == "live"
    data = f"{cfg.paper.live.dataset} {cfg.paper.live.schema} {symbol} (live)" if live else feed.digest()
    rule = {"rule": str(ens.rule), "forecast_threshold": float(ens.forecast_threshold)}
    return {"asset": json.dumps(dataclasses.asdict(asset), sort_keys=True, default=str),
            "members": ",".join(f.name for f in members),
            "rule": json.dumps(rule, sort_keys=True), "feed": getattr(feed, "identity", feed.description), "data": data,
            "symbol": symbol, "fill_price": str(cfg.paper.fill_price), "commission_usd": float(cfg.execution.commission_usd),
            "slippage_ticks": float(cfg.execution.slippage_ticks), "capital_usd": float(cfg.paper.capital_usd),
            "risk": json.dumps(OmegaConf.to_container(cfg.paper.risk, resolve=True), sort_keys=True),
            SWAP_WARM_KEY: str(int(cfg.roll.swap.warm_bars)) if cfg.get("roll") is not None else "0"}  # fmt: skip


def run_paper(cfg, workdir: Path, clock=time.time_ns) -> PaperReport:
    paper = cfg.paper
    asset = instantiate(cfg.asset)
    symbol = check_symbol(str(paper.symbol or asset.symbol), asset)
    feed = build_feed(cfg, asset, symbol)
    risk = RiskLimits(paper.risk, asset)
    fills = FillModel(asset, float(cfg.execution.commission_usd), float(cfg.execution.slippage_ticks), str(paper.fill_price))
    loaded = load_ensemble(cfg, workdir)
    for member in loaded:
        if (member.holdout or None) != (cfg.evaluation.get("holdout") or None):
            raise ConfigError(f"evaluation.holdout={cfg.evaluation.get('holdout')}: {member.name} was trained keeping "
                              f"evaluation.holdout={member.holdout}; paper-trade with the same, so its lockbox stays closed")  # fmt: skip
    engine = ensemble_engine(loaded, asset, cfg, origin=f"paper feed {symbol}")
    members = ",".join(f"{f.name}:{f.version}" for f in loaded)
    ledger = Ledger(Path(str(paper.ledger)), session_identity(cfg, asset, loaded, feed, symbol), str(paper.ledger_sync))
    holdout = cfg.evaluation.get("holdout") or None

    def loader(name: str, version: int, weights: str):  # a stored bar's version, loaded and verified as at start
        return load_member(cfg, name, version, weights, workdir / "replayed")

    session = PaperSession(engine, ledger, fills, risk, float(paper.capital_usd), float(asset.multiplier), members=loaded,
                           loader=loader, holdout=holdout)  # fmt: skip
    ledger.open()
    watcher: VersionWatcher | None = None
    try:
        last = session.resume(getattr(feed, "history", None))
        for line in session.swapped_back:
            _say(f"swap: {line}")
        swap = cfg.roll.swap if cfg.get("roll") is not None else None
        if swap is not None and swap.poll_s is not None:
            watcher = VersionWatcher(cfg, workdir, {n: f.version for n, f in session.members.items()}, _say).start()
            session.watcher = watcher
        resumed = ledger.existing
        feed.after_ns = last
        stop = _Signals()
        feed.should_stop = stop.requested
        view = _view(paper, f"paper {symbol}: {members}", risk)
        started = time.perf_counter()
        if hasattr(feed, "start"):
            feed.start()
        try:
            if view is not None:
                with view:
                    ended = session.run(feed, stop.requested, view, clock)
                    view.update(session, force=True)
            else:
                ended = session.run(feed, stop.requested, None, clock)
        finally:
            stop.restore()
            if hasattr(feed, "stop"):
                feed.stop()
        seconds = time.perf_counter() - started
        return _report(cfg, asset, list(session.members.values()), session, ledger, feed, ended, seconds, resumed)
    finally:
        if watcher is not None:
            watcher.stop()
        ledger.close()


def _say(line: str) -> None:
    """A hot swap's one line (a refused version), on stderr."""
    print(f"{SOURCE}: {line}", file=sys.stderr, flush=True)


class _Signals:
    """SIGINT / SIGTERM end the loop between bars."""

    def __init__(self) -> None:
        self.seen: int | None = None
        self.old = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self.old[sig] = signal.signal(sig, self._on)
            except ValueError:  # not the main thread (a test's runner): no handler
                pass

    def _on(self, signum, frame) -> None:
        self.seen = signum

    def requested(self) -> bool:
        return self.seen is not None

    def restore(self) -> None:
        for sig, old in self.old.items():
            signal.signal(sig, old)


def _view(paper, title: str, risk):
    mode = str(paper.view)
    if mode == "never" or (mode == "auto" and not sys.stdout.isatty()):
        return None

    return PaperView(float(paper.view_refresh_hz), title, risk)


def _stats(ns: list[int]) -> dict[str, float]:
    if not ns:
        return {"p50": float("nan"), "p99": float("nan"), "mean": float("nan")}
    values = np.asarray(ns, np.float64) / 1e3
    return {"p50": float(np.percentile(values, 50)), "p99": float(np.percentile(values, 99)), "mean": float(values.mean())}


def _report(cfg, asset, members, session, ledger, feed, ended: str, seconds: float, resumed: bool) -> PaperReport:
    rows = ledger.equity_rows()
    fills = ledger.fills_rows()
    capital = float(cfg.paper.capital_usd)
    equity = np.array([r[2] for r in rows], np.float64)
    positions = np.array([r[1] for r in rows], np.int8)
    metrics = {"paper/pnl": float(session.equity - capital), "paper/fills": float(len(fills)), "paper/bars": float(len(rows)),
               "paper/swaps": float(max(len(ledger.version_changes()) - 1, 0)),
               "paper/bars_per_s": float(session.bars / seconds) if seconds > 0 and session.bars else 0.0,
               "paper/gap_usd": float(sum(f[9] for f in fills))}  # fmt: skip
    result = None
    if len(rows) >= 2:
        result = from_steps(
            positions, np.diff(equity), np.zeros(len(rows) - 1), evaluation_annualization(asset, cfg.evaluation).bars_per_year
        )
        metrics.update({"paper/max_drawdown": result.metrics["max_drawdown"], "paper/sharpe": result.metrics["sharpe"]})
    stepped, added = _stats(session.ensemble_ns), _stats(session.added_ns)
    metrics.update({"latency/ensemble_p50_us": stepped["p50"], "latency/ensemble_p99_us": stepped["p99"],
                    "latency/loop_added_p50_us": added["p50"], "latency/loop_added_p99_us": added["p99"],
                    "latency/loop_added_mean_us": added["mean"]})  # fmt: skip
    state = session.state
    lines = [
        f"paper session of {', '.join(f'{f.name} v{f.version}' for f in members)} (rule {cfg.ensemble.rule}) on {feed.description}: {ended}",
        f"ledger {ledger.path}" + (f" (resumed: {session.resumed_bars:,} bars replayed into the ensemble)" if resumed else " (new)"),
        f"bars traded {len(rows):,} ({session.bars:,} this run, {metrics['paper/bars_per_s']:,.0f} bars/s), fills {len(fills):,}, "
        f"PnL {metrics['paper/pnl']:,.2f} USD, equity {session.equity:,.2f} USD, status {state.status}"
        + (f" ({state.reason})" if state.reason else ""),
        f"positions: {', '.join(f'{s} {a.position:+d}' for s, a in session.accounts.items()) or 'none'}; costs "
        f"{cfg.execution.commission_usd} USD + {cfg.execution.slippage_ticks} ticks per contract per side, fills at {cfg.paper.fill_price}",
        (f"latency per bar (this run): ensemble p50 {stepped['p50']:.1f} us p99 {stepped['p99']:.1f} us; loop added (fills, limits, "
         f"ledger commit) p50 {added['p50']:.1f} us p99 {added['p99']:.1f} us") if session.ensemble_ns
        else "latency per bar (this run): no bar stepped, nothing measured",
    ]  # fmt: skip
    changes = ledger.version_changes()
    if len(changes) > 1:
        lines.append(f"versions: {len(changes) - 1} swap(s): " + "; ".join(
            f"bar {seq} ({np.datetime64(ts, 'ns').astype('datetime64[s]')}): {versions}" for seq, ts, versions in changes[1:]))  # fmt: skip
    for ts, symbol, kind, message in ledger.load(float(asset.multiplier)).events[-5:]:
        lines.append(f"  {kind} {symbol} {np.datetime64(ts, 'ns').astype('datetime64[s]')}: {message}")
    text = "\n".join(lines)
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_FILE).write_text(text + "\n")
    with open(out / FILLS_FILE, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "order_id", "symbol", "ts", "quantity", "price", "commission_usd", "kind", "reference", "gap_usd"])
        for f in fills:
            writer.writerow([f[0], f[1], f[2], str(np.datetime64(f[3], "ns")), *f[4:]])
    artifacts = [out / REPORT_FILE, out / FILLS_FILE]
    if cfg.paper.plot_equity and result is not None:
        stamps = np.array([r[0] for r in rows], "datetime64[ns]")
        artifacts.append(plot_equity(result, stamps, out / EQUITY_FILE, title=f"paper {asset.key}, {feed.description}"))
    run_id = None
    if cfg.logger.enabled:
        run_id = _log(cfg, members, metrics, artifacts, feed, ledger, ended)
        text += f"\nMLflow run {run_id} in experiment {cfg.paper.experiment}"
    return PaperReport(text, metrics, run_id, ledger.path)


def _log(cfg, members, metrics, artifacts, feed, ledger, ended: str) -> str:
    tags = {"asset": str(cfg.asset.key), "rule": str(cfg.ensemble.rule), "members": ",".join(f"{f.name}:{f.version}" for f in members),
            "feed": feed.description, "ledger": str(ledger.path), "ended": ended}  # fmt: skip
    resolved = resolved_config(cfg)
    with TrackedRun(str(cfg.logger.tracking_uri), str(cfg.paper.experiment), cfg.logger.artifact_location,
                    f"paper-{cfg.asset.key}-{cfg.ensemble.rule}", tags, source=SOURCE) as run:  # fmt: skip
        run.log_config(resolved, OmegaConf.to_yaml(resolved))
        run.log_metrics({k: v for k, v in metrics.items() if np.isfinite(v)})
        for path in artifacts:
            run.log_artifact(path)
    return run.run_id
