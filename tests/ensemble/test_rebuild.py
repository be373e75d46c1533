"""foxhunt.ensemble.rebuild: a stored config and its weights give back the model in plain fp32
(int8-trained weights through their quantized layers, then dequantized); weights that do not fit,
a config that no longer validates and a member of another asset are each one line."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from ensemble_helpers import SMALL, cli

from foxhunt.ensemble.member_files import RegistryError
from foxhunt.ensemble.rebuild import rebuild_model
from foxhunt.precision.quantize import Int8Linear, dequantize_model, quantize_model
from foxhunt.training.parts import build_model

INT8 = ["precision=int8", "precision.min_quantized_numel=256", "precision.compile_optimizer=false"]


def _weights_equal(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_an_fp32_state_comes_back_as_it_was_in_eval_mode(compose_cfg):
    cfg = compose_cfg(["model=dqn", *SMALL["dqn"]])
    torch.manual_seed(0)
    trained = build_model(cfg)
    rebuilt = rebuild_model(cfg, trained.state_dict(), origin="foxhunt-dqn-es version 1")
    assert rebuilt is not trained and not rebuilt.training and _weights_equal(rebuilt, trained)


def test_an_int8_trained_state_comes_back_dequantized(compose_cfg):
    from hydra.utils import instantiate

    cfg = compose_cfg(["model=dqn", *SMALL["dqn"], *INT8])
    torch.manual_seed(0)
    trained = build_model(cfg)
    quantize_model(trained, instantiate(cfg.precision))
    assert any(isinstance(m, Int8Linear) for m in trained.modules())
    rebuilt = rebuild_model(cfg, trained.state_dict(), origin="foxhunt-dqn-es version 2")
    assert not any(isinstance(m, Int8Linear) for m in rebuilt.modules())
    assert all(p.dtype == torch.float32 for p in rebuilt.parameters())
    assert _weights_equal(rebuilt, dequantize_model(copy.deepcopy(trained)))


def test_weights_that_do_not_fit_the_stored_config_are_one_line(compose_cfg):
    other = build_model(compose_cfg(["model=dqn", "model.module.hidden_sizes=[8]"]))
    cfg = compose_cfg(["model=dqn", *SMALL["dqn"]])
    with pytest.raises(RegistryError) as error:
        rebuild_model(cfg, other.state_dict(), origin="foxhunt-dqn-es version 3")
    message = str(error.value)
    assert message.startswith("foxhunt-dqn-es version 3: the weights do not fit the stored config's model (")
    assert "\n" not in message


# ------------------------------------------------------------------ moved from test_registry.py


def test_a_member_of_another_asset_is_refused(store_root, tmp_path):
    from foxhunt.ensemble.rebuild import build_member
    from foxhunt.ensemble.registry import RegistryError, download_version

    cli(store_root, "ensemble", "register", "asset=es", "ensemble.gate=none")
    folder, _ = download_version(f"sqlite:///{store_root / 'mlruns' / 'mlflow.db'}", "foxhunt-ppo-es", "champion", None, tmp_path)
    with pytest.raises(RegistryError, match="foxhunt-ppo-es: trained on es, the bars are nq"):
        build_member(folder, "foxhunt-ppo-es", "nq", "fp32", "auto", "cpu", 5)
    config = folder / "artifacts" / "config.yaml"
    assert "    clip_coef: 0.2\n" in config.read_text()
    config.write_text(config.read_text().replace("    clip_coef: 0.2\n", "    clip_coef: -0.2\n"))
    with pytest.raises(RegistryError, match="foxhunt-ppo-es: the stored config no longer validates: model.module.clip_coef"):
        build_member(folder, "foxhunt-ppo-es", "es", "fp32", "auto", "cpu", 5)
    assert json.loads((folder / "artifacts" / "member.json").read_text())["family"] == "ppo"
