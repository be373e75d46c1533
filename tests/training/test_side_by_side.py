"""The side-by-side harness: two threads take turns step by step, and one that finishes early
(or fails) never blocks the other."""

from __future__ import annotations

from foxhunt.training.side_by_side import Turns, alternating_latency, fit_side_by_side


def test_two_fits_take_turns_and_a_finished_one_blocks_nothing():
    turns = Turns(("a", "b"))
    order: list[str] = []

    def fit(name: str, steps: int):
        def run() -> None:
            for _ in range(steps):
                turns.acquire(name)
                order.append(name)
                turns.release(name)
            turns.finish(name)

        return run

    errors = fit_side_by_side({"a": fit("a", 3), "b": fit("b", 5)})
    assert errors == {}
    assert order == ["a", "b", "a", "b", "a", "b", "b", "b"]


def test_a_failing_fit_is_reported_and_the_latency_loop_alternates():
    def broken() -> None:
        raise ValueError("no data")

    errors = fit_side_by_side({"ok": lambda: None, "broken": broken})
    assert list(errors) == ["broken"] and str(errors["broken"]) == "no data"
    calls: list[str] = []
    latency = alternating_latency({"x": lambda: calls.append("x"), "y": lambda: calls.append("y")}, 4, 1)
    assert calls == ["x", "y", "x", "y", "x", "y", "x", "y", "x", "y"]  # warm-up, then call by call
    assert all(0 <= p50 <= p99 for p50, p99 in latency.values())
