"""The step a run's metrics are logged at: Lightning's count of training batches that stepped,
read from the trainer and from a checkpoint (None when the checkpoint does not say)."""

from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from foxhunt.runs.steps import checkpoint_logging_step, logging_step

PATH = ("loops", "fit_loop", "epoch_loop.state_dict", "_batches_that_stepped")


def checkpoint_at(step: int) -> dict:
    """A Lightning checkpoint's layout around the count (other keys beside it, as Lightning has)."""
    return {"epoch": 3, "global_step": 10 * step, "loops": {"fit_loop": {"state_dict": {}, "epoch_loop.state_dict": {
        "_batches_that_stepped": step, "state": {}}}}}  # fmt: skip


@given(step=st.integers(0, 10**9))
def test_the_checkpoints_step_is_the_batches_that_stepped_not_the_global_step(step):
    assert checkpoint_logging_step(checkpoint_at(step)) == step


@given(step=st.integers(0, 10**6), depth=st.integers(0, len(PATH) - 1), broken=st.sampled_from(["missing", "not a dict"]))
def test_a_checkpoint_without_the_count_says_none(step, depth, broken):
    checkpoint = checkpoint_at(step)
    node = checkpoint
    for key in PATH[:depth]:
        node = node[key]
    if broken == "missing":
        del node[PATH[depth]]
    else:
        node[PATH[depth]] = [step]
    assert checkpoint_logging_step(checkpoint) is None


@given(count=st.one_of(st.none(), st.lists(st.integers(), max_size=2), st.text(alphabet="abc", max_size=3),
                       st.sampled_from([float("nan"), float("inf"), -float("inf")])))  # fmt: skip
def test_a_count_that_is_no_number_says_none(count):
    checkpoint = checkpoint_at(0)
    checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]["_batches_that_stepped"] = count
    assert checkpoint_logging_step(checkpoint) is None  # the caller falls back on global_step


def test_the_trainers_step_is_its_batches_that_stepped():
    trainer = SimpleNamespace(global_step=120, fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=40)))
    assert logging_step(trainer) == 40
