"""foxhunt.ensemble.members, on small modules built here: the agents' greedy walk carries each
stream's position, the same in every runtime; Mamba-2 is flat until seq_len bars and its runtimes
agree; slots come back clean and the pool grows keeping every stream; the runtime is chosen as
asked, or falls back with the reason."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_kernels import MAMBA2
from torch import nn

from foxhunt.ensemble.members import POOL_GROWTH, AgentMember, Mamba2Member
from foxhunt.models.agent import build_mlp
from foxhunt.models.forecaster import signal_position
from foxhunt.models.mamba2 import Mamba2Forecaster

FEATURES = 16


class Agent(nn.Module):
    """What AgentMember reads of an agent: its ``obs_dim`` and greedy ``acting_network``."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.obs_dim = FEATURES + 1  # the features and the position held
        self.acting_network = build_mlp(self.obs_dim, [32, 32], 3, "tanh")
        with torch.no_grad():  # make the position column matter
            self.acting_network[0].weight[:, -1] *= 8.0


def greedy_walk(agent: Agent, rows: np.ndarray) -> list[int]:
    """The greedy walk by hand: argmax of Q(features, position held) - 1, one stream."""
    position, out = 0, []
    for row in rows:
        with torch.no_grad():
            scores = agent.acting_network(torch.tensor([[*row, position]], dtype=torch.float32))
        position = int(scores.argmax()) - 1
        out.append(position)
    return out


@pytest.mark.parametrize("runtime", ["numba", "numpy", "torch"])
def test_an_agent_walks_greedily_carrying_each_streams_position(runtime):
    agent = Agent(0)
    member = AgentMember("dqn", "dqn", agent, "fp32", None, runtime, probe_calls=1)
    assert member.runtime == runtime and (member.module is None) == (runtime != "torch")
    rows = np.random.default_rng(0).normal(size=(3, 60, FEATURES)).astype(np.float32)
    slots = np.array([member.new_slot() for _ in range(3)])
    got = [[] for _ in range(3)]
    for t in range(60):
        order = [2, 0, 1] if t % 2 else [0, 1, 2]  # streams in any order within a batch
        for k, decision in zip(order, member.step(rows[order, t], slots[order], np.zeros(3, np.int64), None)):
            got[k].append(decision.position)
    for k in range(3):
        want = greedy_walk(agent, rows[k])
        assert got[k] == want and len(set(want)) > 1


def test_a_freed_slot_comes_back_flat_and_a_full_pool_grows_keeping_its_streams():
    member = AgentMember("dqn", "dqn", Agent(1), "fp32", None, "numpy", probe_calls=1)
    first = member.new_slot()
    assert member.new_slot() == first + 1 and member._capacity() == POOL_GROWTH
    held = member.step(np.full((1, FEATURES), 3.0, np.float32), np.array([first]), np.zeros(1, np.int64), None)[0].position
    assert held != 0 and member.positions[first] == held
    more = [member.new_slot() for _ in range(5)]  # grows 2 -> 4 -> 8
    assert member._capacity() == 8 and member.positions[first] == held and not member.positions[more].any()
    member.free_slot(first)
    assert member.new_slot() == first and member.positions[first] == 0  # reused, reset


def test_mamba2_is_flat_until_seq_len_bars_and_its_runtimes_agree():
    torch.manual_seed(0)
    model = Mamba2Forecaster(**MAMBA2).eval()
    members = {r: Mamba2Member("mamba2", model, "fp32", None, r, probe_calls=1) for r in ("numba", "torch")}
    rows = np.random.default_rng(1).normal(size=(30, 2, FEATURES)).astype(np.float32)
    answers = {}
    for runtime, member in members.items():
        slots = np.array([member.new_slot(), member.new_slot()])
        answers[runtime] = [member.step(rows[t], slots, np.zeros(2, np.int64), None) for t in range(30)]
    for t in range(30):
        for a, b in zip(answers["numba"][t], answers["torch"][t]):
            np.testing.assert_allclose(a.forecast, b.forecast, rtol=1e-4, atol=1e-5)
            if t < MAMBA2["seq_len"] - 1:
                assert a.position == b.position == 0 and a.signal is None and b.signal is None
            else:
                assert a.signal == pytest.approx(float(a.forecast[:, model.median_index].sum()), rel=1e-6)
                assert a.position == signal_position(a.signal, 0.0) == b.position
    member = members["numba"]
    member.reset(0)  # a reset slot is flat again for seq_len - 1 bars and forecasts as a new stream
    again = member.step(rows[0, :1], np.array([0]), np.zeros(1, np.int64), None)[0]
    assert again.signal is None
    np.testing.assert_allclose(again.forecast, answers["numba"][0][0].forecast, rtol=1e-6)


def test_the_forecasters_rule_is_a_strict_threshold():
    assert [signal_position(s, 0.5) for s in (-0.6, -0.5, 0.0, 0.5, 0.51)] == [-1, 0, 0, 0, 1]
    assert signal_position(1e-9, 0.0) == 1 and signal_position(0.0, 0.0) == 0


def test_the_runtime_is_chosen_as_asked_or_falls_back_saying_why():
    agent = Agent(2)
    assert AgentMember("a", "dqn", agent, "fp32", None, "numpy", 1).runtime_note == "numpy (ensemble.runtime)"
    int8 = AgentMember("a", "dqn", agent, "int8", None, "numpy", 1)  # numpy has no int8 weights
    assert (int8.runtime, int8.runtime_note) == ("torch", "torch (no numpy runtime for this member)")
    auto = AgentMember("a", "dqn", agent, "fp32", None, "auto", 3)
    assert auto.runtime in ("numba", "numpy", "torch") and auto.runtime_note.startswith(
        f"{auto.runtime} (auto: median of 3 timed calls"
    )
    with pytest.raises(ValueError, match="ensemble.runtime='gpu': must be one of auto, numba, numpy, onnx, torch"):
        AgentMember("a", "dqn", agent, "fp32", None, "gpu", 1)
