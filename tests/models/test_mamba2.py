"""Tests of the Mamba-2 forecaster: the chunked SSD scan against the sequential recurrence, the
streaming `step` path against the full forward, initialisation, shapes at the config sizes,
Lightning training and learning a planted AR(1) pattern."""

from __future__ import annotations

import math
import time
from pathlib import Path

import hydra
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from lightning import Trainer, seed_everything
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from foxhunt.assets import AssetSpec
from foxhunt.config.model_schemas import HyperparameterError
from foxhunt.data.datamodules import ForecastDataModule
from foxhunt.data.dataset import MarketDataset, SplitArrays, feature_groups
from foxhunt.data.features import FEATURE_NAMES, FeatureConfig
from foxhunt.models.forecaster import quantile_loss
from foxhunt.models.mamba2 import (
    NO_WEIGHT_DECAY_ATTR,
    Mamba2Forecaster,
    Mamba2Mixer,
    segsum,
    ssd_chunked,
    ssd_naive,
)
from foxhunt.models.quantiles import ordered_quantiles

# the feature settings of conf/data/pipeline/default.yaml (the future calendar reads them)
DEFAULT_FEATURES = FeatureConfig(momentum_bars=15, volatility_bars=30, volume_bars=60)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIG = REPO_ROOT / "conf" / "model" / "mamba2.yaml"

# Small sizes for the fast tests (the config sizes are exercised in the shape tests).
SMALL_MIXER = dict(
    d_model=8,
    d_state=5,
    d_conv=4,
    expand=2,
    headdim=4,
    ngroups=2,
    chunk_size=8,
    dt_min=1e-3,
    dt_max=0.1,
    dt_init_floor=1e-4,
    A_init_range=[1.0, 16.0],
    norm_eps=1e-5,
)
SMALL_MODEL = dict(
    input_dim=16,
    seq_len=20,
    horizon=3,
    d_model=16,
    n_layers=2,
    d_state=8,
    d_conv=4,
    expand=2,
    headdim=8,
    ngroups=2,
    chunk_size=8,
    dt_min=1e-3,
    dt_max=0.1,
    dt_init_floor=1e-4,
    A_init_range=[1.0, 16.0],
    norm_eps=1e-5,
    dropout=0.0,
    quantiles=[0.1, 0.5, 0.9],
    learning_rate=3e-3,
    weight_decay=0.0,
    position_threshold=0.0,
)


def random_ssd_inputs(batch, length, nheads, headdim, ngroups, d_state, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, length, nheads, headdim, generator=g, dtype=dtype)
    dt = torch.rand(batch, length, nheads, generator=g, dtype=dtype) * 0.5 + 1e-3
    A = -torch.rand(nheads, generator=g, dtype=dtype) * 3 - 0.05
    B = torch.randn(batch, length, ngroups, d_state, generator=g, dtype=dtype)
    C = torch.randn(batch, length, ngroups, d_state, generator=g, dtype=dtype)
    return x, dt, A, B, C


def config_model_node():
    """conf/model/mamba2.yaml with its interpolations resolved (as under the root config)."""
    cfg = OmegaConf.create({"model": OmegaConf.load(CONFIG)})
    return cfg.model


def model_batch(batch_size, seq_len, horizon, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {
        "static": torch.randn(batch_size, 4, generator=g, dtype=dtype),
        "known": torch.randn(batch_size, seq_len + horizon, 8, generator=g, dtype=dtype),
        "observed": torch.randn(batch_size, seq_len, 4, generator=g, dtype=dtype),
        "target": torch.randn(batch_size, horizon, generator=g, dtype=dtype),
    }


# ------------------------------------------------------------------------------ SSD scan
def test_segsum_hand_computed():
    out = segsum(torch.tensor([1.0, 2.0, 3.0]))
    inf = math.inf
    expected = torch.tensor([[0.0, -inf, -inf], [2.0, 0.0, -inf], [5.0, 3.0, 0.0]])
    assert torch.equal(out, expected)


def test_ssd_scalar_recurrence_hand_computed():
    # One head, one channel, one state, B = C = 1, dt = 1, A = -ln 2: h_t = h_{t-1} / 2 + x_t.
    x = torch.tensor([1.0, 0.0, 0.0, 4.0, 2.0], dtype=torch.float64).view(1, 5, 1, 1)
    dt = torch.ones(1, 5, 1, dtype=torch.float64)
    A = torch.tensor([-math.log(2.0)], dtype=torch.float64)
    ones = torch.ones(1, 5, 1, 1, dtype=torch.float64)
    expected = torch.tensor([1.0, 0.5, 0.25, 4.125, 4.0625], dtype=torch.float64)
    for y, state in (ssd_naive(x, dt, A, ones, ones), ssd_chunked(x, dt, A, ones, ones, chunk_size=2)):
        torch.testing.assert_close(y.flatten(), expected, rtol=0, atol=1e-12)
        assert state.item() == pytest.approx(4.0625, abs=1e-12)


@pytest.mark.parametrize("length", [1, 7, 50, 64, 100])
@pytest.mark.parametrize("chunk_size", [16, 32, 64])
@pytest.mark.parametrize(("nheads", "ngroups"), [(1, 1), (4, 1), (4, 2), (6, 3)])
def test_ssd_chunked_equals_naive_float64(length, chunk_size, nheads, ngroups):
    x, dt, A, B, C = random_ssd_inputs(2, length, nheads, 3, ngroups, 5, seed=length * 100 + chunk_size)
    y_ref, state_ref = ssd_naive(x, dt, A, B, C)
    y, state = ssd_chunked(x, dt, A, B, C, chunk_size)
    assert y.shape == (2, length, nheads, 3) and state.shape == (2, nheads, 3, 5)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=1e-6)


def test_ssd_chunked_equals_naive_with_initial_state():
    x, dt, A, B, C = random_ssd_inputs(2, 37, 4, 3, 2, 5, seed=7)
    h0 = torch.randn(2, 4, 3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(8))
    y_ref, state_ref = ssd_naive(x, dt, A, B, C, initial_state=h0)
    y, state = ssd_chunked(x, dt, A, B, C, 16, initial_state=h0)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=1e-6)
    # The initial state matters: zero input after it still reads it out.
    assert not torch.allclose(y, ssd_chunked(x, dt, A, B, C, 16)[0])


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 3),
    length=st.integers(1, 80),
    chunk_size=st.integers(1, 40),
    ngroups=st.integers(1, 3),
    heads_per_group=st.integers(1, 3),
    headdim=st.integers(1, 4),
    d_state=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_ssd_chunked_equals_naive_property(batch, length, chunk_size, ngroups, heads_per_group, headdim, d_state, seed):
    inputs = random_ssd_inputs(batch, length, ngroups * heads_per_group, headdim, ngroups, d_state, seed)
    y_ref, state_ref = ssd_naive(*inputs)
    y, state = ssd_chunked(*inputs, chunk_size)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(state, state_ref, rtol=0, atol=1e-6)


def test_ssd_rejects_bad_shapes():
    x, dt, A, B, C = random_ssd_inputs(1, 5, 4, 2, 2, 3, seed=0)
    with pytest.raises(ValueError, match="dt must be"):
        ssd_chunked(x, dt[:, :4], A, B, C, 4)
    with pytest.raises(ValueError, match="not a multiple of ngroups"):
        ssd_chunked(x[:, :, :3], dt[:, :, :3], A[:3], B, C, 4)
    with pytest.raises(ValueError, match="chunk_size"):
        ssd_chunked(x, dt, A, B, C, 0)


# ------------------------------------------------------------------------------ mixer
@pytest.mark.parametrize("length", [1, 3, 4, 23])
def test_mixer_step_reproduces_forward_float64(length):
    torch.manual_seed(0)
    mixer = Mamba2Mixer(**SMALL_MIXER).double()
    u = torch.randn(3, length, SMALL_MIXER["d_model"], dtype=torch.float64)
    full, full_state = mixer(u, return_state=True)
    state = mixer.allocate_inference_state(3)
    outputs = []
    for t in range(length):
        y_t, state = mixer.step(u[:, t], state)
        outputs.append(y_t)
    torch.testing.assert_close(torch.stack(outputs, dim=1), full, rtol=0, atol=1e-10)
    torch.testing.assert_close(state.conv, full_state.conv, rtol=0, atol=1e-12)
    torch.testing.assert_close(state.ssm, full_state.ssm, rtol=0, atol=1e-10)


def test_mixer_prefill_then_stream_equals_full_forward():
    torch.manual_seed(1)
    mixer = Mamba2Mixer(**SMALL_MIXER).double()
    u = torch.randn(2, 30, SMALL_MIXER["d_model"], dtype=torch.float64)
    full = mixer(u)
    _, state = mixer(u[:, :17], return_state=True)
    tail = []
    for t in range(17, 30):
        y_t, state = mixer.step(u[:, t], state)
        tail.append(y_t)
    torch.testing.assert_close(torch.stack(tail, dim=1), full[:, 17:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("split_at", [1, 2, 17, 29])
def test_forward_continues_from_a_state_as_if_never_cut(split_at):
    torch.manual_seed(3)
    model = Mamba2Forecaster(**SMALL_MODEL).double().eval()
    features = torch.randn(2, 30, SMALL_MODEL["input_dim"], dtype=torch.float64)
    with torch.no_grad():
        whole, whole_state = model.forecast_stream(features)
        head, state = model.forecast_stream(features[:, :split_at])
        tail, tail_state = model.forecast_stream(features[:, split_at:], state)
    torch.testing.assert_close(torch.cat([head, tail], dim=1), whole, rtol=0, atol=1e-10)
    for a, b in zip(tail_state, whole_state):
        torch.testing.assert_close(a.ssm, b.ssm, rtol=0, atol=1e-10)
        torch.testing.assert_close(a.conv, b.conv, rtol=0, atol=1e-12)


def test_mixer_is_causal():
    torch.manual_seed(2)
    mixer = Mamba2Mixer(**SMALL_MIXER).double()
    u = torch.randn(1, 20, SMALL_MIXER["d_model"], dtype=torch.float64)
    changed = u.clone()
    changed[:, 12:] += 5.0
    a, b = mixer(u), mixer(changed)
    torch.testing.assert_close(a[:, :12], b[:, :12], rtol=0, atol=1e-12)
    assert (a[:, 12:] - b[:, 12:]).abs().max() > 1e-3


# ------------------------------------------------------------------------------ init
def test_initialisation_in_documented_ranges():
    kwargs = dict(SMALL_MIXER, d_model=64, headdim=4, ngroups=1)  # 32 heads
    torch.manual_seed(3)
    mixer = Mamba2Mixer(**kwargs)
    A = -torch.exp(mixer.A_log.detach())
    dt = torch.nn.functional.softplus(mixer.dt_bias.detach())
    assert mixer.A_log.shape == dt.shape == mixer.D.shape == (mixer.nheads,) == (32,)
    for param in mixer.parameters():
        assert torch.isfinite(param).all()
    assert ((-A >= 1.0 - 1e-6) & (-A <= 16.0 + 1e-5)).all()
    assert ((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 0.1 * (1 + 1e-5))).all()
    assert (dt.log().max() - dt.log().min()) > 0.5 * math.log(100.0)  # spread over the log range
    assert torch.equal(mixer.D.detach(), torch.ones(32))
    torch.manual_seed(3)
    again = Mamba2Mixer(**kwargs)
    for p, q in zip(mixer.parameters(), again.parameters()):
        assert torch.equal(p, q)


def test_dt_init_floor_applies():
    torch.manual_seed(4)
    mixer = Mamba2Mixer(**dict(SMALL_MIXER, dt_min=1e-6, dt_max=1e-2, dt_init_floor=1e-3))
    dt = torch.nn.functional.softplus(mixer.dt_bias.detach())
    assert (dt >= 1e-3 * (1 - 1e-5)).all()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (dict(headdim=5), r"^model\.module\.headdim=5: must divide d_model x expand \(32\)$"),
        (dict(ngroups=3), r"^model\.module\.ngroups=3: must divide the number of SSM heads \(4\)$"),
        (dict(dt_min=0.2), r"^model\.module\.dt_max=0\.1: must be >= model\.module\.dt_min \(0\.2\)$"),
        (dict(A_init_range=[0.0, 16.0]), r"^model\.module\.A_init_range=\[0\.0, 16\.0\]: must be a list of 2 numbers > 0"),
    ],
)
def test_the_model_refuses_bad_ssm_hyperparameters_in_one_line(override, message):
    with pytest.raises(HyperparameterError, match=message):
        Mamba2Forecaster(**dict(SMALL_MODEL, **override))


def test_config_model_has_no_nan_after_construction():
    torch.manual_seed(0)
    model = hydra.utils.instantiate(config_model_node().module)
    for name, param in model.named_parameters():
        assert torch.isfinite(param).all(), name


# ------------------------------------------------------------------------------ quantile head
def test_ordered_quantiles_hand_computed():
    raw = torch.tensor([0.0, 1.0, 0.0])  # softplus(0) = ln 2
    out = ordered_quantiles(raw, median_index=1)
    ln2 = math.log(2.0)
    torch.testing.assert_close(out, torch.tensor([1.0 - ln2, 1.0, 1.0 + ln2]))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-30, 30, allow_nan=False), min_size=1, max_size=9), st.data())
def test_ordered_quantiles_increase_and_keep_median(values, data):
    median_index = data.draw(st.integers(0, len(values) - 1))
    raw = torch.tensor(values, dtype=torch.float64)
    out = ordered_quantiles(raw, median_index)
    assert out[median_index] == raw[median_index]
    assert (out[1:] > out[:-1]).all()


# ------------------------------------------------------------------------------ model
def test_config_sizes_shapes_and_ordered_quantiles():
    node = config_model_node()
    torch.manual_seed(0)
    model = hydra.utils.instantiate(node.module).eval()
    window = node.window
    batch = model_batch(window.batch_size, window.seq_len, window.horizon)
    with torch.no_grad():
        out = model(batch)
    assert out.shape == (window.batch_size, window.horizon, len(node.module.quantiles)) == (32, 10, 9)
    assert torch.isfinite(out).all()
    assert (out[..., 1:] > out[..., :-1]).all()
    mixer = model.backbone.layers[0].mixer
    assert (mixer.d_inner, mixer.nheads, mixer.conv_dim) == (256, 4, 256 + 2 * 64)


def test_model_step_reproduces_forward_and_state_is_constant():
    torch.manual_seed(5)
    model = Mamba2Forecaster(**SMALL_MODEL).double().eval()
    batch = model_batch(4, SMALL_MODEL["seq_len"], SMALL_MODEL["horizon"], seed=5, dtype=torch.float64)
    features = model.bar_features(batch)
    state = model.init_state(4)
    sizes = [tuple(t.shape) for layer in state for t in layer]
    forecasts = []
    with torch.no_grad():
        for t in range(features.shape[1]):
            forecast, state = model.step(features[:, t], state)
            forecasts.append(forecast)
            assert [tuple(t.shape) for layer in state for t in layer] == sizes
        full_sequence = model.forecast_sequence(features)
        last = model(batch)
    torch.testing.assert_close(torch.stack(forecasts, dim=1), full_sequence, rtol=0, atol=1e-10)
    torch.testing.assert_close(forecasts[-1], last, rtol=0, atol=1e-10)
    assert sizes == [(4, 16 * 2 + 2 * 2 * 8, 4), (4, 4, 8, 8)] * 2


def test_model_step_float32_at_config_sizes():
    node = config_model_node()
    torch.manual_seed(6)
    model = hydra.utils.instantiate(node.module).eval()
    batch = model_batch(2, node.window.seq_len, node.window.horizon, seed=6)
    features = model.bar_features(batch)
    state = model.allocate_inference_state(2)
    state_bytes = sum(t.numel() * t.element_size() for layer in state for t in layer)
    with torch.no_grad():
        for t in range(features.shape[1]):
            forecast, state = model.step(features[:, t], state)
        full = model(batch)
    torch.testing.assert_close(forecast, full, rtol=0, atol=1e-5)
    assert sum(t.numel() * t.element_size() for layer in state for t in layer) == state_bytes
    # per layer: conv (2, 384, 4) + ssm (2, 4, 64, 64) float32
    assert state_bytes == node.module.n_layers * 4 * (2 * 384 * 4 + 2 * 4 * 64 * 64)


def test_model_rejects_wrong_window():
    model = Mamba2Forecaster(**SMALL_MODEL)
    with pytest.raises(ValueError, match="seq_len"):
        model(model_batch(2, SMALL_MODEL["seq_len"] - 1, SMALL_MODEL["horizon"]))
    with pytest.raises(ValueError, match="input_dim"):
        Mamba2Forecaster(**dict(SMALL_MODEL, input_dim=15))(model_batch(2, SMALL_MODEL["seq_len"], 3))


def test_optimizer_does_not_decay_ssm_parameters():
    model = Mamba2Forecaster(**dict(SMALL_MODEL, weight_decay=0.1))
    optimizer = model.configure_optimizers()
    decayed, plain = optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    plain_ids = {id(p) for p in plain["params"]}
    mixer = model.backbone.layers[0].mixer
    for param in (mixer.A_log, mixer.dt_bias, mixer.D, mixer.in_proj.bias):
        assert id(param) in plain_ids
    assert id(mixer.in_proj.weight) not in plain_ids
    assert getattr(mixer.A_log, NO_WEIGHT_DECAY_ATTR)
    assert len(decayed["params"]) + len(plain["params"]) == len(list(model.parameters()))


# ------------------------------------------------------------------------------ training
def random_loader(n_batches, batch_size, seq_len, horizon, seed):
    batches = [model_batch(batch_size, seq_len, horizon, seed=seed + i) for i in range(n_batches)]
    return DataLoader(batches, batch_size=None)


def test_lightning_fit_on_random_batches_has_finite_loss():
    seed_everything(0, verbose=False)
    model = Mamba2Forecaster(**SMALL_MODEL)
    trainer = Trainer(
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
    )
    loader = random_loader(4, 8, SMALL_MODEL["seq_len"], SMALL_MODEL["horizon"], seed=0)
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=random_loader(2, 8, 20, 3, seed=10))
    assert trainer.global_step == 4
    for key in ("train/loss_epoch", "val/loss"):
        assert math.isfinite(float(trainer.callback_metrics[key])), key


def test_overfits_a_fixed_batch():
    torch.manual_seed(7)
    model = Mamba2Forecaster(**dict(SMALL_MODEL, learning_rate=1e-2))
    batch = model_batch(16, SMALL_MODEL["seq_len"], SMALL_MODEL["horizon"], seed=7)
    optimizer = model.configure_optimizers()
    losses = []
    for _ in range(25):
        optimizer.zero_grad()
        loss = quantile_loss(model(batch), batch["target"], model.quantile_levels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.25 * losses[0], (losses[0], losses[-1])


# ------------------------------------------------------------------------------ learning
AR_COEFFICIENT = 0.5
LEARN_SEQ_LEN = 16
LEARN_HORIZON = 4
LEARN_BARS = {"train": 4000, "val": 200, "test": 2000}


def ar1_dataset(seed: int) -> MarketDataset:
    """A hand-built market dataset whose 1-bar log returns follow AR(1) with coefficient 0.5;
    the observed `log_return` column holds the (normalised) return, the rest is noise or
    constant, and close integrates the returns, so targets are the future scaled returns."""
    rng = np.random.default_rng(seed)
    asset_cfg = OmegaConf.to_container(OmegaConf.load(REPO_ROOT / "conf" / "asset" / "es.yaml"))
    asset = AssetSpec(**{k: v for k, v in asset_cfg.items() if k != "_target_"})
    groups = feature_groups()
    return_col = FEATURE_NAMES.index("log_return")
    sigma = 1e-4
    splits = {}
    for name, bars in LEARN_BARS.items():
        shocks = rng.standard_normal(bars)
        returns = np.empty(bars)
        returns[0] = shocks[0]
        for t in range(1, bars):
            returns[t] = AR_COEFFICIENT * returns[t - 1] + shocks[t]
        returns /= math.sqrt(1.0 / (1.0 - AR_COEFFICIENT**2))  # unit variance
        features = np.zeros((bars, len(FEATURE_NAMES)), dtype=np.float32)
        features[:, groups["static"]] = [0.5, 1.1, 1.0, 0.96]
        features[:, groups["known"]] = rng.uniform(-1, 1, (bars, len(groups["known"])))
        features[:, groups["observed"]] = rng.standard_normal((bars, len(groups["observed"])))
        features[:, return_col] = returns
        close = 4800.0 * np.exp(np.cumsum(sigma * returns))
        timestamps = np.datetime64("2024-01-02T00:00", "ns") + np.arange(bars) * np.timedelta64(60, "s")
        splits[name] = SplitArrays(timestamps=timestamps, features=features, close=close)
    return MarketDataset(
        asset=asset,
        feature_names=list(FEATURE_NAMES),
        groups=groups,
        splits=splits,
        target_scale=sigma,
        feature_config=DEFAULT_FEATURES,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_learns_planted_ar1_pattern(seed):
    started = time.perf_counter()
    seed_everything(seed, verbose=False)
    datamodule = ForecastDataModule(ar1_dataset(seed), seq_len=LEARN_SEQ_LEN, horizon=LEARN_HORIZON, batch_size=64, eval_batch_size=64,
                                    seed=seed)  # fmt: skip
    model = Mamba2Forecaster(
        **dict(SMALL_MODEL, seq_len=LEARN_SEQ_LEN, horizon=LEARN_HORIZON, quantiles=[0.1, 0.25, 0.5, 0.75, 0.9])
    )
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=datamodule)
    metrics = trainer.test(model, datamodule=datamodule, verbose=False)[0]
    windows = datamodule.windows("test")
    zero_loss = quantile_loss(
        torch.zeros(len(windows["target"]), LEARN_HORIZON, model.n_quantiles), windows["target"], model.quantile_levels
    ).item()
    positions = model.trading_positions(datamodule, "test")
    elapsed = time.perf_counter() - started
    print(
        f"seed {seed}: test/loss {metrics['test/loss']:.4f} vs zero forecast {zero_loss:.4f}, "
        f"direction accuracy {metrics['test/direction_accuracy']:.3f}, {elapsed:.1f} s"
    )
    assert metrics["test/loss"] < zero_loss
    assert metrics["test/direction_accuracy"] > 0.55
    assert positions.shape == (LEARN_BARS["test"],) and set(np.unique(positions)) <= {-1, 0, 1}
    assert (positions != 0).any()
