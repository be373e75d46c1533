"""precision=auto: bf16 where the device computes bf16 natively, fp32 elsewhere, chosen from the
device's probe (forced both ways here), the TFT's default, recorded under the precision it chose."""

from __future__ import annotations

import logging

import pytest
import torch

from foxhunt.precision import auto, bf16
from foxhunt.precision.bf16 import Bf16Support

NATIVE = Bf16Support(device="cpu", hardware="CPU AVX512, avx512_bf16 amx_bf16 (forced)", native=True)
EMULATED = Bf16Support(device="cpu", hardware="CPU AVX2, no bf16 arithmetic flag (forced)", native=False,
                       failed={"LSTM": "could not create a primitive descriptor"})  # fmt: skip
UNUSABLE = Bf16Support(device="cpu", hardware="forced", native=True, failed={"Linear": "no bf16 here"})


@pytest.fixture(autouse=True)
def fresh_probe():
    """Each test probes (or is told) the device anew; the real answer is restored after."""
    auto.auto_choice.cache_clear()
    bf16._support.cache_clear()
    yield
    auto.auto_choice.cache_clear()
    bf16._support.cache_clear()


def _force(monkeypatch, support: Bf16Support) -> None:
    monkeypatch.setattr(bf16, "bf16_support", lambda device: support)


def test_the_choice_follows_what_the_device_supports():
    assert (auto.choose(NATIVE).name, auto.choose(NATIVE).trainer_precision) == ("bf16", "bf16-mixed")
    assert (auto.choose(EMULATED).name, auto.choose(EMULATED).trainer_precision) == ("fp32", "32-true")
    assert auto.choose(UNUSABLE).name == "fp32"  # native flags, but autocast fails: fp32
    line = auto.choose(EMULATED).choice
    assert line.startswith("precision=auto on cpu (CPU AVX2, no bf16 arithmetic flag (forced)): fp32 (32-true)")
    assert "no native bf16 arithmetic" in line
    assert "native bf16 arithmetic" in auto.choose(NATIVE).choice and "CPU AVX512" in auto.choose(NATIVE).choice


def test_an_avx2_only_cpu_picks_fp32(monkeypatch):
    monkeypatch.setattr(bf16, "_cpu_flags", lambda: {"sse4_2", "avx", "avx2", "fma", "f16c"})
    made = auto.auto_choice("cpu")  # the real probe, on CPU flags without avx512_bf16 / amx_bf16
    assert made.name == "fp32" and made.trainer_precision == "32-true"
    assert "no bf16 arithmetic flag" in made.choice


def test_a_cpu_with_bf16_flags_and_onednn_bf16_picks_bf16(monkeypatch):
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this torch's oneDNN has no bf16 on this CPU")
    monkeypatch.setattr(bf16, "_cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    made = auto.auto_choice("cpu")
    assert made.name == "bf16" and made.trainer_precision == "bf16-mixed"
    assert "avx512_bf16 amx_bf16" in made.choice


@pytest.mark.parametrize(("capability", "expected"), [((7, 5), "fp32"), ((8, 0), "bf16"), ((9, 0), "bf16")])
def test_a_cuda_device_picks_bf16_from_compute_capability_8(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "forced GPU")
    hardware, native = bf16._hardware(torch.device("cuda", 0))
    made = auto.choose(Bf16Support(device="cuda:0", hardware=hardware, native=native))
    assert made.name == expected
    assert f"sm_{capability[0]}{capability[1]}" in made.choice


def test_the_choice_is_logged_once_per_process(monkeypatch, caplog):
    _force(monkeypatch, NATIVE)
    with caplog.at_level(logging.INFO, logger="foxhunt.precision.auto"):
        for _ in range(3):
            auto.auto_choice("cpu")
    assert [r.getMessage() for r in caplog.records] == [auto.choose(NATIVE).choice]


def test_an_unknown_field_fails_naming_the_key():
    with pytest.raises(ValueError, match=r"precision: .*foxhunt.auto_precision:speed.*one of name, trainer_precision, choice"):
        auto._resolve("speed", "cpu")


@pytest.mark.parametrize(("support", "expected"), [(NATIVE, "bf16"), (EMULATED, "fp32")], ids=["native", "emulated"])
def test_the_tft_defaults_to_auto_and_its_run_says_what_auto_chose(compose_cfg, monkeypatch, support, expected):
    from hydra.utils import instantiate

    from foxhunt.config.schema import validate
    from foxhunt.runs.cell import CellKey
    from foxhunt.runs.config_hash import config_hash
    from foxhunt.runs.tags import Tag
    from foxhunt.training.cell import run_tags

    _force(monkeypatch, support)
    cfg = compose_cfg(["model=tft"])
    validate(cfg)
    key = CellKey.from_config(cfg, config_hash(cfg))
    assert key.name == f"tft-es-{expected}"
    tags = run_tags(cfg, key)
    assert tags[Tag.PRECISION] == expected and tags[Tag.PRECISION_CHOICE] == auto.choose(support).choice
    policy = instantiate(cfg.precision)
    assert policy.name == expected and policy.trainer_precision == auto.choose(support).trainer_precision
    # the same training as the precision chosen by name: resume=true finds either
    assert key.config_hash == config_hash(compose_cfg(["model=tft", f"precision={expected}"]))


def test_a_precision_on_the_command_line_wins_over_the_tfts_default(compose_cfg, monkeypatch):
    from foxhunt.runs.cell import CellKey
    from foxhunt.runs.tags import Tag
    from foxhunt.training.cell import run_tags

    _force(monkeypatch, NATIVE)
    cfg = compose_cfg(["model=tft", "precision=fp32"])
    assert (cfg.precision.name, cfg.precision.trainer_precision, cfg.precision.get("choice")) == ("fp32", "32-true", None)
    assert Tag.PRECISION_CHOICE not in run_tags(cfg, CellKey.from_config(cfg, "h"))
    assert compose_cfg(["model=tft", "precision=int8"]).precision.name == "int8"


@pytest.mark.parametrize("model", ["dqn", "ppo", "mamba2"])
def test_the_other_models_keep_fp32_and_can_ask_for_auto(compose_cfg, monkeypatch, model):
    _force(monkeypatch, NATIVE)
    assert compose_cfg([f"model={model}"]).precision.name == "fp32"
    assert compose_cfg([f"model={model}", "precision=auto"]).precision.name == "bf16"
