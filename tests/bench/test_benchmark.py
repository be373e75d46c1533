"""The benchmark (foxhunt.bench) end to end at tiny settings: the report's fields and files.

The sections that need no peer library (RL against the bare loop, latency, framework overhead)
always run; the peer comparisons run only where Stable-Baselines3 / pytorch-forecasting are
installed (``pip install '.[bench]'``). Figures are not judged here (this machine's speed is not
the code's); what is checked is that every figure is measured, finite and reported.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from foxhunt.bench import report, rl
from foxhunt.bench.measure import Clock
from foxhunt.bench.run import main, run
from foxhunt.bench.settings import BenchSettingsError, load_settings

# Tiny everything: a short synthetic data set, one repeat at one thread, a few steps, a small
# Mamba-2 for the overhead epoch (its train(cfg) run also tests and backtests).
TINY = [
    "threads=[1]",
    "repeats=1",
    "train_overrides=[data=synthetic,asset=es,precision=fp32,data.source.days=10]",
    "rl.ppo.warmup_steps=1",
    "rl.ppo.steps=2",
    "rl.dqn.warmup_steps=30",
    "rl.dqn.steps=5",
    "latency.warmup=2",
    "latency.iterations=6",
    "latency.blocks=2",
    "latency.max_seconds=1",
    "latency.compiled=[]",
    "overhead.train_batches=2",
    "overhead.val_batches=1",
    "overhead.repeats=1",
    "overhead.warmup_runs=0",
    "overhead.callback_repeats=0",
    "overhead.train_overrides=[data.source.days=10,trainer.limit_test_batches=1,model.module.d_model=32,"
    "model.module.n_layers=1,model.module.d_state=16,model.module.headdim=16]",
]


def tiny_settings(sections: str, *extra: str):
    return load_settings(quick=True, overrides=[*TINY, f"sections=[{sections}]", *extra])


def finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def test_quick_report_without_peers(tmp_path, monkeypatch):
    monkeypatch.setattr(rl, "sb3_available", lambda: False)
    settings = tiny_settings("rl,latency,overhead")
    result = run(settings, tmp_path, command="pytest", quick=True, log=lambda *_: None)

    meta = result["meta"]
    assert meta["machine"]["cpu"] and meta["machine"]["torch"]
    assert len(meta["load_before"]) == 3 and len(meta["load_after"]) == 3
    rows = {(r["section"], r["name"], r["threads"]): r for r in result["rows"]}

    for algo in ("PPO", "DQN"):
        row = rows[("rl", f"{algo} vs bare gradient-step loop", 1)]
        assert row["unit"] == "env-steps/s" and row["goal_op"] == ">=" and row["goal"] == settings.goals.rl_vs_bare
        assert row["foxhunt"] > 0 and row["reference"] > 0
        assert row["figure"] == pytest.approx(row["foxhunt"] / row["reference"])  # one repeat: one pair
        assert finite(row["cpu_figure"]) and row["met"] is (row["figure"] >= row["goal"])
    # PPO's compiled step (auto's choice in a long fit on a CPU) measured apart, its compile time apart; DQN eager
    compiled = rows[("rl", "PPO compiled vs bare gradient-step loop", 1)]
    assert compiled["foxhunt"] > 0 and finite(compiled["cpu_figure"]) and "compile_step=always" in compiled["note"]
    assert finite(rows[("rl", "PPO compile time (first compiled training step - first eager one)", 1)]["figure"])
    assert not any(name.startswith("DQN compile") for _, name, _ in rows)
    assert not any("Stable-Baselines3" in name for _, name, _ in rows)
    assert any("Stable-Baselines3" in note for note in result["notes"]["rl"])

    for target, goal in (("dqn", 50), ("ppo", 50), ("mamba2_step", 100), ("tft", 1000), ("mamba2", None)):
        for variant in ("fp32", "int8"):
            for pct in ("p50", "p99"):
                row = rows[("latency", f"{target} {variant} {pct}", 1)]
                assert row["figure"] > 0 and row["cpu_figure"] > 0 and row["goal"] == goal
        assert rows[("latency", f"{target} fp32 p99", 1)]["figure"] >= rows[("latency", f"{target} fp32 p50", 1)]["figure"]

    epoch = rows[("overhead", "mamba2 epoch: foxhunt-train / plain loop", 1)]
    assert epoch["goal_op"] == "<=" and epoch["goal"] == 1.05
    assert epoch["foxhunt"] > 0 and epoch["reference"] > 0 and finite(epoch["figure"])
    assert epoch["samples"]["foxhunt"][0]["extra"]["run_wall_s"] >= epoch["foxhunt"]

    json_path, md_path = report.write(result, tmp_path / "out")
    loaded = json.loads(json_path.read_text())  # strict JSON: no NaN
    assert len(loaded["rows"]) == len(result["rows"])
    text = md_path.read_text()
    for heading in ("## 1. RL", "## 3. Batch-1", "## 4. Framework overhead"):
        assert heading in text
    assert "| PPO vs bare gradient-step loop | 1 |" in text
    assert "load average" in text and "command: `pytest`" in text


def test_ensemble_section_measures_every_member_beside_its_floor(tmp_path):
    settings = tiny_settings("ensemble", "ensemble.bars=80", "ensemble.skip_bars=60", "ensemble.probe_calls=3",
                             "ensemble.floor_calls=20", "ensemble.floor_calls_tft=2", "ensemble.capacity_warm_bars=5",
                             "ensemble.symbols=[1,4]", "ensemble.rounds=2", "ensemble.int8_variants=false")  # fmt: skip
    result = run(settings, tmp_path, command="pytest", quick=True, log=lambda *_: None)
    rows = {r["name"]: r for r in result["rows"]}
    for family in ("dqn", "ppo"):
        row = rows[f"{family} member p50 / numpy floor"]
        assert row["figure"] == pytest.approx(row["foxhunt"] / row["reference"]) and row["goal"] == 1.5
    assert rows["tft per new bar p50 / full recompute"]["goal"] == 0.25 and rows["tft per new bar p50"]["goal"] == 5000
    assert rows["mamba2 step p50"]["goal"] == 100 and rows["whole ensemble per bar p99"]["goal"] == 6000
    assert rows["whole ensemble per bar p99"]["figure"] >= rows["whole ensemble per bar p50"]["figure"] > 0
    assert any("runtime" in note for note in result["notes"]["ensemble"])
    (capacity,) = [r for name, r in rows.items() if name.startswith("capacity int8 / fp32")]
    assert capacity["figure"] == pytest.approx(capacity["foxhunt"] / capacity["reference"]) and capacity["reference"] >= 1
    assert capacity["foxhunt"] > capacity["reference"]  # int8 weights hold less: more ensembles fit
    for family in ("dqn", "ppo", "mamba2", "tft"):
        int8 = rows[f"{family} int8 / fp32 step p50"]
        assert int8["figure"] == pytest.approx(int8["foxhunt"] / int8["reference"]) and "positions agree on" in int8["note"]
    for group in ("ensemble", "tft"):
        one, four = rows[f"{group} 1 symbols: predictions/s"], rows[f"{group} 4 symbols: predictions/s"]
        assert one["figure"] > 0 and four["figure"] > 0
    assert rows["tft 4 symbols: predictions/s"]["goal"] == 100_000
    assert "## 5. The streaming ensemble" in report.markdown(result)


def test_rl_against_stable_baselines3(tmp_path):
    pytest.importorskip("stable_baselines3")
    settings = tiny_settings("rl")
    result = run(settings, tmp_path, command="pytest", log=lambda *_: None)
    names = {r["name"]: r for r in result["rows"]}
    for algo in ("PPO", "DQN"):
        row = names[f"{algo} vs Stable-Baselines3"]
        assert row["goal"] == settings.goals.rl_vs_sb3 and row["foxhunt"] > 0 and row["reference"] > 0 and finite(row["figure"])
        # what no framework could beat: foxhunt's bare gradient steps plus its env side, against SB3
        ceiling = names[f"{algo} ceiling vs Stable-Baselines3 ((bare + env side) rate / SB3's)"]
        sb3, bare = row["samples"]["sb3"][0], names[f"{algo} vs bare gradient-step loop"]["samples"]["bare"][0]
        assert ceiling["reference"] == pytest.approx(sb3["work"] / sb3["wall_s"])
        assert ceiling["foxhunt"] < bare["work"] / bare["wall_s"]  # the env side costs time too
        assert ceiling["figure"] == pytest.approx(ceiling["foxhunt"] / ceiling["reference"])  # one repeat: one pair


def test_sb3_gets_the_seed_hyperparameters(tmp_path):
    pytest.importorskip("stable_baselines3")
    from foxhunt.bench.context import BenchContext

    ctx = BenchContext(settings=tiny_settings("rl"), root=tmp_path)
    ppo_cfg = ctx.compose("ppo")
    ppo = rl.sb3_model(ppo_cfg, ctx.dataset(ppo_cfg))
    assert (ppo.n_envs, ppo.n_steps, ppo.batch_size, ppo.n_epochs) == (8, 8, 32, 10)
    assert [m.out_features for m in ppo.policy.mlp_extractor.policy_net if hasattr(m, "out_features")] == [256, 256]
    dqn_cfg = ctx.compose("dqn")
    dqn = rl.sb3_model(dqn_cfg, ctx.dataset(dqn_cfg))
    assert (dqn.n_envs, dqn.batch_size, dqn.buffer_size, dqn.learning_starts) == (4, 32, 10000, 100)
    assert dqn.target_update_interval == 100 * 4  # SB3 counts env steps: 100 training steps x 4 envs
    assert (dqn.train_freq.frequency, dqn.gradient_steps) == (1, 1)


@pytest.mark.slow
def test_tft_against_pytorch_forecasting(tmp_path):
    pytest.importorskip("pytorch_forecasting")
    settings = tiny_settings("tft", "tft.warmup_steps=1", "tft.steps=1", "tft.repeats=1")
    result = run(settings, tmp_path, command="pytest", log=lambda *_: None)
    rows = {r["name"]: r for r in result["rows"]}
    speed = rows["samples/s vs pytorch-forecasting, hidden_continuous_size 256 (same architecture)"]
    memory = rows["peak RSS vs pytorch-forecasting, hidden_continuous_size 256 (same architecture)"]
    assert speed["foxhunt"] > 0 and speed["reference"] > 0 and speed["goal"] == 2.0
    assert memory["foxhunt"] > 0 and memory["reference"] > 0 and memory["goal_op"] == "<="


def test_settings_errors_name_the_key(tmp_path):
    with pytest.raises(BenchSettingsError, match="no_such_key"):
        load_settings(overrides=["no_such_key=1"])
    with pytest.raises(BenchSettingsError, match="sections"):
        load_settings(overrides=["sections=[rl,gpu]"])
    with pytest.raises(BenchSettingsError, match="threads"):
        load_settings(overrides=["threads=[0]"])
    quick = load_settings(quick=True)
    assert quick.repeats < load_settings().repeats and "quick" not in quick


def test_a_bad_setting_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    """Before: BenchSettingsError's traceback."""
    with pytest.raises(SystemExit) as stopped:
        main(["--set", "threads=[0]", "--root", str(tmp_path)])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("scripts/benchmark.py: settings error: threads=[0]: need a list of integers >= 1 (")
    assert len(err.splitlines()) == 1 and "Traceback" not in err


def test_the_training_sections_device_is_cpu_or_a_cuda_device_torch_sees(monkeypatch):
    assert load_settings().device == "cpu"
    with pytest.raises(BenchSettingsError, match=r"^device='gpu': must be one of \['cpu', 'cuda'\] \("):
        load_settings(overrides=["device=gpu"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BenchSettingsError, match=r"^device=cuda: torch sees no CUDA device on this machine \("):
        load_settings(overrides=["device=cuda"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert load_settings(overrides=["device=cuda"]).device == "cuda"


def test_the_clock_waits_for_the_device_it_times(monkeypatch):
    """A CUDA clock reads the time after the queued kernels end (a synchronize at start and stop);
    a CPU clock never synchronizes."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: calls.append("sync"))
    for device, expected in (("cpu", []), ("cuda", ["sync", "sync"])):
        calls.clear()
        clock = Clock(device)
        clock.start()
        clock.stop()
        assert calls == expected and clock.wall_s >= 0


def test_cli_writes_both_reports(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(rl, "sb3_available", lambda: False)
    args = ["--quick", "--root", str(tmp_path), "--sections", "latency"]
    for item in TINY:
        args += ["--set", item]
    args += ["--set", "latency.max_seconds=0.2"]
    assert main(args) == 0
    out = tmp_path / "outputs" / "bench"
    assert (out / "benchmark.md").is_file() and (out / "benchmark.json").is_file()
    assert "dqn fp32 p50" in capsys.readouterr().out
