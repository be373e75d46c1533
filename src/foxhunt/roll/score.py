"""Champion against challenger on the newest block, and the verdict.

**Scores** (:func:`score_block`): every champion and challenger of the step stream the source's
bars through one streaming engine (:func:`foxhunt.ensemble.replay.replay_bars`: the bars before
the newest block prime the features, every member starts fresh at its first bar and decides
each bar as a live feed would) and their positions go through the shared backtest with the
baselines and the block-bootstrap intervals (:func:`foxhunt.evaluation.scoring.score_positions`,
``evaluation.bootstrap``): the figures every run reports, on bars neither has seen.

**The verdict** (:func:`verdict`), by ``ensemble.gate`` (the rule ``register`` judges a champion
by, here on the newest block):

- ``baseline`` (the default): the challenger's Sharpe ratio beats the champion's and the best
  baseline's on the block;
- ``interval``: the same, and the lower ends of two block-bootstrap intervals are above 0: the
  challenger's Sharpe ratio's, and the mean per-bar PnL difference's, challenger less champion
  (paired: the same bars, the same blocks resampled);
- ``none``: the challenger's Sharpe ratio beats the champion's.

With ``roll.min_dsr`` its deflated Sharpe ratio must also reach it; the trials are every
challenger of its family and asset ever tried in ``roll.experiment`` (each child run's
``challenger/sharpe_per_step``, once per block and champion: :func:`earlier_trials`), this one
included (:func:`trials`), reported whatever the setting. ``--force`` promotes whatever the verdict says (the version tagged ``gate=forced``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from foxhunt.ensemble.engine import StreamingEngine
from foxhunt.ensemble.replay import replay_bars
from foxhunt.evaluation.deflated import deflated_sharpe_ratio
from foxhunt.evaluation.scoring import ScoringSettings, score_positions
from foxhunt.evaluation.stats import block_bootstrap

CHAMPION, CHALLENGER = "champion", "challenger"
SHARPE_PER_STEP = f"{CHALLENGER}/sharpe_per_step"  # a family child run's metric: a trial of its family and asset
BLOCK_TAG = "roll.block"  # a roll run's and its family children's tag: the newest block's first and last bar
CHAMPION_VERSION_TAG = "champion.version"  # a family child's tag: the version its challenger started from


@dataclass
class Verdict:
    promote: bool
    reason: str
    dsr: float
    trials: int
    diff_ci: tuple[float, float]


def score_block(members: dict[str, tuple], asset, bars, start_ns: int, stop_ns: int, cfg) -> dict[str, tuple[dict, np.ndarray]]:
    """Each member's metrics and per-step PnL on the bars in [start_ns, stop_ns) (module doc);
    ``members``: name -> (Member, MemberInputs)."""
    engine = StreamingEngine([m for m, _ in members.values()], {name: inputs for name, (_, inputs) in members.items()}, asset,
                             rule="majority", origin=f"roll, newest block of {asset.key}")  # fmt: skip
    replayed = replay_bars(engine, bars, start_ns=start_ns, stop_ns=stop_ns)
    settings = ScoringSettings.from_config(cfg, asset)
    scores = {}
    for name in members:
        score = score_positions(replayed.positions[name], replayed.close, replayed.timestamps, asset, settings,
                                roll_price=replayed.roll_price)  # fmt: skip
        scores[name] = (score.metrics(settings), score.model.pnl)
    return scores


def paired_interval(challenger: np.ndarray, champion: np.ndarray, cfg, bars_per_year: float) -> tuple[float, float]:
    """The block-bootstrap interval of the mean per-bar PnL difference, challenger less champion."""
    diff = np.asarray(challenger, np.float64) - np.asarray(champion, np.float64)
    if len(diff) < 2 or not np.std(diff) > 0:
        mean = float(diff.mean()) if len(diff) else 0.0
        return mean, mean
    boot = cfg.evaluation.bootstrap
    found = block_bootstrap(diff, block_bars=min(int(boot.block_bars), len(diff)), samples=int(boot.samples),
                            confidence=float(boot.confidence), seed=int(boot.seed), periods_per_year=bars_per_year)  # fmt: skip
    return float(found.mean_pnl[0]), float(found.mean_pnl[1])


def earlier_trials(children, mine: tuple[str, str]) -> list[float]:
    """The trials before this one: each family child run's ``challenger/sharpe_per_step``, once per
    block and champion. A challenger is a function of its champion and its window, so a step that
    scores the same block from the same champion again (after a roll killed before its commit
    point, or one whose champions moved meanwhile) tried nothing new: counted once, and not at all
    when it is this step's own ``mine`` (block, champion version), so the count never depends on
    where a roll was killed. Runs from before the tags count one each."""
    found: dict[object, float] = {}
    for run in sorted(children, key=lambda r: (r.start_ms, r.run_id)):
        value = run.metric(SHARPE_PER_STEP)
        block, champion = run.tags.get(BLOCK_TAG), run.tags.get(CHAMPION_VERSION_TAG)
        key = run.run_id if block is None or champion is None else (block, champion)
        if value is not None and key != mine:
            found.setdefault(key, value)
    return list(found.values())


def trials(earlier: list[float], mine: float) -> list[float]:
    """Every challenger's per-step Sharpe ratio of the family and asset, this one last."""
    return [float(v) for v in earlier if math.isfinite(v)] + [float(mine)]


def deflated(metrics: dict, tried: list[float]) -> float:
    try:
        return deflated_sharpe_ratio(metrics["sharpe_per_step"], tried, int(metrics["steps"]), metrics["pnl_skew"],
                                     metrics["pnl_kurtosis"])  # fmt: skip
    except (ValueError, KeyError):  # a degenerate block (always flat, two steps): no figure
        return float("nan")


def verdict(champion: dict, challenger: dict, diff_ci: tuple[float, float], gate: str, tried: list[float],
            min_dsr: float | None) -> Verdict:  # fmt: skip
    """Whether the challenger is promoted, and why (module doc)."""
    dsr = deflated(challenger, tried)
    mine, theirs = challenger["sharpe"], champion["sharpe"]

    def result(promote: bool, reason: str) -> Verdict:
        return Verdict(promote, reason, dsr, len(tried), diff_ci)

    if not mine > theirs:
        return result(False, f"its Sharpe ratio {mine:.3g} does not beat the champion's {theirs:.3g} on the newest block")
    if gate in ("baseline", "interval"):
        baselines = {k.split("/")[1]: v for k, v in challenger.items() if k.startswith("baseline/") and k.endswith("/sharpe")}
        if baselines:
            name, best = max(baselines.items(), key=lambda item: item[1])
            if not mine > best:
                return result(False, f"its Sharpe ratio {mine:.3g} does not beat the best baseline's on the newest block "
                                     f"({name} {best:.3g}; ensemble.gate={gate})")  # fmt: skip
    if gate == "interval":
        low, high = challenger["sharpe_ci_low"], challenger["sharpe_ci_high"]
        if not low > 0:
            return result(False, f"the interval of its Sharpe ratio {mine:.3g}, [{low:.3g}, {high:.3g}], is not above 0 "
                                 "(ensemble.gate=interval)")  # fmt: skip
        if not diff_ci[0] > 0:
            return result(False, f"the interval of its mean PnL per bar less the champion's, [{diff_ci[0]:.3g}, {diff_ci[1]:.3g}] "
                                 "USD, is not above 0 (ensemble.gate=interval)")  # fmt: skip
    if min_dsr is not None and not (dsr >= min_dsr):
        return result(False, f"its deflated Sharpe ratio {dsr:.3f} against {len(tried)} challenger(s) tried is below "
                             f"roll.min_dsr={min_dsr:g}")  # fmt: skip
    return result(True, f"Sharpe ratio {mine:.3g} against the champion's {theirs:.3g} on the newest block (ensemble.gate={gate})")
