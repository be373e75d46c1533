"""The deflated Sharpe ratio's trials of a roll (foxhunt.roll.score.earlier_trials): one per block
and champion, never this step's own, runs from before the tags one each."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from foxhunt.roll.score import BLOCK_TAG, CHAMPION_VERSION_TAG, SHARPE_PER_STEP, earlier_trials
from foxhunt.runs.stored import Metric, StoredRun


def child(n: int, block: str | None, champion: str | None, value: float | None) -> StoredRun:
    tags = {k: v for k, v in ((BLOCK_TAG, block), (CHAMPION_VERSION_TAG, champion)) if v is not None}
    metrics = {} if value is None else {SHARPE_PER_STEP: Metric(value, 0, 0)}
    return StoredRun(f"run{n:03d}", "roll-dqn-es", "roll", "FINISHED", n, None, tags, metrics)


def test_a_block_scored_again_from_the_same_champion_counts_once():
    runs = [child(0, "a", "1", 0.1), child(1, "b", "1", 0.2), child(2, "b", "1", 0.2), child(3, "b", "2", 0.3)]
    assert earlier_trials(runs, ("c", "2")) == [0.1, 0.2, 0.3]  # b from v1 twice (a killed roll run again): once
    assert earlier_trials(runs, ("b", "1")) == [0.1, 0.3]  # this step's own block and champion: not earlier


def test_untagged_and_unscored_children():
    runs = [child(0, None, None, 0.1), child(1, None, None, 0.1), child(2, "a", "1", None)]
    assert earlier_trials(runs, ("a", "1")) == [0.1, 0.1]  # before the tags: one each; no score: no trial


@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from("12"), st.floats(-1, 1)), max_size=12),
       st.sampled_from("abc"), st.sampled_from("12"))  # fmt: skip
def test_the_count_is_the_distinct_earlier_blocks(rows, block, champion):
    runs = [child(n, b, c, v) for n, (b, c, v) in enumerate(rows)]
    found = earlier_trials(runs, (block, champion))
    assert len(found) == len({(b, c) for b, c, _ in rows} - {(block, champion)})
    assert earlier_trials([*runs, *runs], (block, champion)) == found  # scored again: nothing new
