"""Tests of the Temporal Fusion Transformer: config, shapes, causality, variable selection,
quantile ordering, Lightning fitting, checkpoints and learning a planted pattern."""

from __future__ import annotations

import inspect
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning import Callback, Trainer, seed_everything
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from foxhunt.assets import AssetSpec
from foxhunt.data.datamodules import ForecastDataModule
from foxhunt.data.dataset import MarketDataset, SplitArrays, feature_groups
from foxhunt.data.features import FEATURE_NAMES, FeatureConfig
from foxhunt.models.forecaster import quantile_loss
from foxhunt.models.quantiles import QuantileHead
from foxhunt.models.tft import GatedResidualNetwork, TemporalFusionTransformer

# the feature settings of conf/data/pipeline/default.yaml (the future calendar reads them)
DEFAULT_FEATURES = FeatureConfig(momentum_bars=15, volatility_bars=30, volume_bars=60)

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED_QUANTILES = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]


pytestmark = pytest.mark.usefixtures("single_intra_op_thread")  # tests/models/conftest.py


def load_model_config(**module_overrides):
    """conf/model/tft.yaml under a `model` root (so `${model.window.*}` resolves), with overrides."""
    cfg = OmegaConf.create({"model": OmegaConf.load(REPO_ROOT / "conf" / "model" / "tft.yaml")})
    for key, value in module_overrides.items():
        cfg.model.module[key] = value
    return cfg


def small_tft(**overrides) -> TemporalFusionTransformer:
    args = dict(
        input_dim=16,
        static_dim=4,
        known_dim=8,
        observed_dim=4,
        hidden_size=16,
        num_heads=4,
        lstm_layers=2,
        dropout=0.0,
        seq_len=12,
        horizon=4,
        quantiles=SEED_QUANTILES,
        learning_rate=1e-2,
        weight_decay=0.0,
        position_threshold=0.0,
        activation_checkpointing=False,
    )
    args.update(overrides)
    return TemporalFusionTransformer(**args)


def random_batch(batch: int, seq_len: int, horizon: int, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "static": torch.randn(batch, 4, generator=g),
        "known": torch.randn(batch, seq_len + horizon, 8, generator=g),
        "observed": torch.randn(batch, seq_len, 4, generator=g),
        "target": torch.randn(batch, horizon, generator=g),
    }


# --------------------------------------------------------------------------- config and shapes
def test_yaml_states_every_constructor_argument_and_the_seed_values():
    cfg = load_model_config()
    module = OmegaConf.to_container(cfg.model.module, resolve=True)
    params = set(inspect.signature(TemporalFusionTransformer.__init__).parameters) - {"self"}
    assert set(module) - {"_target_"} == params  # no hidden defaults, no unknown keys
    assert all(
        p.default is inspect.Parameter.empty
        for n, p in inspect.signature(TemporalFusionTransformer.__init__).parameters.items()
        if n != "self"
    )
    assert cfg.model.name == "tft" and cfg.model.kind == "forecaster"
    assert cfg.model.monitor.metric == TemporalFusionTransformer.monitor_metric == "val/loss"
    assert cfg.model.monitor.mode == TemporalFusionTransformer.monitor_mode == "min"
    assert OmegaConf.to_container(cfg.model.window) == {"seq_len": 50, "horizon": 10, "batch_size": 32, "eval_batch_size": 256}
    assert module["seq_len"] == 50 and module["horizon"] == 10
    assert (module["input_dim"], module["static_dim"], module["known_dim"], module["observed_dim"]) == (16, 4, 8, 4)
    assert (module["hidden_size"], module["num_heads"], module["lstm_layers"]) == (256, 4, 3)
    assert module["quantiles"] == SEED_QUANTILES
    assert (module["learning_rate"], module["weight_decay"], module["dropout"]) == (1e-3, 1e-3, 0.1)
    assert module["activation_checkpointing"] is False  # the 500 MB target in fp32 is met without it


def test_seed_config_shapes_and_parameter_count(capsys):
    model = instantiate(load_model_config().model.module).eval()
    batch = random_batch(2, 50, 10)
    with torch.no_grad():
        out, weights = model(batch, return_weights=True)
    assert out.shape == (2, 10, 9)
    assert weights["static"].shape == (2, 4)
    assert weights["encoder"].shape == (2, 50, 12)
    assert weights["decoder"].shape == (2, 10, 8)
    assert weights["attention"].shape == (2, 60, 60)
    n_params = sum(p.numel() for p in model.parameters())
    with capsys.disabled():
        print(f"\nTFT default config (hidden 256, 4 heads, 3 LSTM layers): {n_params:,} parameters")
    assert n_params > 0


def test_grn_parameter_count_hand_computed():
    grn = GatedResidualNetwork(input_size=3, hidden_size=5, output_size=2, dropout=0.0, context_size=4)
    # skip 3*2+2, W2 3*5+5, W3 4*5 (no bias), W1 5*5+5, GLU 5*(2*2)+2*2, LayerNorm 2+2
    assert sum(p.numel() for p in grn.parameters()) == 8 + 20 + 20 + 30 + 24 + 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"input_dim": 15}, "input_dim"),
        ({"hidden_size": 18}, "num_heads"),
        ({"quantiles": [0.1, 0.9]}, "0.5"),
        ({"dropout": 1.0}, "dropout"),
        ({"lstm_layers": 0}, "lstm_layers"),
    ],
)
def test_constructor_rejects_bad_hyperparameters(overrides, message):
    with pytest.raises(ValueError, match=message):
        small_tft(**overrides)


def test_forward_rejects_future_observed_inputs_and_wrong_shapes():
    model = small_tft()
    batch = random_batch(2, 12, 4)
    batch["observed"] = torch.randn(2, 12 + 4, 4)  # observed values after the window do not exist
    with pytest.raises(ValueError, match="observed"):
        model(batch)
    batch = random_batch(2, 12, 4)
    batch["known"] = batch["known"][:, :12]
    with pytest.raises(ValueError, match="known"):
        model(batch)


# ------------------------------------------------------------------------------------ causality
def test_decoder_step_depends_on_no_later_input_gradients():
    seq_len, horizon = 12, 4
    model = small_tft(seq_len=seq_len, horizon=horizon).eval()
    batch = random_batch(3, seq_len, horizon)
    known = batch["known"].requires_grad_(True)
    observed = batch["observed"].requires_grad_(True)
    out = model(batch)
    for step in range(horizon):
        position = seq_len + step
        grad_known, grad_observed = torch.autograd.grad(out[:, step].sum(), (known, observed), retain_graph=True)
        per_time = grad_known.abs().sum(dim=(0, 2))
        assert torch.all(per_time[position + 1 :] == 0), f"decoder step {step} reads later known inputs"
        assert torch.all(per_time[: position + 1] > 0), f"decoder step {step} ignores some past/present input"
        assert grad_observed.abs().sum(dim=(0, 2)).gt(0).all()


def test_decoder_step_unchanged_when_later_inputs_change():
    seq_len, horizon = 12, 4
    model = small_tft(seq_len=seq_len, horizon=horizon).eval()
    batch = random_batch(3, seq_len, horizon)
    with torch.no_grad():
        reference = model(batch)
        for step in range(horizon - 1):
            perturbed = {k: v.clone() for k, v in batch.items()}
            perturbed["known"][:, seq_len + step + 1 :] += 5.0 * torch.randn_like(perturbed["known"][:, seq_len + step + 1 :])
            out = model(perturbed)
            torch.testing.assert_close(out[:, : step + 1], reference[:, : step + 1], rtol=0, atol=1e-6)
            assert not torch.allclose(out[:, step + 1 :], reference[:, step + 1 :])


def test_encoder_attention_cannot_see_the_future():
    seq_len, horizon, k = 12, 4, 7
    model = small_tft(seq_len=seq_len, horizon=horizon).eval()
    batch = random_batch(3, seq_len, horizon)
    perturbed = {key: value.clone() for key, value in batch.items()}
    perturbed["observed"][:, k] += 3.0
    perturbed["known"][:, k] -= 3.0
    with torch.no_grad():
        out, weights = model(batch, return_weights=True)
        out_p, weights_p = model(perturbed, return_weights=True)
    attention, attention_p = weights["attention"], weights_p["attention"]
    length = seq_len + horizon
    above_diagonal = torch.ones(length, length, dtype=torch.bool).triu(1)
    assert torch.all(attention[:, above_diagonal] == 0)
    torch.testing.assert_close(attention.sum(-1), torch.ones(3, length))
    torch.testing.assert_close(attention_p[:, :k], attention[:, :k], rtol=0, atol=1e-6)
    torch.testing.assert_close(weights_p["encoder"][:, :k], weights["encoder"][:, :k], rtol=0, atol=1e-6)
    assert not torch.allclose(attention_p[:, k:], attention[:, k:])
    assert not torch.allclose(out_p, out)  # the perturbation does reach the forecast


# --------------------------------------------------------------------- selection weights, quantiles
def test_variable_selection_weights_sum_to_one():
    model = small_tft().eval()
    with torch.no_grad():
        _, weights = model(random_batch(5, 12, 4, seed=3), return_weights=True)
    for key, n_vars in (("static", 4), ("encoder", 12), ("decoder", 8)):
        w = weights[key]
        assert w.shape[-1] == n_vars
        assert torch.all(w >= 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:-1]))


def test_quantile_outputs_ordered_for_extreme_inputs():
    model = small_tft().eval()
    with torch.no_grad():
        for p in model.quantile_head.parameters():
            p.normal_(0.0, 3.0)
        batch = random_batch(16, 12, 4, seed=7)
        batch = {k: v * 10 for k, v in batch.items()}
        out = model(batch)
    assert torch.all(out.diff(dim=-1) >= 0)
    assert torch.all(out.diff(dim=-1).sum(-1) > 0)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.lists(st.floats(-50, 50, allow_nan=False), min_size=6, max_size=6), min_size=1, max_size=4),
    median_index=st.integers(0, 4),
)
def test_quantile_head_ordered_by_construction(rows, median_index):
    torch.manual_seed(0)
    head = QuantileHead(in_features=6, n_quantiles=5, median_index=median_index)
    x = torch.tensor(rows, dtype=torch.float64)
    out = head.double()(x)
    assert out.shape == (len(rows), 5)
    assert torch.all(out.diff(dim=-1) >= 0)
    torch.testing.assert_close(out[:, median_index], head.linear(x)[:, median_index])


# --------------------------------------------------------------------------------- Lightning fit
class LossRecorder(Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.losses.append(float(outputs["loss"]))


def quiet_trainer(**kwargs) -> Trainer:
    return Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_lightning_fit_on_random_batches_logs_finite_losses():
    torch.manual_seed(0)
    model = small_tft(dropout=0.1)
    train = [random_batch(4, 12, 4, seed=s) for s in range(4)]
    val = [random_batch(4, 12, 4, seed=10 + s) for s in range(2)]
    trainer = quiet_trainer(max_steps=6, num_sanity_val_steps=0, val_check_interval=3)
    trainer.fit(model, DataLoader(train, batch_size=None), DataLoader(val, batch_size=None))
    assert trainer.global_step == 6
    for key in ("train/loss", "val/loss", "val/direction_accuracy"):
        assert torch.isfinite(trainer.callback_metrics[key]), key


def test_fit_under_bf16_mixed_precision(tmp_path):
    # foxhunt's bf16 policy, as foxhunt-train runs it: its callback keeps the LSTMs in fp32 on a
    # CPU without a bf16 LSTM kernel (AVX2 only), so this passes on every CPU
    from foxhunt.precision.callback import PrecisionCallback
    from foxhunt.precision.plugin import precision_plugin
    from foxhunt.precision.policy import PrecisionPolicy

    torch.manual_seed(0)
    model = small_tft()
    recorder = LossRecorder()
    policy = PrecisionPolicy(name="bf16", trainer_precision="bf16-mixed")
    trainer = quiet_trainer(
        max_steps=3, plugins=[precision_plugin(policy, "cpu")], callbacks=[recorder, PrecisionCallback(report_dir=tmp_path)]
    )
    trainer.fit(model, DataLoader([random_batch(4, 12, 4, seed=s) for s in range(3)], batch_size=None))
    assert len(recorder.losses) == 3 and np.isfinite(recorder.losses).all()


# --------------------------------------------------------------------------- activation checkpointing
def _step_with_meter(checkpointing: bool, int8_path: bool = False):
    """One forward + backward of a small TFT (dropout on, fixed RNG) under the activation
    meter: (gradients by name, peak saved bytes)."""
    from foxhunt.memory.accounting import ActivationMeter

    torch.manual_seed(0)
    model = small_tft(hidden_size=32, dropout=0.2, activation_checkpointing=checkpointing)
    if int8_path:  # the unfolded forward (the paper's order), the segment checkpointed there too
        _unfolded(model)
    batch = random_batch(16, 12, 4, seed=3)
    torch.manual_seed(7)  # the dropout masks: recomputation must replay them exactly
    with ActivationMeter(exclude=model) as meter:
        forecast = model(batch)
        quantile_loss(forecast, batch["target"], model.quantiles).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, meter.peak_bytes


@pytest.mark.parametrize("int8_path", [False, True], ids=["folded", "unfolded"])
def test_activation_checkpointing_same_gradients_less_saved_memory(int8_path):
    plain_grads, plain_peak = _step_with_meter(False, int8_path)
    ckpt_grads, ckpt_peak = _step_with_meter(True, int8_path)
    assert plain_grads.keys() == ckpt_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    assert ckpt_peak < 0.75 * plain_peak, (ckpt_peak, plain_peak)


def test_activation_checkpointing_recomputation_is_counted_by_the_meter():
    """The recomputed segment's saved tensors pass through the meter's hooks in backward, so
    the peak is at least what the variable GRNs of the encoder selection save on their own."""
    from foxhunt.memory.accounting import ActivationMeter
    from foxhunt.models.tft import VariableSelectionNetwork

    torch.manual_seed(0)
    vsn = VariableSelectionNetwork(6, 32, dropout=0.0, context_size=None)
    embedded = torch.randn(8, 20, 6, 32, requires_grad=True)
    weights = torch.softmax(torch.randn(8, 20, 6, requires_grad=True), dim=-1)
    with ActivationMeter(exclude=vsn) as alone:
        vsn._select_embedded(embedded, weights).sum().backward()
    vsn.activation_checkpointing = True
    with ActivationMeter(exclude=vsn) as after_forward:
        out = vsn(embedded)[0]
    with ActivationMeter(exclude=vsn) as whole:
        vsn(embedded)[0].sum().backward()
    del out
    assert after_forward.peak_bytes < 0.5 * alone.peak_bytes  # dropped after the forward pass
    assert whole.peak_bytes >= alone.peak_bytes  # ... and counted again when recomputed


def test_overfits_a_fixed_tiny_batch():
    torch.manual_seed(0)
    model = small_tft(learning_rate=1e-2)
    batch = random_batch(8, 12, 4, seed=5)
    recorder = LossRecorder()
    trainer = quiet_trainer(max_steps=80, callbacks=[recorder])
    trainer.fit(model, DataLoader([batch] * 80, batch_size=None))
    losses = np.array(recorder.losses)
    assert len(losses) == 80 and np.isfinite(losses).all()
    assert losses[-5:].mean() < 0.5 * losses[0], f"loss {losses[0]:.4f} -> {losses[-5:].mean():.4f}"


def test_checkpoint_loads_with_weights_only(tmp_path):
    model = instantiate(load_model_config(hidden_size=8, num_heads=2, lstm_layers=1).model.module)
    trainer = quiet_trainer(max_steps=1, default_root_dir=tmp_path)
    trainer.fit(model, DataLoader([random_batch(2, 50, 10)], batch_size=None))
    path = tmp_path / "tft.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=True)
    assert checkpoint["hyper_parameters"]["quantiles"] == SEED_QUANTILES
    restored = TemporalFusionTransformer.load_from_checkpoint(path, weights_only=True).eval()
    batch = random_batch(2, 50, 10, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(restored(batch), model.eval()(batch))


# ------------------------------------------------------------------------------------- learning
AR_COEFFICIENT = 0.5
LEARN_SEQ_LEN, LEARN_HORIZON = 16, 4
LEARN_BARS = {"train": 4000, "val": 600, "test": 1500}


def planted_ar1_dataset(seed: int) -> MarketDataset:
    """A MarketDataset whose 1-bar log returns follow AR(1) with coefficient 0.5; the observed
    `log_return` feature is that return (z-scored), so the next return is half-predictable."""
    asset_cfg = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "asset" / "es.yaml"))
    asset = AssetSpec(**{k: v for k, v in asset_cfg.items() if k != "_target_"})
    rng = np.random.default_rng(seed)
    groups = feature_groups()
    return_column = groups["observed"][list(FEATURE_NAMES[i] for i in groups["observed"]).index("log_return")]
    sigma = 1e-4
    splits, start = {}, np.datetime64("2024-01-02T00:00", "ns")
    for name, n in LEARN_BARS.items():
        noise = rng.normal(0.0, sigma, n)
        returns = np.zeros(n)
        for t in range(1, n):
            returns[t] = AR_COEFFICIENT * returns[t - 1] + noise[t]
        close = 5000.0 * np.exp(np.cumsum(returns))
        minutes = np.arange(n)
        features = np.zeros((n, len(FEATURE_NAMES)), dtype=np.float32)
        features[:, groups["static"]] = [0.5, 1.1, 1.0, 0.96]
        features[:, groups["known"][0]] = np.sin(2 * np.pi * minutes / 1440)
        features[:, groups["known"][1]] = np.cos(2 * np.pi * minutes / 1440)
        features[:, groups["observed"]] = rng.normal(size=(n, len(groups["observed"])))
        features[:, return_column] = returns / (sigma / np.sqrt(1 - AR_COEFFICIENT**2))
        timestamps = start + minutes.astype("timedelta64[m]")
        start = timestamps[-1] + np.timedelta64(60, "m")
        splits[name] = SplitArrays(timestamps=timestamps, features=features, close=close)
    train_returns = np.diff(np.log(splits["train"].close))
    return MarketDataset(
        asset=asset,
        feature_names=list(FEATURE_NAMES),
        groups=groups,
        splits=splits,
        target_scale=float(train_returns.std()),
        feature_config=DEFAULT_FEATURES,
    )


def fit_planted_ar1(seed: int, precision: str = "32-true", callbacks=(), plugins=None):
    """The learning test's fit: a small TFT, two epochs on the planted AR(1) dataset (under
    ``plugins``' precision plugin when given, else Lightning's ``precision``)."""
    seed_everything(seed, verbose=False)
    datamodule = ForecastDataModule(
        planted_ar1_dataset(seed), seq_len=LEARN_SEQ_LEN, horizon=LEARN_HORIZON, batch_size=64, eval_batch_size=64, seed=seed
    )
    model = small_tft(
        hidden_size=32,
        num_heads=4,
        lstm_layers=1,
        dropout=0.0,
        seq_len=LEARN_SEQ_LEN,
        horizon=LEARN_HORIZON,
        learning_rate=3e-3,
        weight_decay=1e-3,
    )
    precision_arg = {"plugins": plugins} if plugins else {"precision": precision}
    trainer = quiet_trainer(max_epochs=2, num_sanity_val_steps=0, limit_val_batches=0, callbacks=list(callbacks),
                            **precision_arg)  # fmt: skip
    trainer.fit(model, datamodule=datamodule)
    return trainer, model, datamodule


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learns_planted_ar1_pattern(seed, capsys):
    started = time.perf_counter()
    trainer, model, datamodule = fit_planted_ar1(seed)
    [metrics] = trainer.test(model, datamodule=datamodule, verbose=False)

    target = datamodule.windows("test")["target"]
    zero_loss = quantile_loss(torch.zeros(*target.shape, 9), target, SEED_QUANTILES).item()
    empirical = torch.quantile(target.flatten(), torch.tensor(SEED_QUANTILES))
    unconditional_loss = quantile_loss(empirical.expand(*target.shape, 9), target, SEED_QUANTILES).item()
    loss, accuracy = metrics["test/loss"], metrics["test/direction_accuracy"]
    elapsed = time.perf_counter() - started
    with capsys.disabled():
        print(
            f"\nseed {seed}: test loss {loss:.4f} vs zero forecast {zero_loss:.4f} "
            f"(margin {zero_loss - loss:.4f}; unconditional quantiles {unconditional_loss:.4f}), "
            f"direction accuracy {accuracy:.3f} (bar 0.55; AR(1) optimum ~0.667), {elapsed:.1f} s"
        )
    assert loss < zero_loss
    assert accuracy > 0.55

    # positions on the real datamodule: one per test bar, flat until seq_len bars of history, the
    # last horizon bars decided too (their inputs need no future bar), and long
    # (short) positions followed on average by positive (negative) next returns
    close = datamodule.dataset.splits["test"].close
    positions = model.trading_positions(datamodule, "test")
    assert positions.shape == close.shape
    assert set(np.unique(positions)) <= {-1, 0, 1}
    assert not positions[: LEARN_SEQ_LEN - 1].any() and positions[len(close) - LEARN_HORIZON :].any()
    next_return = np.diff(np.log(close))
    assert np.mean(positions[:-1] * next_return) > 0


# bf16-mixed must learn what fp32 learns before precision=auto may pick it (conf/model/tft.yaml)
BF16_VAL_LOSS_TOLERANCE = 0.01


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_bf16_mixed_validation_loss_within_one_percent_of_fp32(seed, tmp_path, capsys):
    from foxhunt.precision.callback import PrecisionCallback
    from foxhunt.precision.plugin import precision_plugin
    from foxhunt.precision.policy import PrecisionPolicy

    losses = {}
    for precision, name in (("32-true", "fp32"), ("bf16-mixed", "bf16")):
        plugin = precision_plugin(PrecisionPolicy(name=name, trainer_precision=precision), "cpu")
        trainer, model, datamodule = fit_planted_ar1(seed, precision, [PrecisionCallback(report_dir=tmp_path)], [plugin])
        assert trainer.precision == precision  # bf16 really ran (it falls back to fp32 where it cannot)
        # the whole validation split, under the precision it trained in (its fp32 islands kept)
        [metrics] = quiet_trainer(precision=precision).validate(model, datamodule=datamodule, verbose=False)
        losses[name] = metrics["val/loss"]
    gap = abs(losses["bf16"] - losses["fp32"]) / losses["fp32"]
    with capsys.disabled():
        print(
            f"\nseed {seed}: val/loss fp32 {losses['fp32']:.5f}, bf16-mixed {losses['bf16']:.5f}, "
            f"relative gap {100 * gap:.3f}% (tolerance {100 * BF16_VAL_LOSS_TOLERANCE:.0f}%)"
        )
    assert gap < BF16_VAL_LOSS_TOLERANCE


def test_a_forecast_without_gradients_after_a_fused_adam_step_reads_the_new_weights():
    """Validation during a fit: a no-grad forward, a training step with torch's fused Adam (which
    updates the weights in place without bumping their version counters), another no-grad
    forward: it must be the forecast of the new weights (the folded variable-selection weights
    were cached by version counter and served stale; seen failing before the fix)."""
    torch.manual_seed(0)
    model = small_tft()
    batch = random_batch(8, 12, 4, seed=3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05, fused=True)
    with torch.no_grad():
        model(batch)  # fills the cache, as validation does
    quantile_loss(model(batch), batch["target"], model.quantile_levels).backward()
    optimizer.step()
    with torch.no_grad():
        after = model(batch)
        fresh = small_tft()
        fresh.load_state_dict(model.state_dict())
        expected = fresh(batch)
    torch.testing.assert_close(after, expected, rtol=0, atol=0)


def _int8_policy():
    """conf/precision/int8.yaml, as a run instantiates it."""
    return instantiate(OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "precision" / "int8.yaml"))


def _unfolded(model: TemporalFusionTransformer) -> None:
    """The variable selections run as the paper writes them: embed, then every layer on the embedding."""
    for vsn in (model.encoder_selection, model.decoder_selection, model.static_selection):
        vsn.select = lambda x, embeddings, context=None, vsn=vsn: vsn(
            x.unsqueeze(-1) * torch.cat([e.weight for e in embeddings]) + torch.cat([e.bias for e in embeddings]),
            context,
        )


def test_int8_weights_fold_into_the_variable_selection_as_their_dequantized_matrices():
    """With int8 training weights the folded variable selection is the unfolded one: the same
    forecasts and the same gradients (of the int8 weights, straight through), only the order of
    float sums differs."""
    from foxhunt.precision.quantize import is_int8_weight, quantize_model

    def forecast_and_grads(unfold: bool):
        torch.manual_seed(0)
        model = small_tft(hidden_size=32, dropout=0.0)
        quantize_model(model, _int8_policy())
        assert is_int8_weight(model.encoder_selection.weight_grn.fc_input.weight)
        if unfold:
            _unfolded(model)
        batch = random_batch(8, 12, 4, seed=3)
        forecast = model(batch)
        quantile_loss(forecast, batch["target"], model.quantile_levels).backward()
        return forecast.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    folded, folded_grads = forecast_and_grads(unfold=False)
    unfolded, unfolded_grads = forecast_and_grads(unfold=True)
    torch.testing.assert_close(folded, unfolded, rtol=1e-5, atol=1e-6)
    assert folded_grads.keys() == unfolded_grads.keys()
    for name, grad in unfolded_grads.items():
        torch.testing.assert_close(folded_grads[name].float(), grad.float(), rtol=1e-4, atol=1e-5, msg=name)


def test_a_forecast_without_gradients_reads_int8_weights_replaced_since_the_last_one():
    """The no-grad folds are cached by what holds the values: for an int8 weight its codes and
    row scales (the wrapper's own storage and version never change), so a forecast after the
    int8 weights alone were rewritten in place (as an 8-bit optimizer step does) is that of the
    new weights."""
    import copy

    from foxhunt.precision.quantize import is_int8_weight, quantize_model

    torch.manual_seed(0)
    model = small_tft(hidden_size=64)
    quantize_model(model, _int8_policy())
    other = copy.deepcopy(model)
    int8 = [(p, q) for p, q in zip(model.parameters(), other.parameters()) if is_int8_weight(p)]
    assert int8
    for _, q in int8:
        q.int_data.neg_()  # other: the same model with every int8 matrix negated
    batch = random_batch(8, 12, 4, seed=3)
    with torch.no_grad():
        model(batch)  # fills the cache
        for p, q in int8:
            p.int_data.copy_(q.int_data)
            p.scale.copy_(q.scale)
        torch.testing.assert_close(model(batch), other(batch), rtol=0, atol=0)
