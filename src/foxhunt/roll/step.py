"""One roll step, as ``foxhunt ensemble roll`` runs it.

In order, nothing heavy before the inputs are known good:

1. the promotion a killed process committed and did not finish is applied first
   (:func:`foxhunt.ensemble.registry.complete_pending`, under the registry lock);
2. each family's champion (:func:`~foxhunt.ensemble.registry.resolved_version` of
   ``ensemble.alias``: none is one line, exit 2), its files verified against their digests and
   its stored config checked (:func:`~foxhunt.ensemble.registry.download_version`), and what it
   has seen (:mod:`foxhunt.roll.window`);
3. the source's bars and the step's layout: a source that shrank is one line; too few new bars
   is a step with nothing to do, said in one line (exit 0): a second run with no new bars does
   nothing;
4. an MLflow run in ``roll.experiment`` (``roll-<asset>``) with a child per family
   (``roll-<family>-<asset>``), under which its challenger trains
   (:mod:`foxhunt.roll.challenger`) and is prepared as a registered version would be;
5. every champion and challenger scored on the newest block, each family's verdict
   (:mod:`foxhunt.roll.score`), logged on its child: both scores (``champion/<metric>``,
   ``challenger/<metric>``), the deflated Sharpe ratio and its trials, the verdict and why;
6. under the registry lock: the champions checked unchanged since step 2 (else nothing is
   promoted, said in one line), each promoted challenger registered as a new version (no alias
   yet; tagged with its gate or ``forced``, the roll run and what it has seen), then every alias
   move of the step committed as one record and applied (:func:`~foxhunt.ensemble.registry.commit_moves`):
   ``champion`` on the new version, ``previous`` on the one it replaced;
7. every champion scored (kept or replaced) and every promoted version tagged with the last bar
   of the newest block (:data:`~foxhunt.roll.window.SEEN_TAG`).

The whole step holds the store's ``roll`` lock (a second roll started meanwhile waits, then
finds no new bars). ``FOXHUNT_ROLL_KILL_AT=trained|registered`` (and the registry's points)
kill the process there: the crash tests.
"""

from __future__ import annotations

import datetime
import json
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from hydra.utils import instantiate
from omegaconf import OmegaConf

from foxhunt.config.schema import resolved_config
from foxhunt.ensemble.loading import journal, registered_names
from foxhunt.ensemble.member_files import ARTIFACTS_DIR, WEIGHTS_FILE, MemberFiles, RegistryError
from foxhunt.ensemble.model_env import model_environment
from foxhunt.ensemble.rebuild import build_member
from foxhunt.ensemble.registry import (
    GATE_FORCED,
    REGISTRY_LOCK,
    commit_moves,
    complete_pending,
    download_version,
    kill_point,
    promotion_moves,
    register_prepared,
    resolved_version,
)
from foxhunt.errors import ConfigError
from foxhunt.evaluation.backtest import evaluation_annualization
from foxhunt.roll.challenger import ROLE_TAG, ROLL_RUN_TAG, challenger_config, child_tags, prepare_challenger, train_challenger
from foxhunt.roll.score import (
    BLOCK_TAG,
    CHALLENGER,
    CHAMPION,
    CHAMPION_VERSION_TAG,
    earlier_trials,
    paired_interval,
    score_block,
    trials,
    verdict,
)
from foxhunt.roll.window import (
    SEEN_TAG,
    NothingNew,
    check_windowable,
    ensemble_seen,
    iso,
    plan,
    seen_from_tag,
    trained_until,
    write_window,
)
from foxhunt.runs.store import RunStore
from foxhunt.runs.tracked_run import TrackedRun

SOURCE = "foxhunt ensemble roll"
ROLL_LOCK = "roll"  # the store's lock held for a whole step
ROLL_FOLDER = Path("outputs") / "roll"  # under paths.root_dir: each step's window and challengers' folders
REPORT_FILE = "roll.md"
OUTCOMES_FILE = "outcomes.json"  # each family: the version before and after, its challenger, the verdict
LOGGED = ("sharpe", "pnl", "sharpe_ci_low", "sharpe_ci_high", "sharpe_per_step", "max_drawdown", "hit_rate", "trades", "steps",
          "pnl_skew", "pnl_kurtosis")  # fmt: skip


@dataclass
class Champion:
    family: str
    name: str
    version: object  # the registry's ModelVersion
    folder: Path
    files: MemberFiles
    seen_ns: int


@dataclass
class FamilyOutcome:
    family: str
    champion: str  # its version
    challenger_run: str | None = None
    champion_metrics: dict = field(default_factory=dict)
    challenger_metrics: dict = field(default_factory=dict)
    promote: bool = False
    forced: bool = False
    reason: str = ""
    dsr: float = float("nan")
    trials: int = 0
    diff_ci: tuple[float, float] = (float("nan"), float("nan"))
    registered: str | None = None  # the new version


@dataclass
class RollReport:
    text: str
    nothing_new: bool
    outcomes: list[FamilyOutcome] = field(default_factory=list)
    run_id: str | None = None
    moves: list[str] = field(default_factory=list)
    block: tuple[int, int] | None = None  # the newest block's first and last bar (UTC ns)


def roll_step(cfg, workdir: Path, force: bool = False) -> RollReport:
    """One step (module doc)."""
    if cfg.evaluation.get("holdout"):
        raise ConfigError(f"evaluation.holdout={cfg.evaluation.holdout}: a rolling ensemble's newest bars are its evaluation blocks; "
                          "roll with evaluation.holdout=null")  # fmt: skip
    store = RunStore(str(cfg.logger.tracking_uri))
    asset = instantiate(cfg.asset)
    with store.exclusive(ROLL_LOCK):
        with store.exclusive(REGISTRY_LOCK):
            lines = complete_pending(store, str(cfg.roll.experiment))
        champions = _champions(cfg, store, workdir / "champions")
        source = instantiate(cfg.data.source)
        origin = f"data.source ({cfg.data.source._target_.rsplit('.', 1)[-1]}{', ' + str(cfg.data.source.path) if cfg.data.source.get('path') else ''})"
        bars = source.load(asset)
        check_windowable(bars, origin)
        stamps = bars.index.as_unit("ns").asi8
        layout = plan(stamps, ensemble_seen({c.family: c.seen_ns for c in champions}), cfg.roll, origin)
        if isinstance(layout, NothingNew):
            return RollReport("\n".join([*lines, f"{SOURCE}: {asset.key}: {layout.line}"]), nothing_new=True)
        return _step(cfg, store, asset, champions, bars, stamps, layout, lines, workdir, force)


def _champions(cfg, store, workdir: Path) -> list[Champion]:
    ens = cfg.ensemble
    found = []
    for family, name in zip(ens.models, registered_names(cfg)):
        version = resolved_version(store, name, str(ens.alias), journal(cfg))
        if version is None:
            raise RegistryError(f"models:/{name}@{ens.alias}: no champion in the registry of {cfg.logger.tracking_uri}; a roll "
                                "retrains champions: register one per family first (foxhunt ensemble register)")  # fmt: skip
        folder, version = download_version(str(cfg.logger.tracking_uri), name, None, int(version.version), workdir / name)
        files = MemberFiles.read(folder / ARTIFACTS_DIR, name)
        where = f"{name} v{version.version}"
        # the version's tag (a roll writes it on every champion it scores), else its run's (written by rolls before);
        # the later of the two: a promoted version's own tag stayed at its promotion while kept champions' runs were
        # tagged, and every later roll re-scored the same block (found by a helper probing the roll)
        marks = [seen_from_tag(version.tags.get(SEEN_TAG), f"{where}: tag {SEEN_TAG}")]
        if version.run_id:
            marks.append(seen_from_tag(store.get(version.run_id).tags.get(SEEN_TAG), f"{where}: its run's tag {SEEN_TAG}"))
        seen = max((mark for mark in marks if mark is not None), default=None)
        if seen is None:
            seen = trained_until(files.manifest, where)
        found.append(Champion(str(family), name, version, folder, files, seen))
    return found


def _step(cfg, store, asset, champions, bars, stamps, layout, lines, workdir: Path, force: bool) -> RollReport:
    ens, roll = cfg.ensemble, cfg.roll
    uri, experiment, key = str(cfg.logger.tracking_uri), str(roll.experiment), str(asset.key)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out = Path(cfg.paths.root_dir) / ROLL_FOLDER / f"{stamp}_{key}_{secrets.token_hex(4)}"
    window = write_window(bars, layout.window_start, layout.window_stop, out)
    block = (int(stamps[layout.eval_start]), int(stamps[layout.eval_stop - 1]))
    seen_after = iso(block[1])
    lines.append(f"{SOURCE}: {key}: {layout.new_bars:,} new bar(s) since {iso(layout.seen_ns)}; {layout.describe(stamps)}")
    tags = {ROLE_TAG: "roll", "asset": key, "roll.new_bars": layout.new_bars, BLOCK_TAG: f"{iso(block[0])}..{seen_after}",
            "roll.window_file": str(window), "roll.forced": str(force).lower()}  # fmt: skip
    outcomes = {c.family: FamilyOutcome(c.family, str(c.version.version)) for c in champions}
    prepared, work = {}, workdir / "prepared"
    with TrackedRun(uri, experiment, cfg.logger.artifact_location, f"roll-{key}", tags, source=SOURCE) as run:
        resolved = resolved_config(cfg)
        run.log_config(resolved, OmegaConf.to_yaml(resolved))
        environment, children = None, {}
        for champion in champions:
            outcome = outcomes[champion.family]
            with TrackedRun(uri, experiment, cfg.logger.artifact_location, f"roll-{champion.family}-{key}",
                            {**child_tags(champion.family, key), CHAMPION_VERSION_TAG: outcome.champion, BLOCK_TAG: tags[BLOCK_TAG]},
                            parent_run_id=run.run_id, source=SOURCE) as child:  # fmt: skip
                children[champion.family] = child.run_id
                config = challenger_config(
                    champion.files.cfg, cfg, window, out / champion.family, champion.folder / ARTIFACTS_DIR / WEIGHTS_FILE
                )
                result = train_challenger(config, champion.family, key, child.run_id, run.run_id)
                outcome.challenger_run = result.run_id
                if environment is None:  # one wheel for every version of this step
                    environment = model_environment(work, ARTIFACTS_DIR)
                ready, why = prepare_challenger(store, result, champion.family, champion.name, str(ens.metric), work,
                                                environment, int(ens.input_example_decided))  # fmt: skip
                if ready is None:
                    outcome.reason = f"no challenger to promote: {why}"
                else:
                    prepared[champion.family] = ready
                child.set_tags({"challenger.run_id": result.run_id})
        kill_point("trained")
        _score(cfg, asset, champions, prepared, outcomes, bars, block, store, experiment, key, force)
        for champion in champions:  # the scores before the commit point: a roll killed after it still leaves its
            # trial for the next step's deflated Sharpe ratio (found by a helper probing the roll)
            _log_scores(store, children[champion.family], outcomes[champion.family])
        moves = _promote(cfg, store, champions, prepared, outcomes, run.run_id, seen_after, lines)
        for champion in champions:
            _tag_verdict(store, children[champion.family], outcomes[champion.family])
        for champion in champions:  # every champion scored has seen the block: said on its version, which stays (its
            # training run may have been deleted: tagging it failed at the very end of every roll)
            store.set_version_tags(champion.name, champion.version.version, {SEEN_TAG: seen_after})
        promoted = [o.family for o in outcomes.values() if o.registered]
        run.set_tags({"roll.promoted": ",".join(promoted) or "none", SEEN_TAG: seen_after})
        text = _text(lines, outcomes, moves, ens.metric)
        out.mkdir(parents=True, exist_ok=True)
        (out / REPORT_FILE).write_text(text + "\n")
        summary = {o.family: {"before": o.champion, "after": o.registered or o.champion, "challenger_run": o.challenger_run,
                              "verdict": _verdict_word(o), "reason": o.reason} for o in outcomes.values()}  # fmt: skip
        (out / OUTCOMES_FILE).write_text(json.dumps(summary, indent=1))
        run.log_artifact(out / REPORT_FILE)
        run.log_artifact(out / OUTCOMES_FILE)
    shutil.rmtree(work, ignore_errors=True)
    text += f"\nMLflow run {run.run_id} in experiment {experiment}"
    return RollReport(text, False, list(outcomes.values()), run.run_id, [m.line() for m in moves], block)


def _score(cfg, asset, champions, prepared, outcomes, bars, block, store, experiment: str, key: str, force: bool) -> None:
    ens = cfg.ensemble
    block_tag = f"{iso(block[0])}..{iso(block[1])}"
    members = {}
    for champion in champions:
        built = {CHAMPION: champion.folder}
        if champion.family in prepared:
            built[CHALLENGER] = prepared[champion.family].folder
        for side, folder in built.items():
            name = f"{champion.family}/{side}"
            member, inputs, _ = build_member(folder, name, key, "fp32", str(ens.runtime), str(ens.device),
                                             int(ens.runtime_probe_calls), int(ens.torch_threads or 1),
                                             workdir=folder.parent / f"{champion.family}-{side}-runtime")  # fmt: skip
            members[name] = (member, inputs)
    scores = score_block(members, asset, bars, block[0], block[1] + 1, cfg)
    per_year = evaluation_annualization(asset, cfg.evaluation).bars_per_year
    min_dsr = None if cfg.roll.min_dsr is None else float(cfg.roll.min_dsr)
    for champion in champions:
        outcome = outcomes[champion.family]
        outcome.champion_metrics = scores[f"{champion.family}/{CHAMPION}"][0]
        if champion.family not in prepared:
            continue
        mine, pnl = scores[f"{champion.family}/{CHALLENGER}"]
        outcome.challenger_metrics = mine
        children = store.search(experiment, tags={ROLE_TAG: "family", "model": champion.family, "asset": key})
        tried = trials(earlier_trials(children, (block_tag, outcome.champion)), mine["sharpe_per_step"])
        diff = paired_interval(pnl, scores[f"{champion.family}/{CHAMPION}"][1], cfg, per_year)
        judged = verdict(outcome.champion_metrics, mine, diff, str(ens.gate), tried, min_dsr)
        outcome.promote, outcome.reason, outcome.dsr, outcome.trials, outcome.diff_ci = (
            judged.promote or force, judged.reason, judged.dsr, judged.trials, judged.diff_ci)  # fmt: skip
        outcome.forced = force and not judged.promote


def _log_scores(store, run_id: str, outcome: FamilyOutcome) -> None:
    metrics = {f"{CHAMPION}/{k}": v for k, v in outcome.champion_metrics.items() if k in LOGGED or k.startswith("baseline/")}
    metrics.update(
        {f"{CHALLENGER}/{k}": v for k, v in outcome.challenger_metrics.items() if k in LOGGED or k.startswith("baseline/")}
    )
    if outcome.challenger_metrics:
        metrics.update({"roll/dsr": outcome.dsr, "roll/trials": float(outcome.trials), "roll/diff_mean_pnl_ci_low": outcome.diff_ci[0],
                        "roll/diff_mean_pnl_ci_high": outcome.diff_ci[1]})  # fmt: skip
    store.log_metrics(run_id, {k: float(v) for k, v in metrics.items() if np.isfinite(v)})


def _tag_verdict(store, run_id: str, outcome: FamilyOutcome) -> None:
    store.tag(run_id, {"roll.verdict": _verdict_word(outcome), "roll.reason": outcome.reason[:4000]})


def _promote(cfg, store, champions, prepared, outcomes, run_id: str, seen_after: str, lines: list[str]) -> list:
    """Step 6 of the module doc; the alias moves made."""
    ens, roll = cfg.ensemble, cfg.roll
    chosen = [c for c in champions if outcomes[c.family].promote and c.family in prepared]
    if not chosen:
        return []

    with store.exclusive(REGISTRY_LOCK):
        lines += complete_pending(store, str(roll.experiment))
        moved = []
        for champion in chosen:
            now = resolved_version(store, champion.name, str(ens.alias), journal(cfg))
            if now is None or now.version != champion.version.version:
                moved.append(f"{champion.name}@{ens.alias} v{champion.version.version} -> v{now.version if now else 'none'}")
        if moved:
            lines.append(
                f"{SOURCE}: the champions moved while this step trained ({'; '.join(moved)}): nothing promoted; roll again"
            )
            for champion in chosen:
                outcomes[champion.family].promote = False
                outcomes[champion.family].reason += " (not promoted: the champions moved meanwhile)"
            return []
        registered = {}
        for champion in chosen:
            outcome = outcomes[champion.family]
            ready = prepared[champion.family]
            ready.tags.update({ROLL_RUN_TAG: run_id, SEEN_TAG: seen_after, "roll.reason": outcome.reason[:4000]})
            gate = GATE_FORCED if outcome.forced else str(ens.gate)
            registered[champion.family] = register_prepared(store, ready, None, gate)
        kill_point("registered")
        moves = []
        for champion in chosen:
            moves += promotion_moves(
                store, champion.name, str(ens.alias), str(roll.previous_alias), registered[champion.family].version
            )
        commit_moves(store, run_id, moves)
    for champion in chosen:
        outcomes[champion.family].registered = registered[champion.family].version
        store.tag(outcomes[champion.family].challenger_run, {SEEN_TAG: seen_after})
    return moves


def _verdict_word(outcome: FamilyOutcome) -> str:
    if outcome.registered:
        return "forced" if outcome.forced else "promoted"
    if not outcome.challenger_metrics:
        return "no challenger"
    return "kept"


def _text(lines: list[str], outcomes: dict, moves: list, metric) -> str:
    out = list(lines)
    out.append(f"{'family':<8} {'champion':>8} {'challenger run':<34} {'champion':>9} {'challenger [interval]':>28} "
               f"{'best baseline':>20} {'DSR (trials)':>14}  verdict")  # fmt: skip
    for o in outcomes.values():
        theirs = o.champion_metrics.get("sharpe", float("nan"))
        mine = o.challenger_metrics
        interval = "-" if not mine else f"{mine['sharpe']:.3g} [{mine['sharpe_ci_low']:.3g}, {mine['sharpe_ci_high']:.3g}]"
        baselines = {
            k.split("/")[1]: v
            for k, v in (mine or o.champion_metrics).items()
            if k.startswith("baseline/") and k.endswith("/sharpe")
        }
        best = max(baselines.items(), key=lambda item: item[1]) if baselines else None
        base = "-" if best is None else f"{best[0]} {best[1]:.3g}"
        dsr = "-" if not mine else f"{o.dsr:.3f} ({o.trials})"
        word = _verdict_word(o) + (f" v{o.registered}" if o.registered else "")
        out.append(f"{o.family:<8} {'v' + o.champion:>8} {o.challenger_run or '-':<34} {theirs:>9.3g} {interval:>28} {base:>20} "
                   f"{dsr:>14}  {word}: {o.reason}")  # fmt: skip
    out.append("Sharpe ratios on the newest block (annualized, net of costs; block-bootstrap interval); DSR: deflated Sharpe "
               "ratio against every challenger of the family and asset tried")  # fmt: skip
    out.append("registry: " + ("; ".join(m.line() for m in moves) if moves else "unchanged"))
    return "\n".join(out)
