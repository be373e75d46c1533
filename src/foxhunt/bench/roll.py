"""Section 8, the rolling loop: does a rolled ensemble follow a pattern that changes sign, where a
frozen one keeps trading the old sign?

Synthetic ES bars whose planted pattern changes sign at a known date (1-minute returns with
AR(1) coefficient ``roll.autocorrelation`` until ``roll.change_date``, its negative after:
:class:`foxhunt.data.sources.synthetic.SyntheticBarSource`), written as one CSV file per UTC date
(a source that grows by a daily file). A champion of ``roll.model`` is trained on the dates before
``roll.champion_until`` and registered; then ``roll.steps`` roll steps
(:func:`foxhunt.roll.step.roll_step`, the settings of ``roll.roll_overrides``), each after the
next dates' files arrived (at least ``roll.min_new_bars`` new bars). What is measured:

- the promotions made on blocks after the change (goal: at least one);
- the rolled ensemble's PnL on the newest blocks after the change (on each block the champion of
  that moment, as the roll scored it) against the frozen ensemble's (the first champion on the
  same blocks), and the block-bootstrap interval of the mean per-bar difference (goal: its lower
  end above 0), with each side's Sharpe ratio and interval beside it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
from hydra.utils import instantiate

from foxhunt.bench.context import BenchContext
from foxhunt.bench.report import Row
from foxhunt.config.compose import compose_config
from foxhunt.ensemble.loading import load_member, registered_names
from foxhunt.ensemble.registry import register_champions
from foxhunt.evaluation.backtest import evaluation_annualization
from foxhunt.evaluation.stats import block_bootstrap, sharpe_ratio
from foxhunt.roll.score import score_block
from foxhunt.roll.step import roll_step
from foxhunt.training.cell import train

SECTION = "roll"


def _csv(folder: Path) -> list[str]:
    return ["data=csv", "data.source.bar_label=start", f"data.source.path={folder}"]


def write_dates(bars, folder: Path, dates: list[str]) -> int:
    """One CSV file per UTC date (``<date>.csv``); the bars written."""
    folder.mkdir(parents=True, exist_ok=True)
    days = np.datetime_as_string(bars.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="D")
    written = 0
    for date in dates:
        chosen = bars[days == date]
        stamps = np.datetime_as_string(chosen.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="s")
        frame = pd.DataFrame({"timestamp_utc": [f"{s}Z" for s in stamps],
                              **{c: chosen[c].to_numpy() for c in ("open", "high", "low", "close", "volume")}})  # fmt: skip
        frame.to_csv(folder / f"{date}.csv", index=False)
        written += len(chosen)
    return written


def demonstrate(ctx: BenchContext) -> dict:
    """The champion, the roll steps and the two ensembles' PnL after the change (module doc)."""
    s = ctx.settings.roll
    root = ctx.work_dir / SECTION
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    folder = root / "data" / "es"
    base = compose_config(["asset=es", "data=synthetic"], root_dir=root)  # the bars' other settings: conf/data/synthetic.yaml
    asset = instantiate(base.asset)
    a = float(s.autocorrelation)
    source = instantiate(base.data.source, days=int(s.days), seed=int(s.seed), start=str(s.start), autocorrelation=a,
                         change_date=str(s.change_date), autocorrelation_after=-a)  # fmt: skip
    bars = source.load(asset)
    days = np.datetime_as_string(bars.index.as_unit("ns").asi8.astype("datetime64[ns]"), unit="D")
    dates = sorted(set(days))
    first = [d for d in dates if d < str(s.champion_until)]
    later = [d for d in dates if d >= str(s.champion_until)]
    write_dates(bars, folder, first)
    ctx.log(f"roll: champion {s.model} on {first[0]}..{first[-1]} ({int((days < str(s.champion_until)).sum()):,} bars)")
    cfg = compose_config([f"model={s.model}", "asset=es", *_csv(folder), *s.train_overrides, f"seed={int(s.seed)}"],
                         root_dir=root, output_dir=str(root / "outputs" / "champion"))  # fmt: skip
    train(cfg)
    uri = str(cfg.logger.tracking_uri)
    ensemble_overrides = ["asset=es", f"ensemble.models=[{s.model}]", *_csv(folder), *s.roll_overrides]
    ens_cfg = compose_config(ensemble_overrides, root_dir=root, config_name="ensemble")
    ens = ens_cfg.ensemble
    register_champions(uri, str(ens_cfg.task), "es", [str(s.model)], str(ens.metric), str(ens.registry_prefix),
                       str(ens.alias), False, gate="none", example_decided=int(ens.input_example_decided))  # fmt: skip
    steps, pending = [], list(later)
    for k in range(int(s.steps)):
        added = 0
        while pending and added < int(ens_cfg.roll.min_new_bars):
            added += write_dates(bars, folder, [pending.pop(0)])
        cfg = compose_config(ensemble_overrides, root_dir=root, config_name="ensemble")
        work = root / "work" / f"step{k + 1}"
        report = roll_step(cfg, work)
        shutil.rmtree(work, ignore_errors=True)
        ctx.log(f"roll: step {k + 1}: " + report.text.splitlines()[-1 if report.nothing_new else 0])
        steps.append(report)
    return {"cfg": cfg, "steps": steps, "change_ns": int(np.datetime64(str(s.change_date), "ns").astype(np.int64)), "asset": asset,
            "bars": bars}  # fmt: skip


def compare(result: dict) -> dict:
    """The rolled and the frozen ensemble on the newest blocks after the change (module doc)."""
    cfg, asset, bars = result["cfg"], result["asset"], result["bars"]
    name = registered_names(cfg)[0]
    work = Path(cfg.paths.root_dir) / "work" / "compare"
    first = None
    rolled, frozen, blocks = [], [], []
    for report in result["steps"]:
        if report.nothing_new or report.block is None or report.block[0] < result["change_ns"]:
            continue
        outcome = report.outcomes[0]
        first = first or next(r.outcomes[0].champion for r in result["steps"] if not r.nothing_new)
        members = {}
        for side, version in (("frozen", first), ("rolled", outcome.champion)):
            found = load_member(cfg, name, int(version), "fp32", work)
            found.member.name = side
            members[side] = (found.member, found.inputs)
        scores = score_block(members, asset, bars, report.block[0], report.block[1] + 1, cfg)
        rolled.append(scores["rolled"][1])
        frozen.append(scores["frozen"][1])
        blocks.append((report.block, outcome.champion, scores["rolled"][0]["pnl"], scores["frozen"][0]["pnl"]))
    if not rolled:
        return {"blocks": []}
    per_year = evaluation_annualization(asset, cfg.evaluation).bars_per_year
    boot = cfg.evaluation.bootstrap
    mine, theirs = np.concatenate(rolled), np.concatenate(frozen)

    def interval(pnl):
        if len(pnl) < 2 or not np.std(pnl) > 0:
            return (float(pnl.mean()),) * 2, (0.0, 0.0)
        found = block_bootstrap(pnl, block_bars=min(int(boot.block_bars), len(pnl)), samples=int(boot.samples),
                                confidence=float(boot.confidence), seed=int(boot.seed), periods_per_year=per_year)  # fmt: skip
        return found.mean_pnl, found.sharpe

    diff = mine - theirs
    return {"blocks": blocks, "bars": len(mine), "rolled_pnl": float(mine.sum()), "frozen_pnl": float(theirs.sum()),
            "diff_ci": tuple(map(float, interval(diff)[0])), "rolled_sharpe": float(sharpe_ratio(mine, per_year)),
            "frozen_sharpe": float(sharpe_ratio(theirs, per_year)), "rolled_sharpe_ci": tuple(map(float, interval(mine)[1])),
            "frozen_sharpe_ci": tuple(map(float, interval(theirs)[1]))}  # fmt: skip


def rows(result: dict, compared: dict) -> tuple[list[Row], list[str]]:
    after = [r for r in result["steps"] if not r.nothing_new and r.block and r.block[0] >= result["change_ns"]]
    promoted = sum(1 for r in after for o in r.outcomes if o.registered)
    found = [_row("promotions on newest blocks after the change", float(promoted), None, float(promoted), "count", ">=", 1.0)]
    notes = []
    for k, report in enumerate(result["steps"], 1):
        if report.nothing_new:
            notes.append(f"step {k}: nothing new")
            continue
        o = report.outcomes[0]
        when = "after" if report.block[0] >= result["change_ns"] else "before"
        mine = o.challenger_metrics.get("sharpe", float("nan"))
        notes.append(f"step {k} (block {when} the change): champion v{o.champion} Sharpe {o.champion_metrics.get('sharpe', float('nan')):.2f}, "
                     f"challenger {mine:.2f}, DSR {o.dsr:.3f} ({o.trials} trials): "
                     f"{'promoted v' + o.registered if o.registered else 'kept'} ({o.reason})")  # fmt: skip
    if compared.get("blocks"):
        low, high = compared["diff_ci"]
        note = (f"{compared['bars']:,} bars after the change; rolled Sharpe {compared['rolled_sharpe']:.2f} "
                f"[{compared['rolled_sharpe_ci'][0]:.2f}, {compared['rolled_sharpe_ci'][1]:.2f}], frozen "
                f"{compared['frozen_sharpe']:.2f} [{compared['frozen_sharpe_ci'][0]:.2f}, {compared['frozen_sharpe_ci'][1]:.2f}]")  # fmt: skip
        found.append(_row("rolled ensemble PnL after the change - frozen ensemble's", compared["rolled_pnl"], compared["frozen_pnl"],
                          compared["rolled_pnl"] - compared["frozen_pnl"], "USD", ">=", 0.0, note))  # fmt: skip
        found.append(_row("mean PnL per bar, rolled - frozen: interval, lower end", compared["rolled_pnl"], compared["frozen_pnl"],
                          low, "USD", ">=", 0.0, f"interval [{low:.3f}, {high:.3f}] USD per bar; {note}"))  # fmt: skip
        found.append(_row("rolled ensemble Sharpe after the change", compared["rolled_sharpe"], compared["frozen_sharpe"],
                          compared["rolled_sharpe"], "Sharpe", None, None, note))  # fmt: skip
    return found, notes


def _row(name: str, foxhunt: float, reference: float | None, figure: float, unit: str, op: str | None, goal: float | None,
         note: str = "") -> Row:  # fmt: skip
    return Row(section=SECTION, name=name, threads=1, unit=unit, foxhunt=foxhunt, reference=reference, figure=figure,
               figure_kind="value", goal_op=op, goal=goal, note=note)  # fmt: skip


def run_section(ctx: BenchContext) -> tuple[list[Row], list[str]]:
    s = ctx.settings.roll
    result = demonstrate(ctx)
    compared = compare(result)
    found, notes = rows(result, compared)
    head = [f"synthetic ES, seed {s.seed}, {s.days} days from {s.start}, autocorrelation {s.autocorrelation} until "
            f"{s.change_date}, {-float(s.autocorrelation)} after; champion {s.model} on the dates before {s.champion_until}; "
            f"{s.steps} roll steps, a file per UTC date arriving between them",
            f"training: {' '.join(map(str, s.train_overrides))}; roll: {' '.join(map(str, s.roll_overrides))}"]  # fmt: skip
    return found, head + notes
