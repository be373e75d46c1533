"""foxhunt ensemble roll | rollback end to end on a folder of daily CSV files that grows: a step
trains a challenger on the moved window, scores both on the newest bars, promotes by the gate
or --force (@champion moved, @previous kept), records everything in MLflow; a second step with
no new bars does nothing (exit 0); bad input is one line (exit 2); rollback moves back."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from roll_helpers import CSV, ROLL, cli, utc_dates, write_days

from foxhunt.ensemble.member_files import DIGESTS_TAG, WEIGHTS_FILE
from foxhunt.roll.window import SEEN_TAG, WINDOW_FILE, iso
from foxhunt.training import warm_start

NAME = "foxhunt-dqn-es"


def roll(root, *extra):
    return cli(root, "ensemble", "roll", "asset=es", "ensemble.models=[dqn]", *CSV, f"data.source.path={root / 'data' / 'es'}",
               *ROLL, "ensemble.runtime=numpy", *extra)  # fmt: skip


def store(root):
    from foxhunt.runs.store import RunStore

    return RunStore(f"sqlite:///{root / 'mlruns' / 'mlflow.db'}")


def aliases(root) -> dict[str, str | None]:
    s = store(root)
    return {alias: getattr(s.get_version_by_alias(NAME, alias), "version", None) for alias in ("champion", "previous")}


def test_a_step_scores_promotes_records_and_a_second_does_nothing(roll_store, roll_bars):
    dates = utc_dates(roll_bars)
    write_days(roll_bars, roll_store / "data" / "es", dates[6:7])
    first = roll(roll_store)  # the gate decides
    assert first.exit_code == 0, first.output
    assert "new bar(s) since" in first.output and "newest block" in first.output
    verdict = next(line for line in first.output.splitlines() if line.startswith("dqn "))
    if " kept: " in verdict:
        assert aliases(roll_store) == {"champion": "1", "previous": None} and "registry: unchanged" in first.output
    write_days(roll_bars, roll_store / "data" / "es", dates[7:8])
    forced = roll(roll_store, "--force", "roll.init=champion")  # the challenger starts from the champion's weights
    assert forced.exit_code == 0, forced.output
    s = store(roll_store)
    champion = s.get_version_by_alias(NAME, "champion")
    assert aliases(roll_store)["previous"] in ("1", "2") and champion.version != aliases(roll_store)["previous"]
    assert champion.tags["gate"] in ("forced", "baseline") and champion.tags["roll.run_id"]
    source = pd.concat([pd.read_csv(f) for f in sorted((roll_store / "data" / "es").glob("*.csv"))])
    assert champion.tags[SEEN_TAG] == source["timestamp_utc"].iloc[-1]  # the newest block's last bar
    assert f"{NAME}@champion: v{aliases(roll_store)['previous']} -> v{champion.version}" in forced.output

    # MLflow: the roll run, a child per family with both scores and the verdict, the challenger under it
    run = s.get(champion.tags["roll.run_id"])
    assert run.experiment == "roll" and run.status == "FINISHED" and run.tags["roll.promoted"] == "dqn"
    assert run.tags["foxhunt.promotion.state"] == "applied"
    children = s.search("roll", tags={"mlflow.parentRunId": run.run_id})
    (child,) = [c for c in children if c.tags.get("roll.role") == "family"]
    metrics = child.metric_values()
    assert {"champion/sharpe", "challenger/sharpe", "challenger/sharpe_ci_low", "roll/dsr", "roll/trials"} <= set(metrics)
    assert metrics["roll/trials"] == 2.0  # every challenger of dqn on es tried counts
    assert child.tags["roll.verdict"] in ("forced", "promoted")
    (trained,) = s.search("roll", tags={"mlflow.parentRunId": child.run_id})
    assert trained.run_id == champion.run_id and trained.status == "FINISHED" and trained.metric("val/sharpe") is not None
    replaced = s.get_version(NAME, child.tags["champion.version"])
    weights = [sha for file, sha in json.loads(replaced.tags[DIGESTS_TAG]).items() if file.endswith(WEIGHTS_FILE)]
    assert trained.tags[warm_start.SHA_TAG] == weights[0]  # roll.init=champion: the champion's verified weights.pt
    window = pd.read_csv(run.tags["roll.window_file"])
    assert len(window) == 3000 and window["timestamp_utc"].iloc[-1] < run.tags["roll.block"].split("..")[0]
    assert run.tags["roll.window_file"].endswith(WINDOW_FILE)

    again = roll(roll_store)  # no new bars: nothing, exit 0
    assert again.exit_code == 0, again.output
    assert "0 new bar(s)" in again.output and "nothing to do" in again.output
    assert aliases(roll_store)["champion"] == champion.version

    back = cli(roll_store, "ensemble", "rollback", "asset=es", "ensemble.models=[dqn]")
    assert back.exit_code == 0, back.output
    before = aliases(roll_store)
    assert before == {"champion": aliases(roll_store)["champion"], "previous": champion.version}
    forth = cli(roll_store, "ensemble", "rollback", "asset=es", "ensemble.models=[dqn]")
    assert forth.exit_code == 0 and aliases(roll_store)["champion"] == champion.version


def one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, result.output
    return lines[0]


def test_bad_input_is_one_line_and_exit_2(roll_store, tmp_path):
    line = one_line(roll(roll_store, f"data.source.path={tmp_path / 'nothing'}"))
    assert line.startswith("foxhunt ensemble roll: ") and "nothing" in line
    last = sorted((roll_store / "data" / "es").glob("*.csv"))[-1]
    last.unlink()  # the source shrank: its last bar is before what the champion has seen
    line = one_line(roll(roll_store))
    assert "shrank" in line and "nothing rolled" in line
    line = one_line(roll(roll_store, "ensemble.models=[ppo]"))
    assert "models:/foxhunt-ppo-es@champion: no champion" in line
    line = one_line(roll(roll_store, "evaluation.holdout=0.1"))
    assert "evaluation.holdout=0.1" in line
    line = one_line(roll(roll_store, "roll.min_new_bars=0"))
    assert "roll.min_new_bars=0" in line
    line = one_line(cli(roll_store, "ensemble", "rollback", "asset=es", "ensemble.models=[dqn]"))
    assert "no previous version to roll back to" in line
    assert aliases(roll_store) == {"champion": "1", "previous": None}


def test_the_window_and_the_newest_block():
    import numpy as np
    from omegaconf import OmegaConf

    from foxhunt.roll.window import NothingNew, RollError, plan

    minute = 60_000_000_000
    stamps = np.arange(1000, dtype=np.int64) * minute
    settings = OmegaConf.create({"min_new_bars": 100, "eval_bars": 50, "purge_bars": 10, "window_bars": 400})
    layout = plan(stamps, int(stamps[799]), settings, "bars")
    assert (layout.new_bars, layout.eval_start, layout.eval_stop) == (200, 950, 1000)
    assert (layout.window_start, layout.window_stop) == (540, 940)  # ends purge_bars before the block
    assert isinstance(plan(stamps, int(stamps[950]), settings, "bars"), NothingNew)
    with pytest.raises(RollError, match="shrank"):
        plan(stamps[:500], int(stamps[799]), settings, "bars")
    small = plan(stamps, int(stamps[899]), OmegaConf.merge(settings, {"eval_bars": 500}), "bars")
    assert small.eval_start == 900  # every new bar, when fewer than eval_bars
    assert iso(int(stamps[1])) == "1970-01-01T00:01:00Z"


def test_register_after_a_roll_keeps_the_promoted_champion_unless_forced(roll_store, roll_bars):
    """A plain register after a promotion chose among the training runs (the roll's challenger is
    in the roll's experiment), registered the old best again and moved @champion to it: the old
    model served, the promoted one left without an alias. Now it refuses in one line, and --force
    replaces the champion as asked."""
    write_days(roll_bars, roll_store / "data" / "es", utc_dates(roll_bars)[6:7])
    forced = roll(roll_store, "--force")
    assert forced.exit_code == 0, forced.output
    promoted = aliases(roll_store)["champion"]
    assert promoted == "2"
    register = ["ensemble", "register", "asset=es", "ensemble.models=[dqn]", "ensemble.gate=none", *CSV,
                f"data.source.path={roll_store / 'data' / 'es'}"]  # fmt: skip
    refused = cli(roll_store, *register)
    assert refused.exit_code == 2, refused.output
    assert "foxhunt-dqn-es@champion is run" in refused.output and "(promoted by a roll)" in refused.output, refused.output
    assert aliases(roll_store)["champion"] == promoted
    replaced = cli(roll_store, *register, "--force")
    assert replaced.exit_code == 0, replaced.output
    # the replaced champion is kept as @previous, so a rollback returns to it (it left @previous on v1, and a rollback
    # went back past the promotion, to v1: the last note's leftover)
    assert aliases(roll_store) == {"champion": "3", "previous": promoted}
    back = cli(roll_store, "ensemble", "rollback", "asset=es", "ensemble.models=[dqn]")
    assert back.exit_code == 0, back.output
    assert aliases(roll_store) == {"champion": promoted, "previous": "3"}


def test_a_rollback_to_a_version_that_fails_its_checks_moves_nothing(roll_store, roll_bars):
    """Rollback moved @champion to a version whose files no longer matched their record and
    exited 0; every server and paper session then refused to start (found probing the rollback).
    The version the champion moves back to passes the loading checks first, or nothing moves."""
    write_days(roll_bars, roll_store / "data" / "es", utc_dates(roll_bars)[6:7])
    assert roll(roll_store, "--force").exit_code == 0
    assert aliases(roll_store) == {"champion": "2", "previous": "1"}
    s = store(roll_store)
    digests = json.loads(s.get_version(NAME, "1").tags[DIGESTS_TAG])
    weights = next(file for file in digests if file.endswith(WEIGHTS_FILE))
    s.set_version_tags(NAME, "1", {DIGESTS_TAG: json.dumps({**digests, weights: "0" * 64})})  # v1's weights: not as recorded
    line = one_line(cli(roll_store, "ensemble", "rollback", "asset=es", "ensemble.models=[dqn]"))
    assert f"{NAME}@champion not moved back to v1: " in line and "nothing moved" in line, line
    assert aliases(roll_store) == {"champion": "2", "previous": "1"}


def test_a_promoted_champion_kept_later_does_not_score_the_same_block_again(roll_store, roll_bars):
    """A version promoted by a roll and kept by the next roll was re-scored on the same block by
    every roll after (its own roll.seen_until tag stayed at its promotion while the kept step
    tagged its run; found by a helper probing the roll): a third roll with no new bar trained a
    challenger again and counted one more trial."""
    dates = utc_dates(roll_bars)
    write_days(roll_bars, roll_store / "data" / "es", dates[6:7])
    assert roll(roll_store, "--force").exit_code == 0
    write_days(roll_bars, roll_store / "data" / "es", dates[7:8])
    kept = roll(roll_store, "roll.min_dsr=0.99999")
    assert kept.exit_code == 0 and "new bar(s) since" in kept.output, kept.output
    again = roll(roll_store, "roll.min_dsr=0.99999")
    assert again.exit_code == 0, again.output
    assert "0 new bar(s)" in again.output and "nothing to do" in again.output, again.output
